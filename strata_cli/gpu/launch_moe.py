"""CuPy launchers of kernels/moe.cu (router, combine) and the expert GEMVs of kernels/gemv.cu.

References with the same signatures: strata_cli/ops/moe.py (router_topk, routed_experts_raw,
shared_expert_raw). Same conventions as launch_gemv: CuPy arrays, f32 / int32,
C-contiguous, `out=` and scratch preallocated for graph capture, `stream=` None for the current stream.

Legend: T window rows, E experts, K experts per row, J = T*K (row, slot) entries, F expert width, D hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import quants
from . import compile as nvrtc
from . import launch_quant
from . import launch_util as U
from .launch_gemv import SplitK, gateup_fuses, launch_gemv, launch_q8r_gateup
from .runtime import empty


FLOAT_GATEUP = (quants.F32, quants.F16, quants.BF16)  # kernels/gemv.cu gemv_gateup_<type>_t<NT>
SG_TYPES = (quants.F32, quants.F16, quants.BF16, quants.Q8_0)  # scalar gates router_topk decodes (raw_at)


def router_topk(logits, k: int, out_ids=None, out_w=None, stream=None, groups=None, done=None, scalar_gate=None):
    """logits [T, E] -> ids [T, k] int32 (descending probability, ties -> lower id), weights [T, k] summing to 1.

    groups = (g_expert [J], g_count [J], g_entries [J, GEMV_MAXT]) int32 (J = T*k, or more rows): the same launch
    also groups the entries by expert as group_entries does (routed_experts(grouped=True) then skips it); done: a
    uint32 [1] counter that starts at zero (the launch leaves it at zero). scalar_gate = (x [T, D], raw [D] row of a
    type in SG_TYPES, type, sg [T, 1]): the same launch writes the shared expert's gate sg = sigmoid(w . x) (then
    shared_expert(sg=sg) skips its scalar-gate GEMV)."""
    with U.on_stream(stream):
        U.check_array("logits", logits, np.float32, (None, None))
        T, E = logits.shape
        if not 1 <= k <= min(E, U.ROUTER_MAXK):
            raise ValueError(f"k: {k} outside 1..{min(E, U.ROUTER_MAXK)} (E = {E}, kernel limit {U.ROUTER_MAXK})")
        if E > U.ROUTER_MAX_E:
            raise ValueError(f"logits: {E} experts exceed the router kernel's {U.ROUTER_MAX_E}")
        J = T * k
        g_args = (U.null_or(None),) * 3 + (np.int32(0), U.null_or(None))
        if groups is not None:
            if J > U.BLOCK:
                raise ValueError(f"logits: {J} (row, slot) entries exceed the router's {U.BLOCK} grouping threads")
            U.check_array("done", done, np.uint32, (1,))
            g_args = (*_group_buffers(MoeScratch(None, None, *groups), J), np.int32(U.GEMV_MAXT), done)
        sg_args = (U.null_or(None), np.int32(0), U.null_or(None), np.int32(0), U.null_or(None))
        if scalar_gate is not None:
            x, sg_raw, sg_type, sg = scalar_gate
            U.check_array("x", x, np.float32, (T, None))
            if sg_type not in SG_TYPES:
                raise ValueError(f"scalar_gate: type {U.type_name(sg_type)} is not one of F32, F16, BF16, Q8_0 "
                                 "(router_topk decodes only these)")
            U.weight_rows("scalar_gate raw", sg_raw, sg_type, x.shape[1], n_out=1)
            U.check_array("sg", sg, np.float32, (T, 1))
            sg_args = (x, np.int32(x.shape[1]), sg_raw, np.int32(sg_type), sg)
        out_ids = U.out_array("out_ids", out_ids, (T, k), np.int32, empty)
        out_w = U.out_array("out_w", out_w, (T, k), np.float32, empty)
        smem = 4 * max(E, J + U.BLOCK) if groups is not None else 4 * E
        nvrtc.kernel("moe", "router_topk")((T, 1, 1), (U.BLOCK, 1, 1), (
            logits, np.int32(E), np.int32(k), out_ids, out_w, *g_args, *sg_args), shared_mem=smem)
    return out_ids, out_w


ROUTER_FUSED_MAX_E = 1024  # kernels/moe.cu ROUTER_EJ * 32: router_gemv_topk's last block holds a row's logits in
# registers, 32 a lane, and each of its warps with a row a row of p of this many floats in shared memory
ROUTER_EPB = 2  # kernels/moe.cu: expert rows per router_gemv_topk block (4 warps each)
# router_gemv_topk's blocks that compute only the shared gate (the first ones, before the GEMV's): beside the GEMV's
# loads, not after one GEMV block's (it would arrive last by the gate's round trip and hold up the top-k); with
# E = 512 the 256 GEMV blocks and up to 8 of these fill the H200's 132 SMs x 2 resident blocks
ROUTER_GATE_BLOCKS = 8
ROUTER_FUSED_TYPES = (quants.F32,)  # the routers of the converter's files (kept F32 at every --outtype)


def router_fused_smem(T: int) -> int:
    """router_gemv_topk's dynamic shared memory in bytes: the last block's rows of p, one per warp with a row of the
    T (ROUTER_FUSED_MAX_E floats each); the grouping's J <= 256 ids and 256 leader flags reuse the first."""
    return 4 * min(T, U.GEMV_WARPS) * ROUTER_FUSED_MAX_E


