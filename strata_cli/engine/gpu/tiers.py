"""Expert tiers of the GPU engine: a VRAM cache of (layer, expert) pairs, and the misses served
inside the captured window through mapped-memory doorbells.

Per (layer, token group) the window graph runs pre(): router, top-k, publish the group's rows x, ids, weights to
mapped memory and ring `seq`, the shared expert, then the VRAM-resident entries (grouped on the device through the
residency table, no host round trip). post(): [wait flagB, copy the host's plan, the PCIe share's experts from the
copy engine's staging slots], wait flag, then combine VRAM/PCIe rows (device) with the CPU rows (mapped `ymiss`).
The host side (the config, the residency choice, the server of each step) lives in strata_cli/tiers/. A model whose
experts all fit keeps today's graph (no tiers object at all); a stall window (tiers/config.py) forces the doorbell
graph even then.

A stage of the layer split (GPUEngine(layers=(lo, hi))) has its own tiers over its layers: layer indexes stay
global (the tables keep the model's L rows, those of other stages' layers never read or uploaded), its steps are
numbered over its own layers (tiers/doorbell.StepRange, the one home of that mapping).

Legend: L layers (the model's), E experts per layer, K experts per row, M max window rows, JM = M*K entries, D hidden,
G token groups (one: the doorbell steps keep the group index), Q staging slots per group (distinct PCIe experts of one step).
"""

from __future__ import annotations

import numpy as np

from ...errors import InputError
from ...gpu import launch_moe as moe
from ...gpu import launch_tiers as tl
from ...gpu.launch_util import GEMV_MAXT
from ...gpu.runtime import MappedBuffer, check, cudart, cupy
from ...model import packed
from ...report.progress import timed_phase
from ...tiers.config import TierConfig
from ...tiers.doorbell import ERR, FLAG, FLAG_B, N_WORDS, SEQ, StepRange
from ...tiers.residency import expert_names

PROJ = ("gate", "up", "down")
# wait kinds in the error code and the wait-time table
WAIT_B, WAIT_FLAG = 0, 1


def upload_resident(model, table: np.ndarray, pack_q8: bool, layers: range):
    """Per layer of `layers` (a dict by global layer index): [(device array [n_slots, rows, row], ggml type)] for
    gate, up, down holding only the resident experts in slot order (read from the memory-mapped file), and n_slots. A
    layer without residents gets one zero slot so that every launch has a valid array (no entry ever names it)."""
    cp = cupy()
    out = {}
    for layer in layers:
        ids = np.flatnonzero(table[layer] >= 0)
        ids = ids[np.argsort(table[layer, ids])]
        arrays = []
        for name in expert_names(layer):
            info = model.info(name)
            raw = np.ascontiguousarray(info.raw[ids]) if len(ids) else np.zeros((1, *info.raw.shape[1:]),
                                                                                 info.raw.dtype)
            arr, ggml_type = cp.asarray(raw), info.ggml_type
            if pack_q8 and packed.packable(tuple(arr.shape), ggml_type):
                from ...gpu.launch_pack import pack_q8_0

                arr = pack_q8_0(arr, int(info.shape[0]), out=cp.empty_like(arr))
                ggml_type = packed.Q8_0_R32
            arrays.append((arr, ggml_type))
        out[layer] = (arrays, max(len(ids), 1))
    cp.cuda.Device().synchronize()
    return out


