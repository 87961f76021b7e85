"""CuPy launchers of kernels/tiers.cu (doorbell, bounded waits, resident grouping, tiered combine) and the grouped
expert GEMVs of one token group over any expert array (VRAM slots or PCIe staging slots).

References: the host plan (strata_cli/tiers/host.py) and ops/moe.py; the GPU tests compare whole
windows against the all-resident engine. Arguments are preallocated CuPy arrays (graph capture allocates nothing);
mapped words are CuPy views of MappedBuffer.device. Waits come in two kinds: a spin kernel (one SM thread, bounded
by %globaltimer, writes the time it waited) or a captured cuStreamWaitValue32 node (no SM; bounded only by the
host's release, which writes 0xFFFFFFFF into every flag).

Legend: M window rows, rows [r0, r0 + T) of one token group, K experts per row, entry j = row*K + slot (global),
F expert width, D hidden, E experts (or slots) of the weight array.
"""

from __future__ import annotations

import numpy as np

from . import compile as nvrtc
from . import launch_util as U
from .launch_moe import launch_swiglu_experts
from .runtime import check, cudrv

WAIT_KINDS = ("spin", "stream")


def publish(x, ids, w, r0: int, T: int, pub_x, pub_ids, pub_w, seq, ring: int, stream) -> None:
    """Rows [r0, r0+T) of x [M, D], ids [M, K], w [M, K] -> the mapped payload (same rows), then seq = ring."""
    D, K = x.shape[1], ids.shape[1]
    nvrtc.kernel("tiers", "tier_publish")((1,), (1024,), (
        x, ids, w, np.int32(r0), np.int32(T), np.int32(D), np.int32(K), pub_x, pub_ids, pub_w, seq,
        np.uint32(ring)), stream=stream)


def wait_word(word, want: int, err, code: int, timeout_ns: int, waited_ns, stream, kind: str = "spin") -> None:
    """The stream waits until the mapped u32 `word` >= want (spin: at most timeout_ns, then err = code)."""
    if kind == "spin":
        nvrtc.kernel("tiers", "tier_wait")((1,), (32,), (
            word, np.uint32(want), err, np.uint32(code), np.uint64(timeout_ns), U.null_or(waited_ns)), stream=stream)
        return
    if kind != "stream":
        raise ValueError(f"wait kind '{kind}' (choose from {', '.join(WAIT_KINDS)})")
    drv = cudrv()
    check(drv.cuStreamWaitValue32(drv.CUstream(stream.ptr), drv.CUdeviceptr(word.data.ptr), want,
                                  drv.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32")


def write_word(word, value: int, stream) -> None:
    """Write the mapped u32 `word` = value when `stream` reaches this point (the copy engine's flagB)."""
    drv = cudrv()
    check(drv.cuStreamWriteValue32(drv.CUstream(stream.ptr), drv.CUdeviceptr(word.data.ptr), value,
                                   drv.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT),
          "cuStreamWriteValue32")


def group_resident(ids, j0: int, J: int, slot_of, n_expert: int, g_expert, g_count, g_entries, stream) -> None:
    """Entries [j0, j0+J) of ids [M, K] whose expert has a slot in slot_of [E] -> groups by slot (g_* views of J
    groups; g_entries [J, GEMV_MAXT] hold global entries)."""
    if not 1 <= J <= 1024:
        raise ValueError(f"tier_group: {J} entries outside 1..1024")
    nvrtc.kernel("tiers", "tier_group")((1,), (max(32, -(-J // 32) * 32),), (
        ids, np.int32(j0), np.int32(J), slot_of, np.int32(n_expert), np.int32(U.GEMV_MAXT), g_expert, g_count,
        g_entries), stream=stream)


def swiglu_experts(gate, up, down, n_expert: int, groups, n_groups: int, nt: int, x, K: int, h, parts,
                   stream) -> None:
    """parts[j] = down_e . (silu(gate_e . x[j // K]) * (up_e . x[j // K])) for the groups' entries (unweighted).
    gate/up/down = (array [E, rows, row], type); x [M, D], h [M*K, F], parts [M*K, D] whole buffers."""
    if not 1 <= n_groups <= h.shape[0]:
        raise ValueError(f"n_groups: {n_groups} outside 1..{h.shape[0]} (the entry buffer's rows)")
    with U.on_stream(stream):
        launch_swiglu_experts(*((w, t, int(w.nbytes // max(int(w.shape[0]), 1))) for w, t in (gate, up, down)),
                              n_expert, groups, n_groups, nt, x, K, h, parts)


def combine(parts, ymiss, src, w, shared, out, r0: int, T: int, stream) -> None:
    """out[t] = sum_k w[t,k] * (ymiss if src says CPU else parts)[t*K+k] + shared[t], rows [r0, r0+T)."""
    K, D = w.shape[1], out.shape[1]
    grid, block = U.elementwise_grid(T * D)
    nvrtc.kernel("tiers", "tier_combine")(grid, block, (
        parts, ymiss, src, w, shared, out, np.int32(r0), np.int32(T), np.int32(K), np.int32(D)), stream=stream)
