"""CuPy launchers of kernels/gemv.cu, hyper.cu and head.cu, mirroring their numpy references.

References with the same signatures: strata_cli/ops/gemv.py (gemv, hc_read_raw, argmax_rows) and
strata_cli/ops/hyper.py (hc_write). Arrays are CuPy, float32 / int32, C-contiguous. Every launcher takes
`out=` (checked, never reallocated: with all outputs and scratch given nothing is allocated, so the calls can be
captured in a CUDA graph) and `stream=` (None: the current stream).

Legend: T window rows, C streams, D hidden, L low rank, V vocabulary, n_in / n_out GEMV widths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import launch_util as U
from .compile import kernel
from .runtime import cupy, empty


_PARTIAL = []
ZSPLIT_TILES = 4096  # tiles (blocks along x times y) a z-split GEMV launch may have: n_out <= 16384, T <= 16


def _partials():
    """(raw split-K sums of the z slices, per-tile arrival counters): one pair for every launch on this device
    (launches on one stream run in order; the last block of a tile resets its counter). Allocated on first use,
    which is an eager warm-up, never inside a capture."""
    if not _PARTIAL:
        cp = cupy()
        _PARTIAL.append((empty((U.GEMV_PARTIAL_FLOATS,), np.float32), cp.zeros((ZSPLIT_TILES,), np.uint32)))
    return _PARTIAL[0]


def launch_gemv(w, ggml_type: int, n_in: int, x, y, *, act: int = U.ACT_NONE, div: float = 1.0, mul=None,
                mul_strides: tuple[int, int] = (0, 0)) -> None:
    """y [T, n_out] = act(x [T, n_in] @ W^T / div) * mul[t*mul_st + o*mul_so]; arguments already checked.
    Split-K over grid z finishes inside the launch (the last block of each tile), so every GEMV is one node."""
    T, n_out = y.shape
    max_z = U.GEMV_MAX_ZSPLIT if T <= U.GEMV_MAXT else 1
    if ggml_type == U.Q8_0_R32:
        check_vector_rows("x", x)
        ksplit, zsplit = U.q8r_split(n_out, n_in, T, max_z=max_z)
        grid, block = U.gemv_grid(n_out, T, ksplit, zsplit, rpw=U.q8r_rows_per_warp(T))
        name, geometry = f"gemv_q8r_t{U.nt_bucket(T)}", (np.int32(n_in // 32),)
        module = "gemv_q8r"
    else:
        ksplit, zsplit = U.gemv_split(n_out, n_in, max_z=max_z)
        grid, block = U.gemv_grid(n_out, T, ksplit, zsplit)
        name = f"gemv_{U.TYPE_SUFFIX[ggml_type]}_t{U.nt_bucket(T)}"
        geometry, module = (np.int64(U.row_stride(ggml_type, n_in)),), "gemv"
    partial, tile_done = _partials() if zsplit > 1 else (None, None)
    if zsplit > 1 and grid[0] * grid[1] > ZSPLIT_TILES:
        raise ValueError(f"y: a z-split launch of {grid[0] * grid[1]} tiles exceeds {ZSPLIT_TILES}")
    kernel(module, name)(grid, block, (
        w, *geometry, x, np.int32(n_in), y, np.int32(n_out), np.int32(T), np.int32(ksplit), np.int32(act),
        np.float32(div), U.null_or(mul), np.int32(mul_strides[0]), np.int32(mul_strides[1]), U.null_or(partial),
        U.null_or(tile_done)))


def check_vector_rows(name: str, x) -> None:
    """The repacked Q8_0 kernels read x rows as float4: the rows must start 16-byte aligned."""
    if U.data_ptr(x) % 16:
        raise ValueError(f"{name}: data not 16-byte aligned (the Q8_0_R32 GEMVs read x as float4)")


def gemv(w_raw, ggml_type: int, n_in: int, x, out=None, stream=None):
    """y [T, n_out] = x [T, n_in] @ dequantize(w_raw).T; w_raw holds n_out raw rows of ggml_type."""
    with U.on_stream(stream):
        n_out = U.weight_rows("w_raw", w_raw, ggml_type, n_in)
        U.check_array("x", x, np.float32, (None, n_in))
        out = U.out_array("out", out, (x.shape[0], n_out), np.float32, empty)
        launch_gemv(w_raw, ggml_type, n_in, x, out)
    return out


@dataclass
class HcScratch:
    """Intermediates of hc_read: xn [T, C*D], low [T, L], gates [T, C*D]; may hold more rows than the window."""

    xn: object
    low: object
    gates: object

    @classmethod
    def empty(cls, T: int, C: int, D: int, L: int) -> "HcScratch":
        return cls(empty((T, C * D), np.float32), empty((T, L), np.float32), empty((T, C * D), np.float32))


def hc_read(R, norm_w, down_raw, down_type: int, up_raw, up_type: int, inject_raw, inject_type: int | None,
            eps: float, out_mixed=None, out_inj=None, scratch: HcScratch | None = None, stream=None):
    """R [T, C, D] -> (mixed [T, D], inj [T, C] or None when inject_raw is None); see kernels/hyper.cu.

    norm_w [C*D] f32; down_raw [L, C*D], up_raw [C*D, L], inject_raw [C, C*D] raw rows of their GGML types."""
    with U.on_stream(stream):
        U.check_array("R", R, np.float32, (None, None, None))
        T, C, D = R.shape
        CD = C * D
        U.check_array("norm_w", norm_w, np.float32, (CD,))
        L = U.weight_rows("down_raw", down_raw, down_type, CD)
        U.weight_rows("up_raw", up_raw, up_type, L, n_out=CD)
        if inject_raw is not None:
            U.weight_rows("inject_raw", inject_raw, inject_type, CD, n_out=C)
        elif out_inj is not None:
            raise ValueError("out_inj: given, but inject_raw is None (no inject gates to write)")
        s = scratch if scratch is not None else HcScratch(None, None, None)
        xn = U.scratch_rows("scratch.xn", s.xn, T, (CD,), empty)
        low = U.scratch_rows("scratch.low", s.low, T, (L,), empty)
        gates = U.scratch_rows("scratch.gates", s.gates, T, (CD,), empty)
        out_mixed = U.out_array("out_mixed", out_mixed, (T, D), np.float32, empty)
        if inject_raw is not None:
            out_inj = U.out_array("out_inj", out_inj, (T, C), np.float32, empty)

        kernel("hyper", "hc_norm")((T * C, 1, 1), (U.BLOCK, 1, 1),
                                (R, norm_w, xn, np.int32(C), np.int32(D), np.float32(eps)))
        launch_gemv(down_raw, down_type, CD, xn, low, act=U.ACT_SILU, div=float(C))
        launch_gemv(up_raw, up_type, L, low, gates, act=U.ACT_SIGMOID)
        grid, block = U.elementwise_grid(T * D)
        kernel("hyper", "hc_mix")(grid, block, (xn, gates, out_mixed, np.int32(T), np.int32(C), np.int32(D)))
        if inject_raw is not None:
            launch_gemv(inject_raw, inject_type, CD, xn, out_inj, act=U.ACT_2SIGMOID, div=float(C))
    return out_mixed, (out_inj if inject_raw is not None else None)


def hc_write(R, block_out, inj, out=None, stream=None):
    """R [T, C, D] + block_out [T, D] * inj [T, C] per stream -> out [T, C, D] (pass out=R to update in place)."""
    with U.on_stream(stream):
        U.check_array("R", R, np.float32, (None, None, None))
        T, C, D = R.shape
        U.check_array("block_out", block_out, np.float32, (T, D))
        U.check_array("inj", inj, np.float32, (T, C))
        out = U.out_array("out", out, (T, C, D), np.float32, empty)
        grid, block = U.elementwise_grid(T * C * D)
        kernel("hyper", "hc_write")(grid, block, (R, block_out, inj, out, np.int32(T), np.int32(C), np.int32(D)))
    return out


ARGMAX_CHUNK = 4096  # logits per stage-1 block
ARGMAX_MAX_PARTS = 1024
_ARGMAX = []


def _argmax_parts():
    """Stage-1 partials [GEMV_MAXT * ARGMAX_MAX_PARTS] (value, id): allocated on first (eager) use."""
    if not _ARGMAX:
        n = U.GEMV_MAXT * ARGMAX_MAX_PARTS
        _ARGMAX.append((empty((n,), np.float32), empty((n,), np.int32)))
    return _ARGMAX[0]


def argmax_rows(logits, out=None, stream=None):
    """logits [T, V] f32 -> ids [T] int32, ties -> lower id (NaN logits are never picked)."""
    with U.on_stream(stream):
        U.check_array("logits", logits, np.float32, (None, None))
        T, V = logits.shape
        out = U.out_array("out", out, (T,), np.int32, empty)
        parts = -(-V // ARGMAX_CHUNK)
        chunk = ARGMAX_CHUNK
        if parts > ARGMAX_MAX_PARTS:
            parts, chunk = ARGMAX_MAX_PARTS, -(-V // ARGMAX_MAX_PARTS)
        if T > U.GEMV_MAXT:
            raise ValueError(f"logits: {T} rows exceed {U.GEMV_MAXT}")
        part_v, part_i = _argmax_parts()
        kernel("head", "argmax_partial")((parts, T, 1), (256, 1, 1), (logits, np.int32(V), np.int32(chunk), part_v,
                                                                    part_i))
        kernel("head", "argmax_rows")((T, 1, 1), (256, 1, 1), (part_v, part_i, np.int32(parts), out))
    return out