class ExpertTiers:
    """Device and mapped buffers of the tiers, and the recording of one token group's MoE (pre/post)."""

    def __init__(self, engine, table: np.ndarray, cfg: TierConfig, pack_q8: bool = True):
        g, model = engine.g, engine.model
        self.engine, self.cfg, self.model = engine, cfg, model
        self.table_host = table
        self.K, self.D, self.E, self.L = g.n_expert_used, g.n_embd, g.n_expert, g.n_layers
        self.steps = StepRange(*engine.layers)  # the engine's layers [lo, hi): every loop over layers runs over them
        self.M = engine.max_t
        self.JM = self.M * self.K
        if self.JM > 1024:
            raise InputError(f"max_t {self.M} x {self.K} experts per row = {self.JM} entries exceed the tier "
                             "kernels' 1024")
        self.G = 1  # token groups per window (the removed --split ran two: README, 'The split window')
        self.pcie = cfg.pcie_frac > 0
        self.Q = min(self.E, self.JM) if self.pcie else 0
        self.plan_words = self.JM * (3 + GEMV_MAXT)  # src | pcie g_expert | g_count | g_entries [JM, MAXT]
        # an adaptive --expert-policy copies raw file blocks into the slots (residency_fill.py): no repacking
        layers = self.steps.layers
        phase = getattr(engine, "load_phase", None) or (lambda text: timed_phase(text, quiet=True))
        with phase("resident experts uploaded") as done:
            self.resident = upload_resident(model, table, pack_q8 and cfg.policy == "static", layers)
            rows = table[self.steps.lo:self.steps.hi]
            nbytes = sum(int(sum(model.info(n).n_bytes // self.E for n in expert_names(layer))
                             * (rows[layer - self.steps.lo] >= 0).sum()) for layer in layers)
            done["what"] = (f"resident experts uploaded ({int((rows >= 0).sum())} (layer, expert) pairs, "
                            f"{nbytes / 2**30:.2f} GiB)")
        self.has_slots = (table >= 0).any(axis=1)  # per layer, fixed: the graph runs a layer's VRAM experts iff
        self.fill = None                            # it has slots; fill: tiers/cache_policy.SlotFiller (bind)
        self.expert_bytes = [[model.info(n).n_bytes // self.E for n in expert_names(layer)]
                             for layer in range(self.L)]
        self.file_types = [[model.info(n).ggml_type for n in expert_names(layer)] for layer in range(self.L)]
        self.file_rows = [[tuple(model.info(n).raw.shape[1:]) for n in expert_names(layer)] for layer in range(self.L)]
        M, K, D = self.M, self.K, self.D
        self.pub_x = MappedBuffer((M, D), np.float32)
        self.pub_ids = MappedBuffer((M, K), np.int32)
        self.pub_w = MappedBuffer((M, K), np.float32)
        self.words = MappedBuffer((N_WORDS,), np.uint32)
        self.ymiss = MappedBuffer((self.JM, D), np.float32)
        self.plan = MappedBuffer((2, self.plan_words), np.int32)
        self.wait_ns = MappedBuffer((self.steps.count(2), 2), np.uint64)  # [step, wait kind], up to 2 groups
        self.copy_stream = None
        self.store = None  # the PCIe share's source: its experts page-locked (expert_store.py)
        # an eager window's launcher calls launch_gate(ring) before each flagB wait (tiers/host.py TierHost.wait_issued:
        # the step's copies issued first); None while a graph is captured (a graph launch launches nothing after)
        self.launch_gate = None
        if self.pcie:
            from ...gpu.graphs import new_stream
            from ...tiers.pool import gather_team
            from .expert_store import PinnedExperts

            self.copy_stream = new_stream()
            with phase("PCIe experts page-locked") as done:
                # copied on the pool's team, then registered (expert_store.py says why, and why not the file)
                self.store = PinnedExperts(model, layers, table if cfg.policy == "static" else None, *gather_team(),
                                           rt=cudart(), check=check)
                done["what"] = (f"PCIe experts page-locked ({self.store.stored_bytes() / 2**30:.2f} GiB of "
                                f"{'non-resident' if cfg.policy == 'static' else 'all'} experts in host memory)")
        self.timeout_ns = int(cfg.timeout_s * 1e9)

    def most_bytes(self, p: int) -> int:
        """The largest expert of projection p over the engine's layers (a staging slot holds any of them)."""
        return max(self.expert_bytes[layer][p] for layer in self.steps.layers)

    def stage_table(self) -> np.ndarray:
        """The residency rows of the engine's layers (a view of table_host)."""
        return self.table_host[self.steps.lo:self.steps.hi]

    # ---- buffers
    def add_buffers(self, arena) -> None:
        arena.add("tier_table", (self.L, self.E), np.int32)
        arena.add("tier_vg_expert", (self.JM,), np.int32)
        arena.add("tier_vg_count", (self.JM,), np.int32)
        arena.add("tier_vg_entries", (self.JM, GEMV_MAXT), np.int32)
        arena.add("tier_plan", (2, self.plan_words), np.int32)
        if self.Q:
            for grp in range(self.G):
                for p in range(3):
                    arena.add(f"tier_stage.{grp}.{p}", (self.Q * self.most_bytes(p),), np.uint8)

    def bind(self, buf) -> None:
        self.buf = buf
        buf["tier_table"].set(self.table_host)
        self.all_resident = bool((self.stage_table() >= 0).all())
        if self.cfg.policy != "static":
            from .residency_fill import make_filler

            self.fill = make_filler(self)

    def staged(self, layer: int, grp: int):
        """The PCIe staging slots of group grp viewed as layer's gate/up/down arrays [Q, expert bytes]."""
        cp = cupy()
        out = []
        for p in range(3):
            base = self.buf[f"tier_stage.{grp}.{p}"]
            nbytes = self.expert_bytes[layer][p]
            out.append((cp.ndarray((self.Q, nbytes), np.uint8, memptr=base.data), self.file_types[layer][p]))
        return out

    # ---- groups and steps
    def groups(self, T: int) -> list[tuple[int, int]]:
        """(first row, rows) of each token group of a T-row window: the whole window."""
        return [(0, T)]

    def n_groups(self, T: int) -> int:
        return len(self.groups(T))

    def ring(self, layer: int, grp: int, G: int) -> int:
        return self.steps.ring(layer, grp, G)

    def wait_code(self, step: int, kind: int) -> int:
        return step * 2 + kind + 1

    # ---- recording
    def pre(self, layer: int, grp: int, r0: int, n: int, G: int, stream) -> None:
        """Router, doorbell, shared expert and the VRAM-resident entries of rows [r0, r0+n) of layer."""
        from .buffers import split_k
        from .window import gemv_weight

        e, b = self.engine, self.buf
        w, K = e.w, self.K
        blk = f"blk.{layer}."
        rows = slice(r0, r0 + n)
        x = b["mixed"][rows]
        names = [blk + f"ffn_{p}_shexp.weight" for p in PROJ] + [blk + "ffn_gate_inp_shexp.weight"]
        raws = [w.raw(name) for name in names]
        # the shared expert's scalar gate in the router's launch where it decodes the gate's type (as the
        # all-resident window does: no GEMV of one row of its own), and the router's GEMV in its top-k launch where
        # router_fuses says: 1 launch a layer for what were 3 (router GEMV, top-k, scalar gate). The fused launch
        # also groups the entries by expert (it always does) into the routed MoE's scratch, which tiers leave unread:
        # their grouping is group_resident's, by the residency table.
        sg = b["sh_sg"][rows] if raws[3][1] in moe.SG_TYPES else None
        router, router_type = w.raw(blk + "ffn_gate_inp.weight")
        out = dict(out_ids=b["route_ids"][rows], out_w=b["route_w"][rows], stream=stream)
        if moe.router_fuses(router_type, self.E):
            moe.router_gemv_topk(x, router, router_type, K, (b["moe_gexp"], b["moe_gcnt"], b["moe_gent"]),
                                 b["route_done"], out_logits=b["router"][rows],
                                 scalar_gate=None if sg is None else (*raws[3], sg), **out)
        else:
            gemv_weight(e, blk + "ffn_gate_inp.weight", x, b["router"][rows], stream)
            moe.router_topk(b["router"][rows], K, scalar_gate=None if sg is None else (x, *raws[3], sg), **out)
        tl.publish(b["mixed"], b["route_ids"], b["route_w"], r0, n, self.pub_x.device, self.pub_ids.device,
                   self.pub_w.device, self.words.device[SEQ:SEQ + 1], self.ring(layer, grp, G), stream)
        moe.shared_expert(x, raws[0][0], raws[1][0], raws[2][0], raws[3][0], [r[1] for r in raws],
                          out=b["shared"][rows], scratch=moe.SharedScratch(b["sh_h"], b["sh_sg"]), split=split_k(b),
                          stream=stream, sg=sg)
        j0, J = r0 * K, n * K
        groups = (b["tier_vg_expert"][j0:j0 + J], b["tier_vg_count"][j0:j0 + J], b["tier_vg_entries"][j0:j0 + J])
        tl.group_resident(b["route_ids"], j0, J, b["tier_table"][layer], self.E, *groups, stream)
        arrays, n_slots = self.resident[layer]
        if self.has_slots[layer]:
            tl.swiglu_experts(*arrays, n_slots, groups, J, n, b["mixed"], K, b["moe_h"], b["moe_parts"], stream)

    def post(self, layer: int, grp: int, r0: int, n: int, G: int, stream) -> None:
        """Wait for the host's shares of rows [r0, r0+n), run the PCIe share, combine into block_out."""
        from .window import copy_async

        b, K = self.buf, self.K
        ring = self.ring(layer, grp, G)
        step = ring - 1
        words, err = self.words.device, self.words.device[ERR:ERR + 1]
        plan_dev, plan_host = b["tier_plan"][grp], self.plan.device[grp]
        J = n * K
        kind = self.cfg.wait
        if self.pcie:
            if self.launch_gate is not None:
                self.launch_gate(ring)
            tl.wait_word(words[FLAG_B:FLAG_B + 1], ring, err, self.wait_code(step, WAIT_B), self.timeout_ns,
                         self.wait_ns.device[step, WAIT_B:WAIT_B + 1], stream, kind)
            copy_async(plan_dev, plan_host, self.plan_words * 4, stream)
            JM = self.JM
            pg = (plan_dev[JM:JM + J], plan_dev[2 * JM:2 * JM + J],
                  plan_dev[3 * JM:].reshape(JM, GEMV_MAXT)[:J])
            tl.swiglu_experts(*self.staged(layer, grp), self.Q, pg, J, n, b["mixed"], K, b["moe_h"], b["moe_parts"],
                              stream)
            tl.wait_word(words[FLAG:FLAG + 1], ring, err, self.wait_code(step, WAIT_FLAG), self.timeout_ns,
                         self.wait_ns.device[step, WAIT_FLAG:WAIT_FLAG + 1], stream, kind)
        else:
            tl.wait_word(words[FLAG:FLAG + 1], ring, err, self.wait_code(step, WAIT_FLAG), self.timeout_ns,
                         self.wait_ns.device[step, WAIT_FLAG:WAIT_FLAG + 1], stream, kind)
            copy_async(plan_dev, plan_host, self.JM * 4, stream)  # src[] only
        tl.combine(b["moe_parts"], self.ymiss.device, plan_dev[:self.JM], b["route_w"], b["shared"], b["block_out"],
                   r0, n, stream)

    def measure_copy_path(self, repeats: int = 3) -> tuple[float, int]:
        """The PCIe share's copy as a step runs it: up to Q stored experts of the engine's first layer DMA'd from the
        page-locked store into group 0's device staging slots on the copy stream, one copy an expert and projection
        (tiers/host.py); the best of `repeats`. Returns (DMA GB/s, bytes per run). Call after bind()."""
        rt = cudart()
        layer = self.steps.lo
        experts = np.flatnonzero(self.store.slot[layer] >= 0)[:self.Q]
        stream = self.copy_stream.ptr
        start, end = check(rt.cudaEventCreate(), "cudaEventCreate"), check(rt.cudaEventCreate(), "cudaEventCreate")
        best = None
        try:
            for _ in range(max(1, repeats)):
                check(rt.cudaEventRecord(start, stream), "cudaEventRecord")
                self.issue_copies(layer, 0, experts)
                check(rt.cudaEventRecord(end, stream), "cudaEventRecord")
                check(rt.cudaEventSynchronize(end), "cudaEventSynchronize")
                dma_s = check(rt.cudaEventElapsedTime(start, end), "cudaEventElapsedTime") / 1e3
                best = dma_s if best is None else min(best, dma_s)
        finally:
            for event in (start, end):
                check(rt.cudaEventDestroy(event), "cudaEventDestroy")
        nbytes = len(experts) * sum(self.expert_bytes[layer])
        return (nbytes / 1e9 / best if best and best > 0 else float("inf")), nbytes

    def issue_copies(self, layer: int, grp: int, experts: np.ndarray, phase=None) -> None:
        """The DMAs of a step's PCIe experts (staging slot q = position q) from the page-locked store into group
        grp's device staging slots, on the copy stream: one copy an expert and projection. phase(text): what is
        being issued (the copy thread's timeout line)."""
        rt = cudart()
        kind = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        stream = self.copy_stream.ptr
        for p, srcs in enumerate(self.store.addresses(layer, experts)):
            nbytes = self.expert_bytes[layer][p]
            dst = self.buf[f"tier_stage.{grp}.{p}"].data.ptr
            if phase is not None:
                phase(f"cudaMemcpyAsync of layer {layer}'s {len(srcs)} {PROJ[p]} experts ({nbytes} bytes each)")
            for q, src in enumerate(srcs.tolist()):
                check(rt.cudaMemcpyAsync(dst + q * nbytes, src, nbytes, kind, stream), "cudaMemcpyAsync")

    def drop_pcie(self) -> None:
        """No PCIe share after all (rebalance_share chose 0 before any window was recorded): the pinned staging
        freed, post() records the CPU-only waits."""
        if self.store is not None:
            self.store.close()
            self.store = None
        self.pcie = False

    def close(self) -> None:
        """Free the mapped buffers, the page-locked store, an adaptive cache's staging buffer now (the engine's
        close(); idempotent)."""
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.fill is not None:
            self.fill.device.free()
        for buf in (self.pub_x, self.pub_ids, self.pub_w, self.words, self.ymiss, self.plan, self.wait_ns):
            buf.free()
        self.resident = self.buf = None  # the resident experts and arena views: device memory back to the pool


def rebalance_share(engine) -> None:
    """--pcie-frac auto with a share > 0 at setup, once the engine's buffers exist (after bind, before the warm-up
    window): the copy path measured (ExpertTiers.measure_copy_path: the DMA from the page-locked store), the share
    chosen again on those and the pool's rate from setup (tiers/share.py), the tier note's PCIe
    part rewritten to say so. A share that falls to 0 here drops the PCIe path before anything is recorded (the
    graph waits for no flagB, no copy thread, the store unregistered; the device staging slots stay allocated). No-op for a given share or
    no PCIe share."""
    import dataclasses

    from ...tiers.share import AUTO, ShareRates, auto_window_bytes, resolve_pcie_frac

    t = engine.tiers
    if t is None or not t.pcie or not t.cfg.share_auto:
        return
    cfg = t.cfg
    window_bytes = auto_window_bytes(engine.model, engine.layers)
    _, before = resolve_pcie_frac(AUTO, cfg.rates, window_bytes)
    phase = getattr(engine, "load_phase", None) or (lambda text: timed_phase(text, quiet=True))
    with phase("PCIe copy path measured") as done:
        dma_gbs, nbytes = t.measure_copy_path()
        rates = ShareRates(cfg.rates.pool_gbs, dma_gbs, dma_measured=True)
        frac, note = resolve_pcie_frac(AUTO, rates, window_bytes)
        done["what"] = (f"PCIe copy path measured (DMA {dma_gbs:.1f} GB/s from the page-locked store, on "
                        f"{nbytes / 2**20:.0f} MiB; share {cfg.pcie_frac:g} -> {frac:g})")
    t.cfg = dataclasses.replace(cfg, pcie_frac=frac, rates=rates)
    if frac == 0.0:
        staging = sum(t.Q * t.most_bytes(p) for p in range(3)) * t.G
        t.drop_pcie()
        if getattr(engine, "tier_host", None) is not None:
            engine.tier_host.drop_copier()
        note += f"; its device staging slots stay allocated ({staging / 2**20:.0f} MiB)"
    if engine.tier_note and before in engine.tier_note:
        engine.tier_note = engine.tier_note.replace(before, note, 1)


def attach_tiers(engine, table: np.ndarray, cfg: TierConfig, pack_q8: bool) -> None:
    """Upload the resident experts, add the tier buffers to the engine's arena (before it is allocated) and make
    the host server; engine.tiers.bind(buf) follows the allocation."""
    from ...tiers.host import TierHost
    from ...tiers.prefault import prefault_experts

    engine.tiers = ExpertTiers(engine, table, cfg, pack_q8)
    if cfg.policy != "static":
        engine.tier_note = (f"{engine.tier_note}; --expert-policy {cfg.policy}: the slots change between windows, "
                            f"at most {cfg.max_copy / 2**20:.0f} MiB copied per window")
    # the CPU / PCIe shares read these pages (the engine's layers' only): no window faults them
    prefault_experts(model=engine.model, table=table, layers=engine.layers)
    engine.tiers.add_buffers(engine.arena)
    phase = getattr(engine, "load_phase", None) or (lambda text: timed_phase(text, quiet=True))
    with phase("CPU expert pool ready") as done:  # the pool's C kernels build on first use (seconds, once)
        engine.tier_host = TierHost(engine.tiers, engine, cfg.stall_window)
        done["what"] = f"CPU expert pool ready ({engine.tier_host.src.pool.backend})"
