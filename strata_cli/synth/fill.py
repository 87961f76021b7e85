"""Random tensor contents for synthetic models: per-tensor init, the converter's type rules, chunked bytes.

Every chunk is generated from its own seed (model seed, tensor index, chunk index), so the bytes do not
depend on how many threads produced them, and no more than one chunk per worker is ever in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..model import quants

CHUNK_ELEMENTS = 1 << 22  # a multiple of the Q8_0 block (32)
# Kept F32 by the converter whatever the output type (llama.cpp's quantization exceptions).
ALWAYS_F32 = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight")
FILE_TYPES = {"F32": quants.F32, "F16": quants.F16, "BF16": quants.BF16, "Q8_0": quants.Q8_0}
# general.file_type (llama_ftype) per output type
LLAMA_FTYPE = {quants.F32: 0, quants.F16: 1, quants.Q8_0: 7, quants.BF16: 32}


def tensor_type(name: str, shape: tuple[int, ...], file_type: int) -> int:
    """The GGML type llama.cpp's converter gives this tensor for a given --outtype."""
    if file_type == quants.F32 or len(shape) == 1 or name.endswith(ALWAYS_F32):
        return quants.F32
    if file_type == quants.Q8_0 and shape[0] % quants.QK8_0:
        return quants.F16  # Q8_0 needs whole 32-element blocks along ne0
    return file_type


def tensor_nbytes(shape: tuple[int, ...], ggml_type: int) -> int:
    return quants.row_bytes(ggml_type, shape[0]) * math.prod(shape[1:])


@dataclass(frozen=True)
class Init:
    """Distribution of one tensor's values: mean + std * N(0,1), or -U(low, high) for ssm_a."""

    mean: float = 0.0
    std: float = 1.0
    neg_uniform: tuple[float, float] | None = None


def init_for(name: str, shape: tuple[int, ...]) -> Init:
    """Scales that keep a random model's activations finite while its logits still vary."""
    if name.endswith("ssm_a"):
        return Init(neg_uniform=(0.5, 8.0))  # -exp(A_log), A_log = log U(0.5, 8): always negative
    if name.endswith("ssm_dt.bias"):
        return Init(mean=1.0, std=0.3)
    if name.endswith("conv1d.weight"):
        return Init(std=0.3)
    if name.endswith("norm.weight"):
        return Init(mean=1.0, std=0.1)  # gammas stored folded (1 + w); ssm_norm is around 1 too
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return Init(std=1.0)
    if name == "output.weight":
        return Init(std=2.0 / math.sqrt(shape[0]))  # as the fixture's lm_head, for visibly peaked logits
    return Init(std=1.0 / math.sqrt(shape[0]))  # linear: fan_in is ne0


def _rng(seed: int, tensor_index: int, chunk_index: int) -> np.random.Generator:
    return np.random.Generator(np.random.SFC64(np.random.SeedSequence([seed, tensor_index, chunk_index])))


def _q8_0_blocks(rng: np.random.Generator, n: int, std: float) -> np.ndarray:
    """Valid Q8_0 blocks written directly: uniform codes in [-127, 127] and a per-block fp16 scale.

    A uniform code has std 127/sqrt(3); the scale spreads +-50% around the value giving the target std.
    """
    n_blocks = n // quants.QK8_0
    out = np.empty((n_blocks, 34), dtype=np.uint8)
    codes = rng.bit_generator.random_raw(n_blocks * 4).view(np.int8).reshape(n_blocks, 32)
    np.maximum(codes, -127, out=codes)  # -128 is never produced by ggml's quantizer
    out[:, 2:] = codes.view(np.uint8)
    scale = rng.random(n_blocks, dtype=np.float32) + np.float32(0.5)
    scale *= np.float32(std * math.sqrt(3.0) / 127.0)
    out[:, :2] = scale.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return out.reshape(-1)


def chunk_bytes(init: Init, ggml_type: int, n: int, seed: int, tensor_index: int, chunk_index: int) -> np.ndarray:
    """Raw bytes (uint8) of `n` consecutive elements of a tensor."""
    rng = _rng(seed, tensor_index, chunk_index)
    if ggml_type == quants.Q8_0 and init.neg_uniform is None and init.mean == 0.0:
        return _q8_0_blocks(rng, n, init.std)
    if init.neg_uniform is not None:
        low, high = init.neg_uniform
        values = -rng.uniform(low, high, n).astype(np.float32)
    else:
        values = rng.standard_normal(n, dtype=np.float32)
        values *= np.float32(init.std)
        values += np.float32(init.mean)
    return np.ascontiguousarray(quants.quantize(values, ggml_type)).view(np.uint8).reshape(-1)


def chunk_sizes(n_elements: int) -> list[int]:
    full, rest = divmod(n_elements, CHUNK_ELEMENTS)
    return [CHUNK_ELEMENTS] * full + ([rest] if rest else [])
