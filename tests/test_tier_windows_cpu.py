"""Whole tiered windows on the CPU: the real engine/gpu/tiers.py (attach_tiers, ExpertTiers: its buffers, pre/post
with their ring numbers, wait codes and plan slices, close) and the real tiers/host.py TierHost (plan, the pinned
staging ring's gather, the copy thread, the CPU pool into ymiss, the flags), with only the kernels and the CUDA
driver replaced by numpy stand-ins that do what kernels/tiers.cu and the expert GEMVs do with the same buffers.

A thread plays the window's stream: it calls ExpertTiers.pre / post in the order engine/gpu/window.py records them
(taken from the real recorder, tests/test_window_steps.py), with the reference engine's MoE input rows planted in
`mixed` before each pre; its waits block on the mapped words as the spin kernels do. After each post the group's
block_out rows (routed experts from VRAM slots, PCIe staging slots and ymiss, weighted, plus the shared expert)
must equal the numpy reference engine's MoE output of the same rows."""

from __future__ import annotations

import ctypes
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from strata_cli.gpu.launch_util import WindowPath
from strata_cli.ops.gemv import dequant_rows

STREAM = SimpleNamespace(ptr=101, synchronize=lambda: None)
COPY_STREAM = SimpleNamespace(ptr=202, synchronize=lambda: None)  # every new_stream(): PCIe copies, slot fills
NOT_READY = 600


class DevArray(np.ndarray):
    """A numpy array standing in for a CuPy device array: .set() and .data.ptr as CuPy has them."""

    def set(self, values):
        self[...] = values

    @property
    def data(self):
        return SimpleNamespace(ptr=self.ctypes.data)


def dev_zeros(shape, dtype=np.float32) -> DevArray:
    return np.zeros(shape, dtype).view(DevArray)


class FakeMapped:
    """runtime.MappedBuffer on plain host memory (the simulated device reads the same bytes)."""

    live: list = []

    def __init__(self, shape, dtype):
        self.host = dev_zeros(shape, dtype)
        self.device = self.host
        self.nbytes = self.host.nbytes
        self.host_ptr = self.host.ctypes.data
        self.freed = False
        FakeMapped.live.append(self)

    def free(self):
        self.freed = True


class FakeRt:
    """The cudart calls of TierHost: DMAs are memmoves (so a copy has landed when the call returns), events are
    tokens, the window's stream is busy until the simulated stream thread ends."""

    cudaMemcpyKind = SimpleNamespace(cudaMemcpyHostToDevice=1)
    cudaError_t = SimpleNamespace(cudaErrorNotReady=NOT_READY)

    def __init__(self):
        self.window_done = threading.Event()
        self.window_done.set()
        self.dmas = []  # the copy stream's (PCIe share, adaptive slot fills)
        self.other_copies = []  # the window's stream (an adaptive cache's slot-table uploads)
        self.events_alive = 0
        self.events_made = 0
        self.registered = {}
        # the native loop's driver calls (tiers/serve_loop.driver_calls): the same DMAs and word writes, by address
        self.driver = {
            "copy": ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t,
                                     ctypes.c_void_p)(self._cu_copy),
            "write_value": ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32,
                                            ctypes.c_uint)(self._cu_write),
            "record": ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(lambda event, stream: 0)}

    def _cu_copy(self, dst, src, n, stream):
        return self.cudaMemcpyAsync(dst, src, n, 1, stream or 0)[0]

    @staticmethod
    def _cu_write(stream, addr, value, flags):
        ctypes.c_uint32.from_address(addr).value = value
        return 0

    def driver_calls(self):
        return {name: ctypes.cast(fn, ctypes.c_void_p).value for name, fn in self.driver.items()}

    cudaHostRegisterPortable = 1

    def cudaHostRegister(self, ptr, nbytes, flags):  # the PCIe share's page-locked store (expert_store.py)
        self.registered[ptr] = nbytes
        return (0,)

    def cudaHostUnregister(self, ptr):
        del self.registered[ptr]
        return (0,)

    def cudaGetDevice(self):
        return (0, 0)

    def cudaSetDevice(self, device):
        return (0,)

    def cudaMemcpyAsync(self, dst, src, n, kind, stream):
        ctypes.memmove(dst, src, n)
        (self.dmas if stream == COPY_STREAM.ptr else self.other_copies).append(n)
        return (0,)

    def cudaEventCreate(self):  # an int handle, as cuda-bindings' cudaEvent_t converts (the native loop's events)
        self.events_alive += 1
        self.events_made += 1
        return (0, 7000 + self.events_made)

    def cudaEventDestroy(self, event):
        self.events_alive -= 1
        return (0,)

    def cudaEventRecord(self, event, stream):
        return (0,)

    def cudaEventSynchronize(self, event):
        return (0,)

    def cudaEventElapsedTime(self, a, b):
        return (0, 0.25)

    def cudaStreamQuery(self, stream):
        busy = stream == STREAM.ptr and not self.window_done.is_set()
        return (NOT_READY if busy else 0,)


