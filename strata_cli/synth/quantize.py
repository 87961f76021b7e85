"""`strata quantize`: re-encode an F32 / F16 / BF16 qwen4exp GGUF to another type or a per-tensor recipe.

Which tensor gets which type is synth/recipes.tensor_type, the rule make-model writes by: the converter's exceptions
(1-D tensors, routers and conv taps stay F32), then the type asked for, or llama-quantize's fallback for rows that do
not hold whole blocks (F16 where even that does not fit, as the converter's Q8_0). Blocks are encoded by gguf.quants
where it quantizes the type and by strata's own encoders where it does not (synth/encode.py); the metadata is copied
key for key, value type for value type, with general.file_type set to the new type's llama_ftype. The output
appears only once complete (a locked temporary file beside it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError, ModelFileError
from ..model import quants as Q
from ..sysio.files import output_path
from . import encode, fill, recipes
from .plan import ModelPlan, TensorPlan
from .recipes import Recipe
from .writer import Progress, write_plan

SOURCE_TYPES = (Q.F32, Q.F16, Q.BF16)
SKIPPED_KEYS = ("general.architecture", "general.alignment")  # GGUFWriter writes the first; the second is refused


@dataclass(frozen=True)
class Source:
    """One input tensor: its type and where its bytes lie in the file."""

    ggml_type: int
    offset: int
    n_bytes: int


def _metadata(path: str, reader, recipe: Recipe) -> list:
    """The input's key/values as (key, value, type, sub-type), general.file_type set to the recipe's."""
    import gguf
    from gguf import GGUFValueType as VT

    from ..model.gguf_file import field_value

    kvs = []
    alignment = reader.fields.get("general.alignment")
    if alignment is not None and field_value(reader, alignment) != 32:
        raise ModelFileError(f"{path}: general.alignment = {field_value(reader, alignment)}: quantize writes "
                             "32-byte alignment only")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in SKIPPED_KEYS:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == VT.ARRAY else None
        value = recipe.ftype if key == "general.file_type" else field_value(reader, field)
        kvs.append((key, value, vtype, sub))
    if "general.file_type" not in reader.fields:
        kvs.append(("general.file_type", recipe.ftype, VT.UINT32, None))
    if not any(key == "general.quantization_version" for key, *_ in kvs):
        kvs.append(("general.quantization_version", gguf.GGML_QUANT_VERSION, VT.UINT32, None))
    return kvs


def plan_quantize(in_path: str, recipe: Recipe) -> tuple[ModelPlan, list[Source]]:
    """The output file's plan and, per tensor, where its input bytes are. Refuses an input that holds a tensor of a
    type other than F32/F16/BF16, before anything is written."""
    from ..model.gguf_file import open_model

    model = open_model(in_path)  # a valid qwen4exp file, or one error line naming what is wrong with it
    reader = model.reader
    tensors, sources = [], []
    for t in reader.tensors:
        info = model.tensors[t.name]
        if info.ggml_type not in SOURCE_TYPES:
            raise InputError(f"{in_path}: tensor '{t.name}' is {info.type_name}: quantize reads F32, F16 and BF16 "
                             "files (a quantized model would be quantized twice)")
        out_type = recipes.tensor_type(t.name, info.shape, recipe)
        tensors.append(TensorPlan(t.name, info.shape, out_type, fill.Init()))
        sources.append(Source(info.ggml_type, info.offset, info.n_bytes))
    return ModelPlan(_metadata(in_path, reader, recipe), tensors), sources


def _chunks(in_path: str, plan: ModelPlan, sources: list[Source]):
    mapped = np.memmap(in_path, dtype=np.uint8, mode="r")

    def chunk(ti: int, ci: int, n: int) -> np.ndarray:
        src, out_type = sources[ti], plan.tensors[ti].ggml_type
        width = Q.BLOCK[src.ggml_type][1]  # bytes per element of a float type
        start = fill.CHUNK_ELEMENTS * ci
        raw = mapped[src.offset + start * width: src.offset + (start + n) * width]
        if out_type == src.ggml_type:
            return np.array(raw)
        return encode.encode(encode.decode(raw, src.ggml_type), out_type)

    return chunk


def quantize_file(in_path, out_path, recipe: Recipe, progress: Progress | None = None) -> Path:
    """Write `in_path` re-encoded by `recipe` to `out_path` (atomically)."""
    plan, sources = plan_quantize(str(in_path), recipe)
    out = Path(out_path)
    with output_path(out, what="model") as partial:
        write_plan(plan, partial, _chunks(str(in_path), plan, sources), progress)
    return out
