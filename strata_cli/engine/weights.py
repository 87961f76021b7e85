"""Float32 views of a model's weights by role, dequantized on first use (CPU reference path)."""

from __future__ import annotations

import numpy as np

from ..model.gguf_file import GGUFModel
from ..model.names import PLE_TABLE, blk_tensor


GATHERED = ("token_embd.weight", PLE_TABLE)  # read by rows, never copied whole


def resident_bytes(model: GGUFModel) -> int:
    """What the numpy engine holds once every tensor was used (arithmetic, from the tensor table): a float64 copy
    of every matrix, plus the float32 dequantized copy of every non-F32 tensor; gathered tables stay mapped."""
    from ..model import quants

    total = 0
    for info in model.tensors.values():
        if info.name in GATHERED or (info.name not in model.specs):
            continue
        n = int(np.prod(info.shape, dtype=np.int64))
        matrix = len(info.shape) >= 2 and not (len(info.shape) == 2 and 1 in info.shape)
        total += 8 * n if matrix else 0
        total += 4 * n if info.ggml_type != quants.F32 else 0
    return total


class Weights:
    def __init__(self, model: GGUFModel):
        self.model = model
        self.g = model.geometry
        if self.g.ple is not None:
            self.ple_mult, self.ple_sizes, self.ple_offsets = self.g.ple.hash_arrays()
        self._f64: dict[str, np.ndarray] = {}

    def get(self, name: str) -> np.ndarray:
        """Vectors as float32; matrices as float64 copies, so GEMMs accumulate in float64 (ops/basic.linear)."""
        arr = self.model.f32(name)
        if arr.ndim < 2 or (arr.ndim == 2 and 1 in arr.shape):
            return arr
        out = self._f64.get(name)
        if out is None:
            out = self._f64[name] = arr.astype(np.float64)
        return out

    def blk(self, layer: int, role: str) -> np.ndarray:
        return self.get(blk_tensor(layer, role))

    def hc(self, prefix: str, inject: bool = True):
        """(norm [C*D], down [L, C*D], up [C*D, L], inject [C, C*D] | None) of one hyper-connection half."""
        get = self.get
        return (get(f"{prefix}_norm.weight"), get(f"{prefix}_down.weight"), get(f"{prefix}_up.weight"),
                get(f"{prefix}_inject.weight") if inject else None)

    def expert(self, layer: int, e: int):
        """(gate [F, D], up [F, D], down [D, F]) of routed expert e."""
        return (self.blk(layer, "ffn_gate_exps")[e], self.blk(layer, "ffn_up_exps")[e],
                self.blk(layer, "ffn_down_exps")[e])

    def shared(self, layer: int):
        return (self.blk(layer, "ffn_gate_shexp"), self.blk(layer, "ffn_up_shexp"),
                self.blk(layer, "ffn_down_shexp"), self.blk(layer, "ffn_gate_inp_shexp").reshape(-1))

    def embed_rows(self, tokens: np.ndarray) -> np.ndarray:
        return self.model.rows_f32("token_embd.weight", tokens)

    def ple_rows(self, rows: np.ndarray) -> np.ndarray:
        """rows [T, heads] -> concatenated n-gram embeddings [T, heads * head_dim]."""
        flat = self.model.rows_f32(PLE_TABLE, rows.reshape(-1))
        return flat.reshape(rows.shape[0], -1)
