"""tiers/gather.py (the host gather: an adaptive cache's slot fills, the page-locked store's copy at load) and
engine/gpu/expert_store.py (the PCIe share's page-locked experts) with the CUDA runtime faked; the DMAs from the
store run in the GPU tier tests."""

import ctypes
import types

import numpy as np
import pytest

from strata_cli.tiers.gather import expert_bytes_view, gather_rows
from strata_cli.tiers.doorbell import StepRange
from strata_cli.tiers.step_plan import plan_step


def test_expert_bytes_view_is_the_tensors_bytes_per_expert_without_a_copy():
    raw = np.arange(3 * 4 * 5, dtype=np.float32).reshape(3, 4, 5)
    view = expert_bytes_view(raw, 3)
    assert view.shape == (3, 80) and view.dtype == np.uint8 and np.shares_memory(view, raw)
    np.testing.assert_array_equal(view[2].view(np.float32), raw[2].reshape(-1))


def _native():
    from strata_cli.tiers import native

    lib = native.load()
    if lib is None:
        pytest.skip("no C compiler: the native gather is not built")
    return lib


# (lib kind, threads): numpy's take without the library, the native gather on 1 and 3 threads (more threads than
# chunks in the small pieces: every chunk still copied once), and the plain-C build
GATHER_WAYS = [("numpy", 1), ("native", 1), ("native", 3), ("scalar", 2)]


def _lib(kind):
    from strata_cli.tiers import native

    if kind == "numpy":
        return None
    _native()
    return native.load() if kind == "native" else native.load_variant(("STRATA_NO_SIMD=1",), isa="scalar")


@pytest.mark.parametrize("kind,threads", GATHER_WAYS)
def test_gather_rows_copies_the_experts_in_plan_order(kind, threads):
    rng = np.random.default_rng(0)
    # odd expert sizes (unaligned rows and tails) and one above a 64 KiB chunk, so pieces split over chunks
    src = [rng.integers(0, 256, (9, n), dtype=np.uint8) for n in (40, 40_001, 70_000 + 3)]
    experts = np.array([7, 0, 3, 8], dtype=np.intp)
    outs = [np.full((4, n.shape[1]), 0xEE, np.uint8) for n in src]
    gather_rows(_lib(kind), threads, outs, src, experts)
    for p in range(3):
        np.testing.assert_array_equal(outs[p], src[p][experts])
    gather_rows(_lib(kind), threads, [o[:0] for o in outs], src, experts[:0])  # no expert: nothing copied


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_native_gather_copies_every_byte_at_any_alignment(threads):
    """strata_gather: every destination and source alignment, sizes around 128 bytes and the 64 KiB chunk, a
    zero-byte piece among them."""
    lib = _native()
    rng = np.random.default_rng(3)
    pool = rng.integers(0, 256, 300_000, dtype=np.uint8)
    sizes = [0, 1, 31, 127, 128, 129, 160, 1000, 65_536, 65_537, 131_071, 70_000]
    offsets = [(i * 7) % 64 for i in range(len(sizes))]
    out = np.zeros(sum(sizes) + 128 * len(sizes), np.uint8)
    src_p, dst_p, want, at = [], [], [], 0
    for n, off in zip(sizes, offsets):
        s0 = (off * 3 + 5) % 97
        src_p.append(pool.ctypes.data + s0)
        dst_p.append(out.ctypes.data + at + off)
        want.append((at + off, pool[s0:s0 + n]))
        at += off + n + 64
    args = [np.array(v, dtype=t) for v, t in ((src_p, np.uint64), (dst_p, np.uint64), (sizes, np.int64))]
    assert lib.strata_gather(threads, len(sizes), *(a.ctypes.data for a in args)) == 0
    mask = np.ones(out.size, bool)
    for o, piece in want:
        np.testing.assert_array_equal(out[o:o + piece.size], piece)
        mask[o:o + piece.size] = False
    assert not out[mask].any()  # nothing written outside the pieces
    bad = np.array([-1], np.int64)
    assert lib.strata_gather(1, 1, args[0].ctypes.data, args[1].ctypes.data, bad.ctypes.data) == 1


def test_gather_refuses_rows_that_do_not_match():
    lib = _native()
    src = [np.zeros((4, 16), np.uint8)] * 3
    with pytest.raises(ValueError, match="out of range"):
        gather_rows(lib, 1, [np.zeros((1, 16), np.uint8)] * 3, src, np.array([4]))
    with pytest.raises(ValueError, match="rows must match"):
        gather_rows(lib, 1, [np.zeros((1, 8), np.uint8)] * 3, src, np.array([1]))


