"""Test helper: rewrite a GGUF with some keys / tensors dropped, set or replaced, everything else kept as is.

`rewrite_gguf(src, dst)` with no edits writes a file that loads to the same keys (with the same value types,
including array element types), the same tensors (same GGML type, shape and raw bytes) in the same order. The
tests build their bad inputs (wrong architecture, missing key or tensor, inconsistent metadata, mis-shaped or
unsupported tensors) from the shared fixture this way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

ARCH_KEY = "general.architecture"
ALIGNMENT_KEY = "general.alignment"


def read_field(field) -> tuple[Any, GGUFValueType, GGUFValueType | None]:
    """(value, type, array element type or None) of one reader field, as GGUFWriter.add_key_value takes them."""
    vtype = field.types[0]
    if vtype != GGUFValueType.ARRAY:
        return field.contents(), vtype, None
    # parts: key length, key bytes, value type, element type, element count, elements...
    sub_type = GGUFValueType(int(field.parts[3][0]))
    if sub_type == GGUFValueType.ARRAY:
        raise ValueError(f"{field.name}: nested arrays are not supported by rewrite_gguf")
    if int(field.parts[4][0]) == 0:
        raise ValueError(f"{field.name}: GGUFWriter cannot write an empty array")
    return field.contents(), vtype, sub_type


def read_keys(path) -> dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]]:
    """Every key/value of a GGUF (not the GGUF.* header pseudo-fields), in file order."""
    reader = GGUFReader(str(path), "r")
    return {name: read_field(f) for name, f in reader.fields.items() if not name.startswith("GGUF.")}


def _setting(key: str, spec) -> tuple[Any, GGUFValueType, GGUFValueType | None]:
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise TypeError(f"set_keys[{key!r}] must be (value, GGUFValueType[, sub_type]), got {spec!r}")
    value, vtype = spec[0], GGUFValueType(spec[1])
    sub_type = GGUFValueType(spec[2]) if len(spec) == 3 and spec[2] is not None else None
    if vtype == GGUFValueType.ARRAY:
        value = list(value)
        if sub_type is None:
            raise TypeError(f"set_keys[{key!r}]: an ARRAY value needs its element type")
    return value, vtype, sub_type


def _raw_array(name: str, spec) -> tuple[np.ndarray, GGMLQuantizationType]:
    if not isinstance(spec, tuple) or len(spec) != 2:
        raise TypeError(f"replace_tensors[{name!r}] must be (array, ggml type), got {type(spec).__name__}")
    array, ggml_type = np.ascontiguousarray(spec[0]), GGMLQuantizationType(spec[1])
    return array, ggml_type


def rewrite_gguf(src, dst, *, drop_keys: Iterable[str] = (), set_keys: Mapping[str, tuple] | None = None,
                 drop_tensors: Iterable[str] = (), replace_tensors: Mapping[str, tuple] | None = None,
                 arch: str | None = None) -> Path:
    """Copy the GGUF `src` to `dst` with edits; returns `dst`.

    drop_keys: metadata keys to leave out.  set_keys: key -> (value, GGUFValueType[, array element type]);
    replaces a key in place or appends a new one.  drop_tensors: tensor names to leave out.
    replace_tensors: name -> (array, GGMLQuantizationType): the raw array a GGUFWriter takes (numpy order,
    typed float32/float16 for F32/F16, uint8 byte rows for block-quantized types as gguf.quants.quantize makes
    them); replaces a tensor in place (its shape and type may change) or appends a new one.
    arch: a new value for general.architecture (the other keys keep their names).
    """
    set_keys = dict(set_keys or {})
    replace_tensors = dict(replace_tensors or {})
    drop_keys, drop_tensors = set(drop_keys), set(drop_tensors)
    if arch is not None:
        set_keys[ARCH_KEY] = (arch, GGUFValueType.STRING)

    reader = GGUFReader(str(src), "r")
    keys = {name: read_field(f) for name, f in reader.fields.items() if not name.startswith("GGUF.")}
    for key in drop_keys:
        if key not in keys:
            raise KeyError(f"{src}: no metadata key {key!r} to drop")
    names = [t.name for t in reader.tensors]
    for name in drop_tensors:
        if name not in names:
            raise KeyError(f"{src}: no tensor {name!r} to drop")

    arch_value = set_keys.get(ARCH_KEY, keys.get(ARCH_KEY, ("",)))[0]
    writer = GGUFWriter(str(dst), str(arch_value))
    writer.kv_data[0].clear()  # the constructor adds general.architecture: re-add every key in file order
    out_keys = {k: v for k, v in keys.items() if k not in drop_keys}
    for key, spec in set_keys.items():
        if key not in drop_keys:
            out_keys[key] = _setting(key, spec)
    for key, (value, vtype, sub_type) in out_keys.items():
        writer.add_key_value(key, value, vtype, sub_type)
    if ALIGNMENT_KEY in out_keys:
        writer.data_alignment = int(out_keys[ALIGNMENT_KEY][0])

    for t in reader.tensors:
        if t.name in drop_tensors:
            continue
        if t.name in replace_tensors:
            array, ggml_type = _raw_array(t.name, replace_tensors.pop(t.name))
        else:
            # typed (numpy order) for F32/F16/..., uint8 byte rows for quantized types: either way the raw bytes
            array, ggml_type = np.asarray(t.data), GGMLQuantizationType(int(t.tensor_type))
        writer.add_tensor(t.name, array, raw_shape=array.shape, raw_dtype=ggml_type)
    for name, spec in replace_tensors.items():  # names not in the source: appended
        array, ggml_type = _raw_array(name, spec)
        writer.add_tensor(name, array, raw_shape=array.shape, raw_dtype=ggml_type)

    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return Path(dst)