def router_fuses(router_type: int, E: int) -> bool:
    """Whether router_gemv_topk takes a router of this type and expert count (else a GEMV, then router_topk)."""
    return router_type in ROUTER_FUSED_TYPES and E <= ROUTER_FUSED_MAX_E


def router_gemv_topk(x, router_raw, router_type: int, k: int, groups, done, out_logits=None, out_ids=None,
                     out_w=None, scalar_gate=None, shared_id: int | None = None, stream=None):
    """x [T, n_in] -> (ids [T, k], weights [T, k]) as router_topk(x @ W^T) does, in one launch (kernels/moe.cu
    router_gemv_topk): the router's GEMV (its logits [T, E] also written), the top-k and, with groups = (g_expert,
    g_count, g_entries) and done (a zeroed uint32 [1]), the grouping of the entries by expert. router_raw [E, n_in]
    of a type in ROUTER_FUSED_TYPES with E <= ROUTER_FUSED_MAX_E (router_fuses). scalar_gate = (raw [n_in] row of a
    type in SG_TYPES, type, sg [T, 1]): the shared expert's gate sigmoid(w . x) written too. shared_id (with
    scalar_gate): the shared expert runs as expert shared_id of the routed launches: ids and weights [T, k + 1],
    slot k = (shared_id, sg), grouped with the routed entries."""
    with U.on_stream(stream):
        U.check_array("x", x, np.float32, (None, None))
        T, n_in = x.shape
        if T > U.GEMV_MAXT:
            raise ValueError(f"x: {T} rows exceed router_gemv_topk's {U.GEMV_MAXT}")
        E = U.weight_rows("router_raw", router_raw, router_type, n_in)
        if not router_fuses(router_type, E):
            raise ValueError(f"router_raw: {E} experts of type {U.type_name(router_type)}: router_gemv_topk takes "
                             f"F32 routers of at most {ROUTER_FUSED_MAX_E} experts (GEMV + router_topk otherwise)")
        if not 1 <= k <= min(E, U.ROUTER_MAXK):
            raise ValueError(f"k: {k} outside 1..{min(E, U.ROUTER_MAXK)} (E = {E}, kernel limit {U.ROUTER_MAXK})")
        slots = k + (shared_id is not None)
        if shared_id is not None and scalar_gate is None:
            raise ValueError("shared_id: given without scalar_gate (slot k's weight is the shared expert's gate)")
        J = T * slots
        if J > U.BLOCK:
            raise ValueError(f"x: {J} (row, slot) entries exceed the router's {U.BLOCK} grouping threads")
        U.check_array("done", done, np.uint32, (1,))
        g_args = _group_buffers(MoeScratch(None, None, *groups), J)
        sg_args = (U.null_or(None), np.int32(0), U.null_or(None))
        if scalar_gate is not None:
            sg_raw, sg_type, sg = scalar_gate
            if sg_type not in SG_TYPES:
                raise ValueError(f"scalar_gate: type {U.type_name(sg_type)} is not one of F32, F16, BF16, Q8_0 "
                                 "(router_gemv_topk decodes only these)")
            U.weight_rows("scalar_gate raw", sg_raw, sg_type, n_in, n_out=1)
            U.check_array("sg", sg, np.float32, (T, 1))
            sg_args = (sg_raw, np.int32(sg_type), sg)
        out_logits = U.out_array("out_logits", out_logits, (T, E), np.float32, empty)
        out_ids = U.out_array("out_ids", out_ids, (T, slots), np.int32, empty)
        out_w = U.out_array("out_w", out_w, (T, slots), np.float32, empty)
        gate_blocks = min(T, ROUTER_GATE_BLOCKS) if scalar_gate is not None else 0
        nvrtc.kernel("moe", "router_gemv_topk")((gate_blocks - (-E // ROUTER_EPB), 1, 1), (U.BLOCK, 1, 1), (
            router_raw, x, np.int32(n_in), np.int32(T), out_logits, np.int32(E), np.int32(k),
            np.int32(-1 if shared_id is None else shared_id), out_ids, out_w,
            *g_args, np.int32(U.GEMV_MAXT), done, *sg_args), shared_mem=router_fused_smem(T))
    return out_ids, out_w


def launch_expert_gemv(w, ggml_type, expert_stride, n_expert, groups, n_groups, T, x, x_div, n_in, y, *,
                       act=U.ACT_NONE, mul=None, mul_strides=(0, 0)) -> None:
    """y [*, n_out]: entry j of each of the n_groups groups = its group's expert applied to x row j // x_div, each
    expert's rows read once for all its entries (groups from moe_group or tier_group; T >= the entries of any
    group); arguments already checked."""
    if launch_quant.handles(ggml_type):  # K-quants, i-quants, ...: kernels/gemv_quant.cu
        launch_quant.launch_expert_gemv_quant(w, ggml_type, expert_stride, n_expert, groups, n_groups, T, x, x_div,
                                              n_in, y, act=act, mul=mul, mul_strides=mul_strides)
        return
    J, n_out = n_groups, y.shape[1]
    g_expert, g_count, g_entries = groups
    epilogue = (np.int32(act), np.float32(1.0), U.null_or(mul), np.int32(mul_strides[0]), np.int32(mul_strides[1]))
    if ggml_type == U.Q8_0_R32:
        U.check_vector_rows("x", x)
        # mma.sync where the window's dense GEMVs take it (launch_util.WINDOW_PATHS), else CUDA cores
        tc = U.q8r_tensor_cores(T)
        rpw = U.Q8R_GROUP * U.Q8T_LANE_ROWS if tc else U.q8r_rows_per_warp(T)
        ksplit, _ = U.q8r_split(n_out, n_in, T, n_matrices=J, rpw=rpw)
        grid, block = U.expert_grid(n_out, J, ksplit, rpw=rpw)
        nvrtc.kernel("gemv_q8r", f"gemv_expert_q8r_{'tc_' if tc else ''}t{U.nt_bucket(T)}")(grid, block, (
            w, np.int64(expert_stride), np.int32(n_expert), g_expert, g_count, g_entries, x, np.int32(x_div),
            np.int32(n_in), y, np.int32(n_out), np.int32(ksplit), *epilogue))
        return
    ksplit = U.gemv_ksplit(n_out, n_in, J)
    grid, block = U.expert_grid(n_out, J, ksplit)
    suffix = U.TYPE_SUFFIX[ggml_type]
    nvrtc.kernel(f"gemv.{suffix}", f"gemv_expert_{suffix}_t{U.nt_bucket(T)}")(grid, block, (
        w, np.int64(expert_stride), np.int64(U.row_stride(ggml_type, n_in)), np.int32(n_expert), g_expert, g_count,
        g_entries, x, np.int32(x_div), np.int32(n_in), y, np.int32(n_out), np.int32(ksplit), *epilogue))


def launch_gateup_experts(gate, up, n_expert, groups, n_groups, T, x, K, h) -> None:
    """h[j] = silu(gate_e . x[j // K]) * (up_e . x[j // K]) for the groups' entries; gate / up = (raw [E, F, D],
    type, expert stride); arguments already checked. Gate and up of one type and stride are one launch that reads
    both (block types: launch_quant.launch_gateup_quant; Q8_0_R32: gemv_q8r_gateup_t<NT>; F32 / F16 / BF16:
    gemv.cu gemv_gateup_<type>_t<NT>), else two."""
    (gw, gt, gs), (uw, ut, us) = gate, up
    D, F = x.shape[1], h.shape[1]
    if gt == ut and gs == us and launch_quant.handles(gt):
        launch_quant.launch_gateup_quant(gw, uw, gt, gs, n_expert, groups, n_groups, T, x, K, D, h)
        return
    if gt == ut == U.Q8_0_R32 and gs == us:  # kernels/gemv_q8r.cu gemv_q8r_gateup_t<NT>
        U.check_vector_rows("x", x)
        rpw = U.Q8R_GROUP * U.Q8R_GATEUP_ROWS[U.nt_bucket(T)]
        ksplit, _ = U.q8r_split(F, D, T, n_matrices=n_groups, rpw=rpw)
        grid, block = U.expert_grid(F, n_groups, ksplit, rpw=rpw)
        nvrtc.kernel("gemv_q8r", f"gemv_q8r_gateup_t{U.nt_bucket(T)}")(grid, block, (
            gw, uw, np.int64(gs), np.int32(n_expert), *groups, x, np.int32(K), np.int32(D), h, np.int32(F),
            np.int32(ksplit)))
        return
    if gt == ut and gs == us and gt in FLOAT_GATEUP:  # kernels/gemv.cu gemv_gateup_<type>_t<NT>
        ksplit = U.gemv_ksplit(F, D, n_groups)  # a launch per matrix's split: the same sums, bit for bit
        grid, block = U.expert_grid(F, n_groups, ksplit)
        suffix = U.TYPE_SUFFIX[gt]
        nvrtc.kernel(f"gemv.{suffix}", f"gemv_gateup_{suffix}_t{U.nt_bucket(T)}")(grid, block, (
            gw, uw, np.int64(gs), np.int64(U.row_stride(gt, D)), np.int32(n_expert), *groups, x, np.int32(K),
            np.int32(D), h, np.int32(F), np.int32(ksplit)))
        return
    # mixed types or strides, raw Q8_0: up, then gate with silu(gate) * up as its epilogue
    launch_expert_gemv(uw, ut, us, n_expert, groups, n_groups, T, x, K, D, h)
    launch_expert_gemv(gw, gt, gs, n_expert, groups, n_groups, T, x, K, D, h, act=U.ACT_SILU, mul=h,
                       mul_strides=(F, 1))


def launch_swiglu_experts(gate, up, down, n_expert, groups, n_groups, T, x, K, h, parts) -> None:
    """parts[j] = down_e . h[j] after launch_gateup_experts (unweighted); down = (raw [E, D, F], type, expert
    stride); h [*, F] and parts [*, D] entry rows; arguments already checked."""
    launch_gateup_experts(gate, up, n_expert, groups, n_groups, T, x, K, h)
    dw, dt, ds = down
    launch_expert_gemv(dw, dt, ds, n_expert, groups, n_groups, T, h, 1, h.shape[1], parts)


@dataclass
class MoeScratch:
    """Intermediates of routed_experts: h [J, F] (up, then silu(gate) * up), parts [J, D], and the grouping of the
    entries by expert: g_expert [J], g_count [J], g_entries [J, GEMV_MAXT] (int32); may hold more rows."""

    h: object
    parts: object
    g_expert: object = None
    g_count: object = None
    g_entries: object = None

    @classmethod
    def empty(cls, J: int, F: int, D: int) -> "MoeScratch":
        return cls(empty((J, F), np.float32), empty((J, D), np.float32), empty((J,), np.int32),
                   empty((J,), np.int32), empty((J, U.GEMV_MAXT), np.int32))


def _group_buffers(s: MoeScratch, J: int):
    if J > 1024:
        raise ValueError(f"ids: {J} (row, slot) entries exceed moe_group's 1024")
    out = []
    for name, buf, tail in (("g_expert", s.g_expert, ()), ("g_count", s.g_count, ()),
                            ("g_entries", s.g_entries, (U.GEMV_MAXT,))):
        if buf is None:
            buf = empty((J, *tail), np.int32)
        U.check_array(f"scratch.{name}", buf, np.int32, (None, *tail))
        if buf.shape[0] < J:
            raise ValueError(f"scratch.{name}: {buf.shape[0]} rows, the window needs {J}")
        out.append(buf[:J])
    return out


def group_entries(ids, J: int, groups) -> None:
    """moe_group: the J (row, slot) entries of ids [T, K] grouped by expert into groups = (g_expert [J], g_count
    [J], g_entries [J, GEMV_MAXT]) (checked by the caller)."""
    nvrtc.kernel("moe", "moe_group")((1, 1, 1), (max(32, -(-J // 32) * 32), 1, 1), (
        ids, np.int32(J), np.int32(U.GEMV_MAXT), *groups))


def _check_types(name: str, ggml_types, n: int) -> tuple[int, ...]:
    types = tuple(ggml_types)
    if len(types) != n:
        raise ValueError(f"{name}: {len(types)} types, expected {n}")
    return tuple(U.check_type(name, t) for t in types)


def routed_parts(x, ids, weights, gate_raw, up_raw, down_raw, ggml_types, scratch: MoeScratch | None = None,
                 stream=None, grouped: bool = False):
    """parts [J, D]: entry j = t*K + k holds expert_{ids[t, k]}(x[t]), unweighted (routed_experts without its
    combine; the window's next hyper-connection read combines them: launch_hyper.CombineWrite).

    x [T, D]; ids [T, K] int32; weights [T, K] f32 (checked for the combine); gate_raw, up_raw [E, F, D] and
    down_raw [E, D, F] raw tensors in numpy order; ggml_types = (gate, up, down). grouped: scratch's g_expert /
    g_count / g_entries already hold the grouping of ids (router_topk(groups=) made it in the same stream)."""
    gt, ut, dt = _check_types("ggml_types", ggml_types, 3)
    with U.on_stream(stream):
        U.check_array("x", x, np.float32, (None, None))
        T, D = x.shape
        U.check_array("ids", ids, np.int32, (T, None))
        K = ids.shape[1]
        U.check_array("weights", weights, np.float32, (T, K))
        E, F, gate_stride = U.expert_geometry("gate_raw", gate_raw, gt, D)
        _, _, up_stride = U.expert_geometry("up_raw", up_raw, ut, D, n_out=F, n_expert=E)
        _, _, down_stride = U.expert_geometry("down_raw", down_raw, dt, F, n_out=D, n_expert=E)
        J = T * K
        if T > U.GEMV_MAXT:
            raise ValueError(f"x: {T} rows exceed {U.GEMV_MAXT} (an expert group holds at most that many entries)")
        s = scratch if scratch is not None else MoeScratch(None, None)
        h = U.scratch_rows("scratch.h", s.h, J, (F,), empty)
        parts = U.scratch_rows("scratch.parts", s.parts, J, (D,), empty)
        groups = _group_buffers(s, J)

        # group the entries by expert; entry j = t*K + k reads x row t = j // K; h and parts are indexed by entry
        if not grouped:
            group_entries(ids, J, groups)
        launch_swiglu_experts((gate_raw, gt, gate_stride), (up_raw, ut, up_stride), (down_raw, dt, down_stride), E,
                              groups, J, T, x, K, h, parts)
    return parts


def combine(parts, weights, shared=None, out=None, stream=None):
    """out [T, D] = sum_k weights[t, k] * parts[t*K + k] (+ shared [T, D]), in slot order (kernels/moe.cu
    moe_combine); parts [>= T*K, D]."""
    with U.on_stream(stream):
        U.check_array("weights", weights, np.float32, (None, None))
        T, K = weights.shape
        U.check_array("parts", parts, np.float32, (None, None))
        D = parts.shape[1]
        if parts.shape[0] < T * K:
            raise ValueError(f"parts: {parts.shape[0]} rows, the combine needs {T} x {K}")
        if shared is not None:
            U.check_array("shared", shared, np.float32, (T, D))
        out = U.out_array("out", out, (T, D), np.float32, empty)
        grid, block = U.elementwise_grid(T * D)
        nvrtc.kernel("moe", "moe_combine")(grid, block, (
            parts, weights, U.null_or(shared), out, np.int32(T), np.int32(K), np.int32(D)))
    return out


def routed_experts(x, ids, weights, gate_raw, up_raw, down_raw, ggml_types, out=None, shared=None,
                   scratch: MoeScratch | None = None, stream=None, mark=None, grouped: bool = False):
    """sum_k weights[t, k] * expert_{ids[t, k]}(x[t]) -> out [T, D] (+ shared [T, D] when given, fused):
    routed_parts, then combine. An id outside 0..E-1 turns its row's output NaN. mark("experts") is called before
    the combine launch (the profiling graph's stamps)."""
    parts = routed_parts(x, ids, weights, gate_raw, up_raw, down_raw, ggml_types, scratch=scratch, stream=stream,
                         grouped=grouped)
    if mark is not None:
        mark("experts")
    return combine(parts, weights, shared=shared, out=out, stream=stream)


@dataclass
class SharedScratch:
    """Intermediates of shared_expert: h [T, F], sg [T, 1] (the scalar gate); may hold more rows."""

    h: object
    sg: object

    @classmethod
    def empty(cls, T: int, F: int) -> "SharedScratch":
        return cls(empty((T, F), np.float32), empty((T, 1), np.float32))


def shared_expert(x, gate_raw, up_raw, down_raw, scalar_gate_raw, ggml_types, out=None,
                  scratch: SharedScratch | None = None, split: SplitK | None = None, stream=None, sg=None):
    """SwiGLU(x) * sigmoid(w_sg . x) -> out [T, D].

    x [T, D]; gate_raw, up_raw [F, D], down_raw [D, F], scalar_gate_raw [D] raw rows;
    ggml_types = (gate, up, down, scalar_gate). sg [T, 1]: the gate sigmoid(w_sg . x) already computed
    (router_topk(scalar_gate=)), so no scalar-gate GEMV is launched. Gate and up are one launch where
    launch_gemv.gateup_fuses says (Q8_0_R32 on the CUDA-core path), else up, then gate with silu(gate) * up as its
    epilogue; then down times sg."""
    gt, ut, dt, st = _check_types("ggml_types", ggml_types, 4)
    with U.on_stream(stream):
        U.check_array("x", x, np.float32, (None, None))
        T, D = x.shape
        F = U.weight_rows("gate_raw", gate_raw, gt, D)
        U.weight_rows("up_raw", up_raw, ut, D, n_out=F)
        U.weight_rows("down_raw", down_raw, dt, F, n_out=D)
        if sg is None:  # else scalar_gate_raw is not read (it may be None)
            U.weight_rows("scalar_gate_raw", scalar_gate_raw, st, D, n_out=1)
        s = scratch if scratch is not None else SharedScratch(None, None)
        h = U.scratch_rows("scratch.h", s.h, T, (F,), empty)
        given = sg is not None
        sg = U.check_array("sg", sg, np.float32, (T, 1)) if given else U.scratch_rows("scratch.sg", s.sg, T, (1,),
                                                                                      empty)
        out = U.out_array("out", out, (T, D), np.float32, empty)

        if gateup_fuses((gt, ut), T):  # one launch, the same bits as the two below
            launch_q8r_gateup(gate_raw, up_raw, D, x, h, split)
        else:
            launch_gemv(up_raw, ut, D, x, h, split)
            launch_gemv(gate_raw, gt, D, x, h, split, act=U.ACT_SILU, mul=h, mul_strides=(F, 1))
        if not given:
            launch_gemv(scalar_gate_raw, st, D, x, sg, split, act=U.ACT_SIGMOID)
        launch_gemv(down_raw, dt, F, h, out, split, mul=sg, mul_strides=(1, 0))  # out[t, :] *= sg[t]
    return out
