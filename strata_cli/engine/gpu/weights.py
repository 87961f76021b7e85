"""Model weights on the device: matrices as their GGUF bytes (the kernels dequantize), small tensors as f32.

Q8_0 GEMV matrices whose rows come in whole groups of 32 are repacked once, on the device, into the Q8_0_R32
layout (strata_cli/model/packed.py): same bytes, read with 16-byte loads. Gathered tables (token and PLE
embeddings) stay raw: their kernels read single rows.
"""

from __future__ import annotations

import numpy as np

from ...gpu.runtime import cupy
from ...model import packed
from ...model.gguf_file import GGUFModel
from ...model.names import PLE_TABLE

# 2-D tensors the kernels read as float32 arrays rather than raw rows (conv taps; tiny and always F32 in files)
F32_MATRICES = ("ssm_conv1d.weight", "ple_conv1d.weight")
GATHERED = ("token_embd.weight", PLE_TABLE)  # read a row at a time by index: never repacked


class DeviceWeights:
    def __init__(self, model: GGUFModel, pack_q8: bool = True):
        cp = cupy()
        self.model = model
        self.packed = 0  # bytes repacked to Q8_0_R32
        self.raw: dict[str, tuple[object, int]] = {}
        self.vec: dict[str, object] = {}
        self.nbytes = 0
        for name in list(model.specs) + ([PLE_TABLE] if model.geometry.ple is not None else []):
            info = model.info(name)
            if name.endswith("ffn_gate_inp_shexp.weight"):  # a [D] or [D, 1] gate row, read as one GEMV row
                arr = cp.asarray(np.ascontiguousarray(model.f32(name), dtype=np.float32).reshape(1, -1))
                self.raw[name] = (arr, 0)
            elif len(info.shape) == 1 or name.endswith(F32_MATRICES):
                arr = cp.asarray(np.ascontiguousarray(model.f32(name), dtype=np.float32))
                self.vec[name] = arr
            else:
                arr = cp.asarray(np.ascontiguousarray(info.raw))
                ggml_type = info.ggml_type
                if pack_q8 and name not in GATHERED and packed.packable(tuple(arr.shape), ggml_type):
                    from ...gpu.launch_pack import pack_q8_0

                    arr = pack_q8_0(arr, _n_in(info), out=cp.empty_like(arr))
                    ggml_type = packed.Q8_0_R32
                    self.packed += arr.nbytes
                self.raw[name] = (arr, ggml_type)
            self.nbytes += arr.nbytes

        cp.cuda.Device().synchronize()  # the packing ran on the current stream; engines use their own

    def r(self, name: str):
        """(raw device array in numpy order, GGML type)."""
        return self.raw[name]

    def v(self, name: str):
        return self.vec[name]

    def blk_r(self, layer: int, role: str):
        return self.raw[f"blk.{layer}.{role}.weight"]

    def blk_v(self, layer: int, role: str):
        suffix = "" if role in ("ssm_a", "ssm_dt.bias") else ".weight"
        return self.vec[f"blk.{layer}.{role}{suffix}"]


def _n_in(info) -> int:
    """Input width of a GEMV matrix: the GGUF's ne0 (numpy's last axis holds its raw bytes)."""
    return int(info.shape[0])
