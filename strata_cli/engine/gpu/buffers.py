"""Every buffer a window or commit touches, carved from one device arena before any capture.

Window buffers hold max_t rows; a window of T rows uses the leading [:T] views, so one set of buffers (and one
commit graph) serves every T. Launcher workspaces (split-K partials and tile counters, argmax partials) come from
the arena too: each engine owns its own, so engines on different streams never share one. Inputs are staged by the
host in mapped pinned memory and copied in by the graph.
"""

from __future__ import annotations

import numpy as np

from ...errors import InputError
from ...gpu.launch_gemv import ZSPLIT_TILES, SplitK
from ...gpu.launch_ple import sync_words
from ...gpu.launch_sampling import ARGMAX_MAX_PARTS, ArgmaxScratch
from ...gpu.launch_util import GEMV_MAXT, GEMV_PARTIAL_FLOATS
from ...gpu.runtime import MappedBuffer, cupy
from ...ops.hyper import DN_ROW_GROUP
from ..stage_timing import n_slots

ALIGN = 256


def _aligned_bytes(shape, dtype) -> int:
    return -(-max(int(np.prod(shape)) * dtype.itemsize, 1) // ALIGN) * ALIGN


class Arena:
    """Collect named buffer shapes, then allocate once and hand out views (no allocation after `allocate`)."""

    def __init__(self):
        self.specs: list[tuple[str, tuple, np.dtype]] = []
        self.views: dict[str, object] = {}
        self.nbytes = 0

    def add(self, name: str, shape, dtype=np.float32) -> None:
        self.specs.append((name, tuple(int(s) for s in shape), np.dtype(dtype)))

    def planned_bytes(self) -> int:
        """What allocate() will take for the buffers added so far."""
        return sum(_aligned_bytes(shape, dtype) for _, shape, dtype in self.specs)

    def allocate(self) -> dict:
        """Views of one zeroed allocation (zero matters: the split-K tile counters must start at zero)."""
        cp = cupy()
        offsets, total = [], 0
        for _, shape, dtype in self.specs:
            offsets.append(total)
            total += _aligned_bytes(shape, dtype)
        free, _ = cp.cuda.runtime.memGetInfo()
        if total > free:  # refuse in one line rather than die in cupy's OutOfMemoryError
            raise InputError(f"the GPU arena (KV cache and window buffers for this --ctx) needs "
                             f"{total / 2**30:.2f} GiB, the device has {free / 2**30:.2f} GiB free "
                             "(give a smaller --ctx)")
        self.base = cp.zeros(max(total, ALIGN), dtype=cp.uint8)
        self.nbytes = total
        for (name, shape, dtype), off in zip(self.specs, offsets):
            self.views[name] = cp.ndarray(shape, dtype, memptr=self.base.data + off)
        return self.views


class Staging:
    """Mapped pinned host memory: what the host writes per window and what it reads back. The commit graph reads
    n_keep (and nothing else here) when it runs, after commit() returned: GPUEngine.launch_commit writes it only
    once the last commit's commit_done event has passed."""

    def __init__(self, max_t: int):
        self.tokens = MappedBuffer((max_t,), np.int64)
        self.positions = MappedBuffer((max_t,), np.int32)
        self.n_keep = MappedBuffer((1,), np.int32)
        self.out_ids = MappedBuffer((max_t,), np.int32)
        self.out_nonfinite = MappedBuffer((max_t,), np.int32)  # written by the head's argmax kernel directly


def plan_buffers(g, n_ctx: int, M: int, layers: tuple[int, int] | None = None) -> Arena:
    """Shapes of every state and window buffer for geometry g, context n_ctx and windows of up to M rows; layers
    [lo, hi): a stage of the layer split (engine/gpu/layer_split.py), holding the state of those layers only."""
    lo, hi = layers if layers is not None else (0, g.n_layers)
    gdn_layers = [layer for layer in g.gdn_layers if lo <= layer < hi]
    attn_layers = [layer for layer in g.attn_layers if lo <= layer < hi]
    a = Arena()
    C, D, E, K = g.hc, g.n_embd, g.n_expert, g.n_expert_used
    a.add("tokens", (M,), np.int64)
    a.add("positions", (M,), np.int32)
    a.add("n_keep", (1,), np.int32)
    a.add("ids", (M,), np.int32)
    a.add("stamps", (n_slots(g.n_layers),), np.uint64)  # the profiling graph's stage stamps (ns)
    for name, shape in [("R", (M, C, D)), ("emb", (M, D)), ("mixed", (M, D)), ("inj", (M, C)),
                        ("block_out", (M, D)), ("hc_xn", (M, C * D)),
                        ("hc_dn", (M, -(-(g.hc_lowrank + C) // DN_ROW_GROUP) * DN_ROW_GROUP)), ("router", (M, E)),
                        ("route_w", (M, K)), ("route_w1", (M, K + 1)),
                        # entries of a row: its K routed experts, and the shared expert where it runs as one more
                        ("moe_h", (M * (K + 1), g.n_ff_exp)), ("moe_parts", (M * (K + 1), D)), ("shared", (M, D)),
                        ("sh_h", (M, g.n_ff_shexp)), ("sh_sg", (M, 1)), ("logits", (M, g.n_vocab))]:
        a.add(name, shape)
    a.add("route_ids", (M, K), np.int32)
    a.add("route_ids1", (M, K + 1), np.int32)  # ids with the shared expert's (DeviceWeights.shared_expert_id)
    a.add("moe_gexp", (M * (K + 1),), np.int32)
    a.add("moe_gcnt", (M * (K + 1),), np.int32)
    a.add("moe_gent", (M * (K + 1), GEMV_MAXT), np.int32)  # entries of each expert group
    a.add("route_done", (1,), np.uint32)  # router_topk's arrival counter (zero between launches)
    a.add("gemv_partial", (GEMV_PARTIAL_FLOATS,))
    a.add("gemv_tiles", (ZSPLIT_TILES,), np.uint32)
    a.add("argmax_values", (GEMV_MAXT * ARGMAX_MAX_PARTS,))
    a.add("argmax_ids", (GEMV_MAXT * ARGMAX_MAX_PARTS,), np.int32)
    a.add("argmax_bad", (GEMV_MAXT * ARGMAX_MAX_PARTS,), np.int32)
    a.add("argmax_row_bad", (GEMV_MAXT,), np.int32)
    if g.gdn_layers:
        nv, nk, dk, dv = g.ssm_nv, g.ssm_nk, g.ssm_dk, g.ssm_dv
        for name, shape in [("gdn_alpha", (M, nv)), ("gdn_beta_in", (M, nv)), ("gdn_z", (M, nv * dv)),
                            ("gdn_y", (M, nv, dv))]:
            a.add(name, shape)
        for layer in gdn_layers:  # state, and what the window keeps for the commit
            for name, shape in [("S", (nv, dk, dv)), ("conv", (g.conv_kernel - 1, g.conv_dim)),
                                ("qkv", (M, g.conv_dim + nv * dv)),  # [qkv | z]: one GEMV's rows (window.qkv_rows)
                                ("q", (M, nk, dk)), ("k", (M, nk, dk)),
                                ("v", (M, nv, dv)), ("g", (M, nv)), ("beta", (M, nv))]:
                a.add(f"{name}.{layer}", shape)
    if g.attn_layers:
        H, Hk, d = g.n_head, g.n_head_kv, g.head_dim
        for name, shape in [("qa_k", (M, Hk * d)), ("qa_v", (M, Hk * d)),
                            ("qa_qg", (M, H * 2 * d)), ("qa_att", (M, H * d)),
                            ("qi_raw", (M, max(g.idx_heads, 1) * max(g.idx_dim, 1))),
                            # [k | v | q | indexer q | indexer k]: one GEMV's rows (window._qsa_projections)
                            ("qa_kvq", (M, 2 * Hk * d + H * 2 * d + (max(g.idx_heads, 1) + 1) * max(g.idx_dim, 1))),
                            ("cos", (n_ctx, g.n_rot)), ("sin", (n_ctx, g.n_rot))]:
            a.add(name, shape)
        ratios = [g.compress_ratios[layer] for layer in g.attn_layers if g.compress_ratios[layer]]
        if ratios:
            from ...gpu.launch_qsa import cell_capacity

            nb = n_ctx // min(ratios) + 1
            cap = max(cell_capacity(r, g.idx_budget) for r in ratios)
            for name, shape, dtype in [("scores", (M, nb), np.float32), ("sel_keys", (M, nb), np.uint32),
                                       ("sel_idx", (M, nb), np.int32), ("sel_flags", (M, nb), np.int32),
                                       # qsa_mix's counters (launch_qsa.SelectScratch): zero (the arena is), and
                                       # zero again after every launch
                                       ("sel_done", (M,), np.int32), ("sel_ready", (M,), np.int32),
                                       ("sel_seen", (M,), np.int32), ("sel_ticket", (1,), np.int32),
                                       ("cells", (M, cap), np.int32), ("counts", (M,), np.int32)]:
                a.add(name, shape, dtype)
        for layer in attn_layers:
            a.add(f"kc.{layer}", (n_ctx, Hk, d))
            a.add(f"vc.{layer}", (n_ctx, Hk, d))
            ratio = g.compress_ratios[layer]
            if ratio:
                for name, shape in [("tail", (ratio, g.idx_dim)), ("pooled", (n_ctx // ratio + 1, g.idx_dim)),
                                    ("idx_raw", (M, g.idx_dim))]:
                    a.add(f"{name}.{layer}", shape)
    if g.ple is not None and lo <= g.ple.layer < hi:
        p = g.ple
        a.add("ple_rows", (M, p.n_heads), np.int64)
        a.add("ple_prev", (p.ngram_size - 1,), np.int64)
        for name, n in [("ple_mult", p.ngram_size), ("ple_sizes", p.n_heads), ("ple_offsets", p.n_heads)]:
            a.add(name, (n,), np.int64)  # the n-gram hash constants (PLEGeometry.hash_arrays)
        for name, shape in [("ple_emb", (M, p.embed_dim)), ("ple_key", (M, C * D + D)), ("ple_value", (M, D)),
                            ("ple_normed", (M, C * D)), ("ple_history", (p.history, C * D))]:
            a.add(name, shape)
        # ple_mix_norm's arrival counter and a flag a block: zero (the arena is), and zero again after every launch
        a.add("ple_sync", (sync_words(M, C),), np.uint32)
    return a


def split_k(buf: dict) -> SplitK:
    """The engine's split-K workspace (launch_gemv.SplitK) in its arena."""
    return SplitK(buf["gemv_partial"], buf["gemv_tiles"])


def argmax_scratch(buf: dict) -> ArgmaxScratch:
    return ArgmaxScratch(buf["argmax_values"], buf["argmax_ids"], buf["argmax_bad"], buf["argmax_row_bad"])
