"""Model weights on the device: matrices as their raw GGUF bytes (the kernels dequantize), small tensors as f32."""

from __future__ import annotations

import numpy as np

from ...gpu.runtime import cupy
from ...model.gguf_file import GGUFModel
from ...model.names import PLE_TABLE

# 2-D tensors the kernels read as float32 arrays rather than raw rows (conv taps; tiny and always F32 in files)
F32_MATRICES = ("ssm_conv1d.weight", "ple_conv1d.weight")


class DeviceWeights:
    def __init__(self, model: GGUFModel):
        cp = cupy()
        self.model = model
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
                self.raw[name] = (arr, info.ggml_type)
            self.nbytes += arr.nbytes

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
