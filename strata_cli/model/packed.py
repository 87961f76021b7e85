"""Q8_0 repacked for the GPU GEMVs ("Q8_0_R32"): the numpy reference of kernels/gemv_q8r.cu's q8r_pack.

Raw GGUF Q8_0 rows hold 34-byte blocks (fp16 scale, 32 int8), which only allow 2-byte loads. The GPU engine
repacks every GEMV matrix whose row count is a multiple of 32 once, at load time, so that a warp's 16-byte loads
cover 512 contiguous bytes and lane l receives row l's quants. Same bytes, same values: only the order changes.

Legend: rows grouped by 32 (group g = rows 32g..32g+31), nb = n_in / 32 blocks per row. Group g occupies
nb * 1088 bytes: quants [nb][2 halves][32 lanes][16 int8], then scales [nb][32 lanes] fp16.
"""

from __future__ import annotations

import numpy as np

from . import quants

Q8_0_R32 = 0x108  # strata's own type id: never in a file, only in device weights and their references
GROUP = 32
NAMES = {Q8_0_R32: "Q8_0_R32"}


def packable(shape: tuple, ggml_type: int) -> bool:
    """A raw Q8_0 tensor of this numpy shape ([rows, row bytes] or [E, rows, row bytes]) can be repacked."""
    return ggml_type == quants.Q8_0 and len(shape) in (2, 3) and shape[-2] % GROUP == 0


def pack_q8_0(raw: np.ndarray, n_in: int) -> np.ndarray:
    """uint8 raw Q8_0 rows (any shape holding a multiple of 32 whole rows of n_in) -> packed uint8, same shape."""
    nb = _blocks(n_in)
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    groups = _groups(raw.size, n_in)
    blocks = raw.reshape(groups, GROUP, nb, quants.Q8_0_BLOCK_BYTES)
    q = blocks[..., 2:].reshape(groups, GROUP, nb, 2, 16).transpose(0, 2, 3, 1, 4)  # [g, b, h, lane, 16]
    d = blocks[..., :2].transpose(0, 2, 1, 3)  # [g, b, lane, 2]
    out = np.concatenate([q.reshape(groups, -1), d.reshape(groups, -1)], axis=1)
    return out.reshape(raw.shape)


def unpack_q8_0(packed: np.ndarray, n_in: int) -> np.ndarray:
    """The inverse of pack_q8_0: packed uint8 -> raw Q8_0 rows, same shape."""
    nb = _blocks(n_in)
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    groups = _groups(packed.size, n_in)
    flat = packed.reshape(groups, -1)
    q = flat[:, :nb * 1024].reshape(groups, nb, 2, GROUP, 16).transpose(0, 3, 1, 2, 4)  # [g, lane, b, h, 16]
    d = flat[:, nb * 1024:].reshape(groups, nb, GROUP, 2).transpose(0, 2, 1, 3)  # [g, lane, b, 2]
    blocks = np.concatenate([d, q.reshape(groups, GROUP, nb, 32)], axis=3)
    return blocks.reshape(packed.shape)


def _blocks(n_in: int) -> int:
    if n_in < 1 or n_in % quants.QK8_0:
        raise ValueError(f"n_in: {n_in} is not a positive multiple of the Q8_0 block (32)")
    return n_in // quants.QK8_0


def _groups(nbytes: int, n_in: int) -> int:
    group_bytes = GROUP * quants.row_bytes(quants.Q8_0, n_in)
    if nbytes == 0 or nbytes % group_bytes:
        raise ValueError(f"{nbytes} bytes is not a whole number of 32-row groups of {n_in}-wide Q8_0 rows "
                         f"({group_bytes} bytes each)")
    return nbytes // group_bytes
