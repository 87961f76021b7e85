"""Random tensor contents for synthetic models: per-tensor init, the converter's type rules, chunked bytes.

Every chunk is generated from its own seed (model seed, tensor index, chunk index), so the bytes do not
depend on how many threads produced them, and no more than one chunk per worker is ever in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..model import quants
from . import encode, recipes
from .recipes import ALWAYS_F32, FILE_TYPES, LLAMA_FTYPE, Recipe  # noqa: F401  (the type rules live there)

CHUNK_ELEMENTS = 1 << 22  # a multiple of every block (32, 64, 256)
RESIDUAL_OUTPUTS = ("attn_output.weight", "ssm_out.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight")
RESIDUAL_SCALE = 0.25


def tensor_type(name: str, shape: tuple[int, ...], file_type: int | Recipe) -> int:
    """The GGML type the converter (--outtype F32/F16/BF16/Q8_0) or llama-quantize (the rest, and recipes) gives
    this tensor: the converter's exceptions, then the type asked for, or its fallback where rows do not fit."""
    recipe = file_type if isinstance(file_type, Recipe) else recipes.uniform(file_type)
    return recipes.tensor_type(name, shape, recipe)


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
    if name.endswith(RESIDUAL_OUTPUTS):
        # the projections that write into the residual stream, scaled down as GPT-2's init does (1 / sqrt(2 L) for
        # L = 8): each block then adds a little to what came before, so a small perturbation (a quantized type)
        # does not grow from layer to layer, and the types of one seed agree as a trained model's types do
        # (small preset, F32 vs Q8_0, 256 random tokens: same top-1 94.1 % -> 98.4 %, mean KLD 2.6e-4 -> 4.1e-5)
        return Init(std=RESIDUAL_SCALE / math.sqrt(shape[0]))
    return Init(std=1.0 / math.sqrt(shape[0]))  # linear: fan_in is ne0


def _rng(seed: int, tensor_index: int, chunk_index: int) -> np.random.Generator:
    return np.random.Generator(np.random.SFC64(np.random.SeedSequence([seed, tensor_index, chunk_index])))


def chunk_values(init: Init, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` float32 values of the F32 model's tensor (the values every encodable type quantizes)."""
    if init.neg_uniform is not None:
        low, high = init.neg_uniform
        return -rng.uniform(low, high, n).astype(np.float32)
    values = rng.standard_normal(n, dtype=np.float32)
    values *= np.float32(init.std)
    values += np.float32(init.mean)
    return values


def chunk_bytes(init: Init, ggml_type: int, n: int, seed: int, tensor_index: int, chunk_index: int) -> np.ndarray:
    """Raw bytes (uint8) of `n` consecutive elements of a tensor: the F32 model's values encoded (synth/encode.py),
    so every type of one seed is one model."""
    return encode.encode(chunk_values(init, n, _rng(seed, tensor_index, chunk_index)), ggml_type)


def chunk_sizes(n_elements: int) -> list[int]:
    full, rest = divmod(n_elements, CHUNK_ELEMENTS)
    return [CHUNK_ELEMENTS] * full + ([rest] if rest else [])