class StoreRt:
    """The CUDA runtime calls of the store and the copy thread: host copies are memmoves, events tokens."""

    cudaMemcpyKind = types.SimpleNamespace(cudaMemcpyHostToDevice="h2d")
    cudaHostRegisterPortable = 1

    def __init__(self, log):
        self.log, self.registered = log, {}

    def cudaHostRegister(self, ptr, nbytes, flags):
        assert ptr % (2 << 20) == 0 and nbytes % (2 << 20) == 0  # whole huge pages of the store's own mapping
        self.registered[ptr] = nbytes
        return (0,)

    def cudaHostUnregister(self, ptr):
        del self.registered[ptr]
        return (0,)

    def cudaMemcpyAsync(self, dst, src, n, kind, stream):
        ctypes.memmove(dst, src, n)
        self.log.append(("copy", n))
        return (0,)

    def cudaEventCreate(self):
        return (0, object())

    def cudaEventRecord(self, event, stream):
        self.log.append(("event",))
        return (0,)

    def cudaEventElapsedTime(self, a, b):
        return (0, 1.5)


def _check(ret, what="cuda call"):
    assert ret[0] == 0, what
    return ret[1] if len(ret) > 1 else None


@pytest.mark.parametrize("policy", ["static", "lru"])
def test_the_store_holds_every_expert_that_may_miss_page_locked(fixture_dir, policy):
    """PinnedExperts over the fixture's mapped file: a static residency's non-resident experts of each layer (an
    adaptive policy's every expert), byte for byte the file's rows, in one registered range of its own 2 MB-aligned
    mapping; addresses() of a stored expert point at its bytes, of a resident one is refused; close() unregisters
    once however often it runs."""
    from strata_cli.engine.gpu.expert_store import PinnedExperts
    from strata_cli.model.gguf_file import open_model
    from strata_cli.tiers.residency import expert_names

    model = open_model(fixture_dir / "model-q8_0.gguf")
    g = model.geometry
    table = np.full((g.n_layers, g.n_expert), -1, np.int32)
    table[1, [0, 3]] = [0, 1]
    table[2, :] = np.arange(g.n_expert)  # every expert of layer 2 resident: nothing stored there (static)
    rt = StoreRt([])
    store = PinnedExperts(model, range(1, 4), table if policy == "static" else None, _native(), 2, rt=rt,
                          check=_check)
    assert rt.registered == {store.base: store.nbytes}
    stored = {layer: np.flatnonzero(table[layer] < 0) if policy == "static" else np.arange(g.n_expert)
              for layer in range(1, 4)}
    for layer, ids in stored.items():
        for p, name in enumerate(expert_names(layer)):
            want = expert_bytes_view(model.info(name).raw, g.n_expert)[ids]
            np.testing.assert_array_equal(store.view(layer, p), want)
        if len(ids):
            pick = ids[::-1][:3]
            for p, addrs in enumerate(store.addresses(layer, pick)):
                nb = store.bytes_of[layer][p]
                for e, a in zip(pick, addrs.tolist()):
                    got = np.ctypeslib.as_array((ctypes.c_uint8 * nb).from_address(a))
                    np.testing.assert_array_equal(got, expert_bytes_view(model.info(expert_names(layer)[p]).raw,
                                                                         g.n_expert)[e])
    assert store.stored_bytes() == sum(len(ids) * sum(store.bytes_of[layer]) for layer, ids in stored.items())
    if policy == "static":
        with pytest.raises(ValueError, match="not in the page-locked store"):
            store.addresses(1, np.array([2, 3]))
    store.close()
    store.close()
    assert rt.registered == {}


def test_the_store_refuses_more_than_the_host_has(fixture_dir, monkeypatch):
    from strata_cli.engine.gpu import expert_store
    from strata_cli.errors import InputError
    from strata_cli.model.gguf_file import open_model

    model = open_model(fixture_dir / "model-q8_0.gguf")
    monkeypatch.setattr(expert_store, "available_bytes", lambda: 1 << 20)
    rt = StoreRt([])
    with pytest.raises(InputError, match=r"page-locks its experts in host memory: .* GiB needed"):
        expert_store.PinnedExperts(model, range(model.geometry.n_layers), None, None, 1, rt=rt, check=_check)
    assert rt.registered == {}