def _rows_of(view: np.ndarray, whole: np.ndarray) -> int:
    """The first row of `view` inside `whole` (a view of its leading rows)."""
    return (view.__array_interface__["data"][0] - whole.__array_interface__["data"][0]) // whole[0].nbytes


def _expert(gate, up, down, e, x):
    """silu(gate_e x) * (up_e x) then down_e, float64, from the raw rows of a slot / staging array."""
    (gw, gt), (uw, ut), (dw, dt) = gate, up, down
    wg = dequant_rows(np.asarray(gw[e]), gt, x.shape[-1])
    wu = dequant_rows(np.asarray(uw[e]), ut, x.shape[-1])
    wd = dequant_rows(np.asarray(dw[e]), dt, wg.shape[0])
    from strata_cli.ops.moe import swiglu

    return swiglu(x.astype(np.float64), wg, wu, wd)


# the launches of ExpertTiers.pre / post that Kernels stands in for, by module (gpu/launch_tiers, gpu/launch_moe)
TIER_LAUNCHES = ("publish", "wait_word", "group_resident", "swiglu_experts", "combine")
MOE_LAUNCHES = ("router_topk", "router_gemv_topk", "shared_expert")


class Kernels:
    """numpy stand-ins of the launches ExpertTiers.pre / post make, on the same buffers (kernels/tiers.cu, moe.cu,
    the grouped expert GEMVs)."""

    def __init__(self, engine, ref, timeout_s=10.0):
        self.e, self.ref, self.timeout_s = engine, ref, timeout_s
        self.layer = None
        self.waits = []

    # engine/gpu/window.py
    def gemv_weight(self, e, name, x, out, stream):
        assert name.endswith("ffn_gate_inp.weight"), name
        self.layer = int(name.split(".")[1])
        out[...] = np.nan  # the router's picks come from the reference (below): no near tie may flip them

    def copy_async(self, dst, src, nbytes, stream):
        ctypes.memmove(dst.ctypes.data, src.ctypes.data, nbytes)

    # launch_moe
    def router_topk(self, logits, k, out_ids=None, out_w=None, stream=None, scalar_gate=None, **kw):
        assert not kw  # the tiered window groups its own entries (tier_group)
        if scalar_gate is not None:
            self._scalar_gate(*scalar_gate)
        return self._picks(out_ids, out_w)

    def router_gemv_topk(self, x, router_raw, router_type, k, groups, done, out_logits=None, out_ids=None,
                         out_w=None, scalar_gate=None, shared_id=None, stream=None):
        assert shared_id is None  # the host reads the K routed picks a row; the shared expert is its own launch
        model = self.e.model
        layers = [layer for layer in range(self.e.g.n_layers)
                  if np.shares_memory(model.info(f"blk.{layer}.ffn_gate_inp.weight").raw, router_raw)]
        assert len(layers) == 1, layers
        self.layer = layers[0]
        out_logits[...] = np.nan
        groups[1][:] = -1  # the routed MoE's grouping, which tiers leave unread (group_resident's is theirs)
        if scalar_gate is not None:
            self._scalar_gate(x, *scalar_gate)
        return self._picks(out_ids, out_w)

    def _picks(self, out_ids, out_w):
        r0 = _rows_of(out_ids, self.e.tiers.buf["route_ids"])
        ids, w = self.ref.picks(self.layer, r0, len(out_ids))
        out_ids[...] = ids
        out_w[...] = w
        return out_ids, out_w

    def _scalar_gate(self, x, sg_raw, sg_type, sg):
        from strata_cli.ops.moe import sigmoid

        w_sg = dequant_rows(np.asarray(sg_raw), sg_type, x.shape[1]).reshape(-1).astype(np.float32)
        sg[:, 0] = sigmoid(np.asarray(x, np.float64) @ w_sg)

    def shared_expert(self, x, gate_raw, up_raw, down_raw, sg_raw, types, out=None, sg=None, **kw):
        """sg given: the gate the router's launch wrote (no scalar-gate GEMV), else the launch's own"""
        from strata_cli.ops.moe import swiglu

        D = x.shape[1]
        w_gate = dequant_rows(gate_raw, types[0], D)
        h = swiglu(np.asarray(x, np.float64), w_gate, dequant_rows(up_raw, types[1], D),
                   dequant_rows(down_raw, types[2], w_gate.shape[0]))
        if sg is None:
            sg = np.empty((len(x), 1), np.float32)
            self._scalar_gate(x, sg_raw, types[3], sg)
        out[...] = h * sg
        return out

    # launch_tiers
    def publish(self, x, ids, w, r0, T, pub_x, pub_ids, pub_w, seq, ring, stream):
        pub_x[r0:r0 + T] = x[r0:r0 + T]
        pub_ids[r0:r0 + T] = ids[r0:r0 + T]
        pub_w[r0:r0 + T] = w[r0:r0 + T]
        seq[0] = ring  # after the payload, as the kernel's system fence orders it

    def wait_word(self, word, want, err, code, timeout_ns, waited_ns, stream, kind="spin"):
        assert timeout_ns == int(self.timeout_s * 1e9) and waited_ns.shape == (1,)
        t0 = time.monotonic()
        while word[0] < want:
            if time.monotonic() - t0 > timeout_ns / 1e9:
                if err[0] == 0:
                    err[0] = code
                break
            time.sleep(20e-6)
        waited_ns[0] = int((time.monotonic() - t0) * 1e9)
        self.waits.append((int(want), int(code)))

    def group_resident(self, ids, j0, J, slot_of, n_expert, g_expert, g_count, g_entries, stream):
        flat = ids.reshape(-1)[j0:j0 + J]
        g_count[:] = 0
        slots = [int(slot_of[e]) if 0 <= e < n_expert else -1 for e in flat]
        for u, s in enumerate(dict.fromkeys(s for s in slots if s >= 0)):
            rows = [j0 + i for i, v in enumerate(slots) if v == s]
            g_expert[u], g_count[u] = s, len(rows)
            g_entries[u, :len(rows)] = rows

    def swiglu_experts(self, gate, up, down, n_expert, groups, n_groups, nt, x, K, h, parts, stream):
        g_expert, g_count, g_entries = groups
        assert len(g_expert) >= n_groups
        for u in range(n_groups):
            count = int(g_count[u])
            if not count:
                continue
            assert count <= nt
            e = int(g_expert[u])
            assert 0 <= e < n_expert
            entries = g_entries[u, :count]
            parts[entries] = _expert(gate, up, down, e, x[entries // K])

    def combine(self, parts, ymiss, src, w, shared, out, r0, T, stream):
        from strata_cli.tiers.step_plan import SRC_CPU

        K = w.shape[1]
        for t in range(r0, r0 + T):
            j = t * K + np.arange(K)
            rows = np.where((src[j] == SRC_CPU)[:, None], ymiss[j], parts[j])
            out[t] = (w[t][:, None] * rows).sum(axis=0) + shared[t]


class Reference:
    """The numpy engine's MoE of each layer of each window: input rows, picks, routed + shared output."""

    def __init__(self, model, windows, monkeypatch):
        from strata_cli.engine.reference import ReferenceEngine
        from strata_cli.ops import moe

        self.L = model.geometry.n_layers
        self.by_window = []
        seen = []
        routed, shared = moe.routed_experts, moe.shared_expert

        def routed_hook(x, ids, weights, experts):
            out = routed(x, ids, weights, experts)
            seen.append({"x": np.asarray(x, np.float32), "ids": ids, "w": weights, "out": out.astype(np.float64)})
            return out

        def shared_hook(x, *weights):
            out = shared(x, *weights)
            seen[-1]["out"] = seen[-1]["out"] + out
            return out

        with monkeypatch.context() as mp:
            mp.setattr(moe, "routed_experts", routed_hook)
            mp.setattr(moe, "shared_expert", shared_hook)
            engine = ReferenceEngine(model, n_ctx=64)
            for tokens in windows:
                seen.clear()
                engine.run(tokens)
                engine.commit(len(tokens))
                assert len(seen) == self.L
                self.by_window.append(list(seen))
        self.current = None

    def picks(self, layer, r0, n):
        m = self.current[layer]
        return m["ids"][r0:r0 + n], m["w"][r0:r0 + n]


_ORDERS: dict = {}


def _stream_order(monkeypatch, g, T, G, layers):
    """(pre | post, layer, group) of a T-row tiered window over layers [lo, hi) in engine/gpu/window.py's recorded
    order (recorded before _tiered replaces window.gemv_weight, then kept)."""
    from test_window_steps import recorded_steps

    key = (g.n_layers, T, G, layers)
    if key in _ORDERS:
        return _ORDERS[key]

    with monkeypatch.context() as mp:
        steps = recorded_steps(mp, g, T, WindowPath(gemv_tc=False), tiers="one",
                               layers=layers)
    out = []
    for s in steps:
        if s.startswith("tiers."):
            part, layer, grp = s.split()
            out.append((part[6:], int(layer), int(grp)))
    _ORDERS[key] = out
    return out


def _tiered(monkeypatch, model, cfg, layers=None):
    """attach_tiers on a stand-in engine over layers [lo, hi) (default every layer; real Arena shapes, numpy
    buffers), then bind; returns (engine, kernels' driver)."""
    from strata_cli.engine.gpu import buffers, residency_fill, tiers as tiers_mod
    from strata_cli.gpu import graphs
    from strata_cli.tiers import host as host_mod
    from strata_cli.tiers.setup import residency_for

    layers = layers or (0, model.geometry.n_layers)
    for T in range(1, 17):
        _stream_order(monkeypatch, model.geometry, T, 1, layers)
    rt = FakeRt()
    FakeMapped.live.clear()
    monkeypatch.setattr(tiers_mod, "MappedBuffer", FakeMapped)
    monkeypatch.setattr(host_mod, "cudart", lambda: rt)  # (the TierHost's copy thread reads it when attached)
    monkeypatch.setattr(tiers_mod, "cudart", lambda: rt)  # (--pcie-frac auto's copy-path probe)
    monkeypatch.setattr(graphs, "new_stream", lambda: COPY_STREAM)
    # an adaptive cache's DeviceSlots: pinned staging, DMAs into the slot arrays (they land at once), its event
    monkeypatch.setattr(residency_fill, "MappedBuffer", FakeMapped)
    monkeypatch.setattr(residency_fill, "cudart", lambda: rt)
    event = SimpleNamespace(done=True, record=lambda stream: None)
    monkeypatch.setattr(residency_fill, "cupy", lambda: SimpleNamespace(cuda=SimpleNamespace(
        Event=lambda disable_timing: event)))
    monkeypatch.setattr(tiers_mod, "cupy", lambda: SimpleNamespace(ndarray=lambda shape, dtype, memptr: np.ctypeslib
                        .as_array((ctypes.c_uint8 * int(np.prod(shape))).from_address(memptr.ptr)).view(dtype)
                        .reshape(shape)))

    def upload_resident(model, table, pack_q8, stage):  # the slot arrays as upload_resident fills (raw, slot order)
        assert list(stage) == list(range(*layers))  # the stage's layers only
        out = {}
        for layer in stage:
            ids = np.flatnonzero(table[layer] >= 0)
            ids = ids[np.argsort(table[layer, ids])]
            arrays = []
            for name in tiers_mod.expert_names(layer):
                info = model.info(name)
                raw = np.ascontiguousarray(info.raw[ids]) if len(ids) else np.zeros((1, *info.raw.shape[1:]),
                                                                                     info.raw.dtype)
                arrays.append((raw.view(DevArray), info.ggml_type))
            out[layer] = (arrays, max(len(ids), 1))
        return out

    monkeypatch.setattr(tiers_mod, "upload_resident", upload_resident)
    g = model.geometry
    arena = buffers.plan_buffers(g, 64, 16, layers)
    table, note, cfg = residency_for(model, cfg, arena.planned_bytes(), 16, layers)
    assert table is not None, note

    class Weights:
        def raw(self, name):
            info = model.info(name)
            return info.raw, info.ggml_type

    engine = SimpleNamespace(g=g, model=model, max_t=16, w=Weights(), arena=arena, stream=STREAM, tier_note=note,
                             layers=layers)
    tiers_mod.attach_tiers(engine, table, cfg, pack_q8=True)
    engine.buf = {name: dev_zeros(shape, dtype) for name, shape, dtype in arena.specs}
    engine.tiers.bind(engine.buf)
    tiers_mod.rebalance_share(engine)  # as GPUEngine._build: auto's share from both measured rates
    kernels = Kernels(engine, None, cfg.timeout_s)
    bind_fakes(monkeypatch, kernels, rt)
    return engine, kernels, rt


def bind_fakes(monkeypatch, kernels, rt) -> None:
    """The launches and the driver of one engine's windows: its Kernels and its FakeRt (several tiered engines in one
    test, the stages of a layer split, rebind before each one's window)."""
    from strata_cli.engine.gpu import residency_fill, window
    from strata_cli.gpu import launch_moe, launch_tiers
    from strata_cli.tiers import host as host_mod, serve_loop

    monkeypatch.setattr(host_mod, "cudart", lambda: rt)
    monkeypatch.setattr(residency_fill, "cudart", lambda: rt)
    monkeypatch.setattr(serve_loop, "driver_calls", rt.driver_calls)
    for name in TIER_LAUNCHES:
        monkeypatch.setattr(launch_tiers, name, getattr(kernels, name))
    monkeypatch.setattr(launch_tiers, "write_word", lambda word, value, stream: word.__setitem__(0, value))
    for name in MOE_LAUNCHES:
        monkeypatch.setattr(launch_moe, name, getattr(kernels, name))
    monkeypatch.setattr(window, "gemv_weight", kernels.gemv_weight)
    monkeypatch.setattr(window, "copy_async", kernels.copy_async)


def _run_window(monkeypatch, engine, kernels, rt, moes, T):
    """One window as GPUEngine._serve_tiered runs a graph: TierHost.launched(T, start the stream), the stream thread
    running pre/post in the recorded order; returns {(layer, r0): block_out rows} after each post."""
    t = engine.tiers
    order = _stream_order(monkeypatch, engine.g, T, t.n_groups(T), engine.layers)
    got, failed = {}, []
    groups = t.groups(T)

    def stream():
        try:
            for part, layer, grp in order:
                r0, n = groups[grp]
                if part == "pre":
                    engine.buf["mixed"][r0:r0 + n] = moes[layer]["x"][r0:r0 + n]
                    t.pre(layer, grp, r0, n, len(groups), STREAM)
                else:
                    t.post(layer, grp, r0, n, len(groups), STREAM)
                    got[layer, r0] = np.array(engine.buf["block_out"][r0:r0 + n])
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            failed.append(exc)
        finally:
            rt.window_done.set()

    def start():
        rt.window_done.clear()
        threading.Thread(target=stream, daemon=True).start()

    engine.tier_host.launched(T, start)
    assert rt.window_done.wait(10) and not failed, failed
    return got


CASES = [("q8_0", dict(cache="0")), ("q8_0", dict(cache="0", pcie_frac=0.5)),
         ("q8_0", dict(cache="7", pcie_frac=1.0)), ("q8_0", dict(cache="40")),
         ("q8_0", dict(cache="40", pcie_frac=0.5)), ("bf16", dict(cache="0", pcie_frac=0.5)),
         ("bf16", dict(cache="7")),
         # auto with the rates faked (probe_rates below): PCIe pays at setup and still once the copy path is
         # measured; it pays at setup, but the measured DMA is too slow to gain the margin: the PCIe path dropped
         ("q8_0", dict(cache="0", pcie_frac="auto", measured=(60.0,))),
         ("q8_0", dict(cache="0", pcie_frac="auto", measured=(1.0,))),
         ("q8_0", dict(cache="24", policy="lru")),  # 3 slots a layer: fills land at their slot's offset
         ("q8_0", dict(cache="7", policy="lru", max_copy=26112)),
         ("q8_0", dict(cache="7", policy="lfu", pcie_frac=0.5)), ("bf16", dict(cache="7", policy="lru"))]


@pytest.mark.parametrize("kind,tier_args", CASES, ids=[f"{k}-{'-'.join(f'{a}={v}' for a, v in c.items())}"
                                                        for k, c in CASES])
def test_tiered_windows_equal_the_reference_moe(monkeypatch, fixture_dir, kind, tier_args):
    _check_tiered_windows(monkeypatch, fixture_dir, kind, tier_args, None)


# graph windows run in the native loop (tiers/serve_loop.py), the PCIe share's copies too; its reference, the Python
# steps (TierHost._step), on the same windows: both equal the numpy engine, and their step stats equal each other's
PYTHON_STEP_CASES = [("q8_0", dict(cache="0")), ("q8_0", dict(cache="40")), ("bf16", dict(cache="7")),
                     ("q8_0", dict(cache="24", policy="lru")), ("q8_0", dict(cache="0", pcie_frac=0.5)),
                     ("q8_0", dict(cache="7", pcie_frac=1.0)), ("bf16", dict(cache="0", pcie_frac=0.25)),
                     ("q8_0", dict(cache="7", policy="lfu", pcie_frac=0.5))]


@pytest.mark.parametrize("kind,tier_args", PYTHON_STEP_CASES,
                         ids=[f"{k}-{'-'.join(f'{a}={v}' for a, v in c.items())}" for k, c in PYTHON_STEP_CASES])
def test_python_steps_and_the_native_loop_serve_alike(monkeypatch, fixture_dir, kind, tier_args):
    from strata_cli.tiers import native
    from strata_cli.tiers.serve_loop import NativeServe

    if native.load() is None:
        pytest.skip("no native pool library (no C compiler): every window runs the Python steps already")
    looped = _check_tiered_windows(monkeypatch, fixture_dir, kind, tier_args, None)
    with monkeypatch.context() as m:
        m.setattr(NativeServe, "usable", staticmethod(lambda host: False))
        stepped = _check_tiered_windows(monkeypatch, fixture_dir, kind, tier_args, None)
    frac = tier_args.get("pcie_frac", 0)
    assert looped == stepped
    assert (sum(h["cpu_bytes"] for h in looped) > 0) == (frac < 1)
    assert (sum(h["pcie_bytes"] for h in looped) > 0) == (frac > 0)


# a stage of the layer split (GPUEngine(layers=(lo, hi)), lo > 0): its own residency over its layers (--expert-cache
# N per stage), its own steps numbered from ring 1, its own PCIe staging and CPU share
STAGE_CASES = [((3, 8), "q8_0", dict(cache="0")), ((2, 5), "q8_0", dict(cache="0", pcie_frac=0.5)),
               ((1, 6), "q8_0", dict(cache="7", pcie_frac=0.5)), ((4, 8), "bf16", dict(cache="5")),
               ((3, 8), "q8_0", dict(cache="9", pcie_frac=1.0)), ((2, 7), "q8_0", dict(cache="10", policy="lru")),
               ((5, 8), "bf16", dict(cache="0", pcie_frac=0.5))]


@pytest.mark.parametrize("layers,kind,tier_args", STAGE_CASES,
                         ids=[f"{lo}-{hi}-{k}-{'-'.join(f'{a}={v}' for a, v in c.items())}"
                              for (lo, hi), k, c in STAGE_CASES])
def test_tiered_stage_windows_equal_the_reference_moe(monkeypatch, fixture_dir, layers, kind, tier_args):
    _check_tiered_windows(monkeypatch, fixture_dir, kind, tier_args, layers)


def _native_usable_of_the_module():
    from strata_cli.tiers.serve_loop import NativeServe

    return NativeServe.usable


_NATIVE_USABLE = _native_usable_of_the_module()
PROBE_POOL_GBS = 10.0  # the pool's rate probe_rates fakes; the setup's gather probe says 40 (PCIe pays at setup)


def probe_rates(monkeypatch, dma_gbs: float) -> None:
    """--pcie-frac auto on fixed rates: the setup's pool probe (PROBE_POOL_GBS: a share > 0 at the constant DMA
    rate), the copy path's measurement (the store's experts really copied, the rate reported this one)."""
    from strata_cli.engine.gpu import tiers as tiers_mod
    from strata_cli.tiers import setup

    monkeypatch.setattr(setup, "probe_pool_gbs", lambda model: PROBE_POOL_GBS)
    real = tiers_mod.ExpertTiers.measure_copy_path

    def measure(self, repeats=3):
        _, nbytes = real(self, repeats=1)
        return dma_gbs, nbytes

    monkeypatch.setattr(tiers_mod.ExpertTiers, "measure_copy_path", measure)


def _check_tiered_windows(monkeypatch, fixture_dir, kind, tier_args, layers):
    """Windows through the tiers of every layer (layers None) or of a stage [lo, hi), each post's block_out rows
    equal to the numpy engine's MoE output of the same layer and rows."""
    from strata_cli.model.gguf_file import open_model
    from strata_cli.tiers.cache_policy import DEFAULT_MAX_COPY_BYTES
    from strata_cli.tiers.config import TierConfig
    from strata_cli.tiers import watchdog

    model = open_model(fixture_dir / f"model-{kind}.gguf")
    g = model.geometry
    lo, hi = layers or (0, g.n_layers)
    n_stage = hi - lo
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    sizes = [1, 3, 4, 2, 8, 5]  # T >= 4: the window graph's fused HC reads (the same pre/post order)
    windows = [tokens[sum(sizes[:i]):sum(sizes[:i + 1])] for i in range(len(sizes))]
    ref = Reference(model, windows, monkeypatch)
    tier_args = dict(tier_args)
    tier_args.setdefault("pcie_frac", 0.0)  # a case without a share names none (the default is auto: its cases below)
    measured = tier_args.pop("measured", None)
    if measured is not None:
        probe_rates(monkeypatch, *measured)
    engine, kernels, rt = _tiered(monkeypatch, model, TierConfig(**tier_args, timeout_s=10.0), layers)
    kernels.ref = ref
    probe_dmas = len(rt.dmas)  # auto's copy-path measurement (a DMA an expert and projection) or none
    n_probe = min(engine.tiers.Q or engine.tiers.JM, int((engine.tiers.table_host[lo] < 0).sum()))
    t, host = engine.tiers, engine.tier_host
    assert not t.all_resident and t.pcie == (t.cfg.pcie_frac > 0) and isinstance(t.cfg.pcie_frac, float)
    if tier_args.get("pcie_frac") == "auto":  # the pool and gather at setup, the copy path after the buffers exist
        from strata_cli.tiers.share import ShareRates, best_pcie_frac

        rates = ShareRates(PROBE_POOL_GBS, *measured, dma_measured=True)
        assert t.cfg.share_auto and t.cfg.rates == rates and t.cfg.pcie_frac == best_pcie_frac(rates)
        assert f"DMA {measured[0]:.1f} GB/s measured" in engine.tier_note
        assert (t.cfg.pcie_frac > 0) == (measured[0] > 5.0)
        assert (t.store is not None) == t.pcie and (host._copier is not None) == t.pcie
        assert bool(rt.registered) == t.pcie  # a dropped share unregistered its store
    else:
        assert not t.cfg.share_auto and t.cfg.rates is None
    # the stage's rows only: other layers hold no slot, upload nothing, have no step (wait-time rows per step)
    assert (t.table_host[:lo] < 0).all() and (t.table_host[hi:] < 0).all()
    assert sorted(t.resident) == list(range(lo, hi)) and t.wait_ns.host.shape == (n_stage * 2, 2)
    if tier_args["cache"] not in ("all", "auto"):
        assert (t.table_host >= 0).sum() == min(int(tier_args["cache"]), n_stage * g.n_expert)
    # the engine's warm-up: one row of the first window, not counted; a GPU stage's warm-up (layer_split._load_kernels)
    # runs more windows: an adaptive cache's copies issued then stay in flight (their slots are not lost)
    warm_up = [(0, 1)] if layers is None else [(0, 1), (1, 3), (2, 4)]
    for w, T in warm_up:
        ref.current = ref.by_window[w]
        _run_window(monkeypatch, engine, kernels, rt, ref.current, T)
    host.after_warm_up()
    shares = {"vram": 0, "pcie": 0, "cpu": 0}
    for w, moes in enumerate(ref.by_window):
        ref.current = moes
        T = len(windows[w])
        G = t.n_groups(T)
        kernels.waits.clear()
        tuner = host.share_tuner()  # --pcie-frac auto with a share: the share of this T moves between windows
        want_frac = tuner.frac(T) if tuner is not None else t.cfg.pcie_frac
        got = _run_window(monkeypatch, engine, kernels, rt, moes, T)
        assert host.history[-1]["pcie_frac"] == want_frac
        if host._loop is not None and host._loop.pcie:  # the native loop planned with it
            assert host._loop.args.pcie_frac == want_frac
        # each post waits for its own ring: flagB (wait kind 0) first with a PCIe share, then flag (kind 1), the
        # error code naming that step and kind (ExpertTiers.wait_code, read back by TierHost._check_err); a
        # stage's rings count from 1 over its own layers
        rings = [t.ring(layer, grp, G) for part, layer, grp in _stream_order(monkeypatch, g, T, G, (lo, hi))
                 if part == "post"]
        assert sorted(rings) == list(range(1, n_stage * G + 1))
        kinds = (0, 1) if t.pcie else (1,)
        assert kernels.waits == [(r, (r - 1) * 2 + k + 1) for r in rings for k in kinds]
        assert len(got) == n_stage * G and {layer for layer, _ in got} == set(range(lo, hi))
        for (layer, r0), rows in got.items():
            want = moes[layer]["out"][r0:r0 + len(rows)]
            err = np.abs(rows - want).max() / np.abs(want).max()
            assert err <= 2e-5, f"window {w} layer {layer} rows {r0}..: relative error {err:.2e}"
        stats = host.history[-1]
        assert stats["vram"] + stats["pcie"] + stats["cpu"] == n_stage * T * g.n_expert_used
        for key in shares:
            shares[key] += stats[key]
        assert int(t.words.host[4]) == 0  # no GPU wait timed out
    assert len(host.history) == len(windows) and host.windows == len(windows)
    tuner = host.share_tuner()
    assert (tuner is not None) == (t.cfg.share_auto and t.pcie)
    if tuner is not None:  # every window size served has its own share, and the windows' rates moved them
        assert sorted(tuner._by_t) == sorted(set(sizes))
        assert any(tuner.frac(T) != t.cfg.pcie_frac for T in sizes)
    frac = t.cfg.pcie_frac
    assert (shares["pcie"] > 0) == (frac > 0) and (shares["cpu"] > 0) == (frac < 1)
    assert (shares["vram"] > 0) == bool((t.table_host >= 0).any())
    if t.fill is None:
        assert probe_dmas == (3 * n_probe if measured else 0)
        assert bool(rt.dmas[probe_dmas:]) == (frac > 0) and not rt.other_copies
    else:  # the slots changed between windows (copies into them, the table uploaded), their count did not
        swaps = [h["swaps"] for h in host.history]
        assert sum(swaps) > 0 and rt.other_copies
        if "max_copy" in tier_args:  # one expert's bytes (26112 in the q8_0 fixture): one swap per window at most
            assert max(swaps) <= 1
        else:  # the default (cache_policy.default_max_copy): the fill path's budget, capped at what the slots hold
            cache_bytes = int((t.fill.policy.capacity * np.array([sum(b) for b in t.expert_bytes])).sum())
            assert t.cfg.max_copy == cache_bytes < DEFAULT_MAX_COPY_BYTES
            staging = t.fill.device.staging
            # with a PCIe share the fills came from the page-locked store: nothing gathered, no staging made
            assert staging is None if t.store is not None else staging.nbytes == cache_bytes
        assert (t.table_host >= 0).sum() + len(t.fill.policy.pending) == int(tier_args["cache"])
        np.testing.assert_array_equal(engine.buf["tier_table"], t.table_host)  # the device reads the host's table
    # every window without a PCIe share ran in the native loop where the native plan and pool exist
    from strata_cli.tiers import native
    from strata_cli.tiers.serve_loop import NativeServe

    if NativeServe.usable is _NATIVE_USABLE:
        assert NativeServe.usable(host) == (native.load() is not None)
    assert (host._loop is not None) == NativeServe.usable(host)
    assert host._loop is None or host._loop.pcie == t.pcie  # the loop issued the PCIe share's copies itself
    if t.pcie:  # every window's DMAs sat between its steps' events (the warm-up's too, in the Python steps)
        assert host.history[-1]["copy_ms"] > 0
    history = [{key: h[key] for key in ("vram", "pcie", "cpu", "cpu_bytes", "pcie_bytes")} for h in host.history]
    # the engine's close(): the host's thread, events, the watchdog's list; the tiers' pinned buffers
    host.close()
    t.close()
    assert rt.events_alive == 0 and host not in watchdog.live_verifiers() and not rt.registered
    assert FakeMapped.live and all(buf.freed for buf in FakeMapped.live)
    return history


def test_the_copy_path_probe_copies_the_first_layers_missed_experts(monkeypatch, fixture_dir):
    """ExpertTiers.measure_copy_path (--pcie-frac auto): up to Q of the engine's first layer's stored (non-resident)
    experts land from the page-locked store in group 0's device staging slots in expert order, one copy an expert and
    projection; the rate is bytes over the DMA's time."""
    from strata_cli.model.gguf_file import open_model
    from strata_cli.tiers.config import TierConfig

    model = open_model(fixture_dir / "model-q8_0.gguf")
    engine, kernels, rt = _tiered(monkeypatch, model, TierConfig(cache="7", pcie_frac=0.5), (2, 6))
    t = engine.tiers
    assert rt.registered == {t.store.base: t.store.nbytes}
    dma, nbytes = t.measure_copy_path(repeats=2)
    row = t.table_host[2]
    want = np.flatnonzero(row < 0)[:t.Q]
    assert len(want) and nbytes == len(want) * sum(t.expert_bytes[2])
    for p, name in enumerate(("gate", "up", "down")):
        raw = model.info(f"blk.2.ffn_{name}_exps.weight").raw
        per = raw.nbytes // t.E
        got = engine.buf[f"tier_stage.0.{p}"][:len(want) * per].reshape(len(want), per)
        np.testing.assert_array_equal(got, np.asarray(raw).reshape(t.E, -1).view(np.uint8)[want])
    assert dma == pytest.approx(nbytes / 1e9 / 0.25e-3) and rt.events_alive == 0  # FakeRt: 0.25 ms a DMA
    engine.tier_host.close()
    t.close()