def test_tier_host_copies_each_expert_from_the_store_between_two_events(monkeypatch, fixture_dir):
    """TierHost._copy_pcie with the driver faked: the step's PCIe experts land from the page-locked store in the
    group's device slots in plan order (one copy an expert and projection), between the step's event pair, flagB
    after them; _copy_ms sums the pairs' times."""
    from strata_cli.engine.gpu import tiers as tiers_mod
    from strata_cli.engine.gpu.expert_store import PinnedExperts
    from strata_cli.gpu import launch_tiers
    from strata_cli.model.gguf_file import open_model
    from strata_cli.tiers import host as tier_host
    from strata_cli.tiers.residency import expert_names

    log = []
    rt = StoreRt(log)
    monkeypatch.setattr(tier_host, "cudart", lambda: rt)
    monkeypatch.setattr(tiers_mod, "cudart", lambda: rt)
    monkeypatch.setattr(launch_tiers, "write_word", lambda word, value, stream: log.append(("flagB", value)))
    model = open_model(fixture_dir / "model-q8_0.gguf")
    g = model.geometry
    E, Q = g.n_expert, 4
    store = PinnedExperts(model, range(1), None, _native(), 1, rt=rt, check=_check)
    nbytes = [int(model.info(n).n_bytes) // E for n in expert_names(0)]
    device = {f"tier_stage.{grp}.{p}": np.zeros(Q * nbytes[p], np.uint8) for grp in range(2) for p in range(3)}
    slots = {k: types.SimpleNamespace(data=types.SimpleNamespace(ptr=v.ctypes.data)) for k, v in device.items()}
    t = types.SimpleNamespace(store=store, G=2, steps=StepRange(0, 1), expert_bytes=[nbytes],
                              copy_stream=types.SimpleNamespace(ptr=0), buf=slots,
                              words=types.SimpleNamespace(device=np.zeros(8, np.uint32)))
    t.issue_copies = lambda *a: tiers_mod.ExpertTiers.issue_copies(t, *a)
    host = tier_host.TierHost.__new__(tier_host.TierHost)
    host.t, host.stats, host._events, host._timed_copies = t, {"issue_ms": 0.0}, [], []
    host._copy_phase = ("idle", 0.0)
    ids = np.array([[4, 1], [1, 5]])
    plan = plan_step(ids, np.full(E, -1, np.int32), 1.0)
    host._copy_pcie(0, 1, plan.pcie.experts, want=7)
    experts = plan.pcie.experts.tolist()
    assert sorted(experts) == [1, 4, 5]
    for p, name in enumerate(expert_names(0)):
        n = nbytes[p]
        want = expert_bytes_view(model.info(name).raw, E)[experts]
        np.testing.assert_array_equal(device[f"tier_stage.1.{p}"][:3 * n].reshape(3, n), want)
        assert not device[f"tier_stage.0.{p}"].any()  # the other group's slots are untouched
    assert log == [("event",), *[("copy", n) for n in nbytes for _ in range(3)], ("event",), ("flagB", 7)]
    assert len(host._events) == 2 and host._copy_ms() == 1.5 and host._timed_copies == []
    store.close()


def test_gather_team_is_sized_by_the_bytes(monkeypatch):
    """A gather takes ceil(bytes / GATHER_BYTES_PER_THREAD) threads of the team offered, at least 1, at most the
    team; gather_rows hands that count to strata_gather (size_by_bytes=False: the count given)."""
    from strata_cli.tiers import gather as g

    per = g.GATHER_BYTES_PER_THREAD
    assert [g.gather_threads(16, n) for n in (0, 1, per, per + 1, 4 * per, 100 * per)] == [1, 1, 1, 2, 4, 16]
    assert g.gather_threads(3, 100 * per) == 3
    seen = []

    class Lib:
        def strata_gather(self, threads, n, src, dst, nbytes):
            seen.append(threads)
            return 0

    srcs = [np.zeros((8, per), np.uint8) for _ in range(3)]
    outs = [np.zeros((2, per), np.uint8) for _ in range(3)]
    g.gather_rows(Lib(), 16, outs, srcs, np.array([1, 5]))  # 6 x per bytes
    g.gather_rows(Lib(), 16, outs, srcs, np.array([1, 5]), size_by_bytes=False)
    assert seen == [6, 16]
