"""Open a qwen4exp GGUF: memory-mapped, validated against the name table, dequantized lazily per tensor."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..errors import ModelFileError
from . import quants
from .geometry import ARCH, Geometry, Metadata, geometry_from_metadata
from .names import INDEXER_MARK, PLE_TABLE, TensorSpec, expected_tensors, ple_table_rows


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    shape: tuple[int, ...]  # GGML order, ne0 first
    offset: int  # absolute file offset of the data
    n_bytes: int
    raw: np.ndarray  # memmap view in numpy order (typed for F32/F16, byte rows otherwise)

    @property
    def type_name(self) -> str:
        name = quants.TYPE_NAMES.get(self.ggml_type)
        if name is None:  # a type strata does not read: gguf knows its name (Q4_0, I32, ...)
            import gguf

            try:
                name = gguf.GGMLQuantizationType(self.ggml_type).name
            except ValueError:
                name = f"type{self.ggml_type}"
        return name


def field_value(reader, field):
    """A metadata field's value: gguf's ReaderField.contents(), or the string list the fast reader parsed."""
    strings = getattr(reader, "string_arrays", {}).get(field.offset)
    return list(strings) if strings is not None else field.contents()


def _read_metadata(reader, path: str) -> dict:
    values = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            values[key] = field_value(reader, field)
        except Exception:  # an exotic value type we never read: keep the key, drop the value
            values[key] = None
    return values


def _fast_reader_class():
    """gguf.GGUFReader with arrays parsed in one pass: gguf builds one numpy view per array element, 5 million views
    (tens of seconds) for the released model's 248k tokens and merges; here a scalar array is one view and a string
    array one list of str (kept in string_arrays by the field's offset; field_value reads it)."""
    import struct

    import gguf
    from gguf import GGUFValueType as VT

    class FastReader(gguf.GGUFReader):
        string_arrays: dict

        def _build_fields(self, offs, count):
            self.string_arrays = {}
            self._kv_start = None
            return super()._build_fields(offs, count)

        def _get_str(self, offset):
            if self._kv_start is None:
                self._kv_start = offset  # the first string read for a KV is its key: the field's offset
            return super()._get_str(offset)

        def _get_field_parts(self, orig_offs, raw_type):
            kv_start = self._kv_start
            try:
                return self._parts(orig_offs, raw_type, kv_start)
            finally:
                self._kv_start = None  # the next string read is the next KV's key

        def _parts(self, orig_offs, raw_type, kv_start):
            if raw_type != VT.ARRAY or self.byte_order != "I":
                return gguf.GGUFReader._get_field_parts(self, orig_offs, raw_type)
            raw_itype = self._get(orig_offs, np.uint32)
            alen = self._get(orig_offs + 4, np.uint64)
            item_type, count, offs = int(raw_itype[0]), int(alen[0]), orig_offs + 12
            types = [VT.ARRAY, VT(item_type)]
            if item_type == VT.STRING:
                view, end, strings = memoryview(self.data), len(self.data), []
                for _ in range(count):
                    (n,) = struct.unpack_from("<Q", view, offs)
                    if offs + 8 + n > end:
                        raise ValueError("a string length points past the end of the file")
                    strings.append(str(view[offs + 8:offs + 8 + n], "utf-8"))
                    offs += 8 + n
                self.string_arrays[kv_start] = strings
                return offs - orig_offs, [raw_itype, alen], [], types
            nptype = self.gguf_scalar_to_np.get(VT(item_type))
            if nptype is None:  # nested arrays: gguf's own walk
                return gguf.GGUFReader._get_field_parts(self, orig_offs, raw_type)
            values = self._get(offs, nptype, count)
            if len(values) != count:
                raise ValueError("an array points past the end of the file")
            return 12 + int(values.nbytes), [raw_itype, alen, values], [2] if count else [], types

    return FastReader


def _alignment(path: str, reader) -> int:
    """general.alignment (default 32): a power of two, or the file's tensor offsets mean nothing."""
    field = reader.fields.get("general.alignment")
    if field is None:
        return 32
    try:
        value = field.contents()
    except Exception:
        value = None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
        raise ModelFileError(f"{path}: metadata 'general.alignment' = {value!r}: must be a power of two")
    return int(value)


def _check_tensor_extents(path: str, size: int, start_offs: int, fields, alignment: int) -> None:
    """Name the tensor whose data lies past the end of the file, is not aligned, or whose type id is unknown before
    gguf's reader fails on it with a numpy reshape error (or maps misaligned, shifted data)."""
    import gguf

    if start_offs % alignment:
        raise ModelFileError(f"{path}: tensor data starts at byte {start_offs}, not a multiple of the alignment "
                             f"{alignment}: corrupt header")
    for field in fields:
        _name_len, name_data, _n_dims, dims, raw_dtype, offset_tensor = field.parts
        name = bytes(name_data).decode("utf-8", "replace")
        try:
            ggml_type = gguf.GGMLQuantizationType(int(raw_dtype[0]))
        except ValueError:
            raise ModelFileError(f"{path}: tensor '{name}' has unknown GGML type id {int(raw_dtype[0])}") from None
        block, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
        n_elems = 1
        for d in dims.tolist():
            n_elems *= int(d)
        if int(offset_tensor[0]) % alignment:
            raise ModelFileError(f"{path}: tensor '{name}' data offset {int(offset_tensor[0])} is not a multiple of "
                                 f"the alignment {alignment}: misaligned (corrupt) tensor table")
        end = start_offs + int(offset_tensor[0]) + n_elems * type_size // block
        if end > size:
            raise ModelFileError(f"{path}: truncated: tensor '{name}' ends at byte {end}, file has {size} bytes")


def _open_reader(path: str):
    import struct

    from ..sysio.files import input_problem

    problem = input_problem(path)
    if problem:
        raise ModelFileError(f"{path or repr(path)}: cannot open the model: {problem}")
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if magic != b"GGUF":
        raise ModelFileError(f"{path}: not a GGUF file (magic {magic!r}, {size} bytes)")

    class Reader(_fast_reader_class()):
        def _build_tensors(self, start_offs, fields):
            _check_tensor_extents(path, size, start_offs, fields, _alignment(path, self))
            super()._build_tensors(start_offs, fields)

    try:
        return Reader(path, "r"), size
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read the model ({exc.strerror or exc})") from None
    except (ValueError, IndexError, KeyError, OverflowError, MemoryError, UnicodeDecodeError, struct.error) as exc:
        # gguf's reader walks the header with numpy views: its errors ("index 0 is out of bounds") say nothing
        # about the file, so say what they mean
        raise ModelFileError(f"{path}: truncated or corrupt GGUF header ({size} bytes): {_header_fault(exc)}") \
            from None


def _header_fault(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "a key or string is not valid UTF-8"
    if isinstance(exc, KeyError):
        return f"a duplicate or unknown entry ({exc.args[0] if exc.args else '?'})"
    if isinstance(exc, MemoryError):
        return "a length field is absurdly large"
    text = (str(exc).splitlines() or [""])[0]
    if "alignment" in text:
        return f"metadata 'general.alignment': {text[:120]}"
    numpy_internals = ("out of bounds", "reshape", "buffer", "axis", "broadcast", "index", "too small")
    if text and not any(word in text for word in numpy_internals):
        return text[:120]  # gguf's own words ("Bad type for ...", version errors) name the problem
    return ("a length or count field points past the end of the file, or a value type is unknown "
            f"({type(exc).__name__})")


def _identity(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class GGUFModel:
    """A validated qwen4exp GGUF. Tensors stay memory-mapped until `f32()` dequantizes (and caches) one."""

    def __init__(self, path: str):
        self.path = str(path)
        reader, self.file_size = _open_reader(self.path)
        self.reader = reader  # the header as gguf parsed it (field types: strata quantize copies them)
        self._identity = _identity(self.path)
        self.metadata = _read_metadata(reader, self.path)
        self.tensors: dict[str, TensorInfo] = {}
        for t in reader.tensors:
            shape = tuple(int(s) for s in t.shape)
            end = int(t.data_offset) + int(t.n_bytes)
            if end > self.file_size:
                raise ModelFileError(f"{self.path}: truncated: tensor '{t.name}' ends at byte {end}, "
                                     f"file has {self.file_size}")
            self.tensors[t.name] = TensorInfo(t.name, int(t.tensor_type), shape, int(t.data_offset),
                                              int(t.n_bytes), t.data)
        md = Metadata(self.metadata, self.path)
        embd = self.tensors.get("token_embd.weight")
        if embd is None:
            raise ModelFileError(f"{self.path}: missing tensor 'token_embd.weight'")
        if len(embd.shape) != 2:
            raise ModelFileError(f"{self.path}: tensor 'token_embd.weight' has shape {list(embd.shape)}, "
                                 "expected [n_embd, n_vocab]")
        self._check_embedding(md, embd)
        has_indexer = any(name.endswith(INDEXER_MARK) for name in self.tensors)
        has_ple = any(".ple_" in name or name == PLE_TABLE for name in self.tensors)
        self._check_block_count(md)
        self.geometry: Geometry = geometry_from_metadata(md, embd.shape[1], has_indexer, has_ple_tensors=has_ple)
        self.specs: dict[str, TensorSpec] = expected_tensors(self.geometry)
        self._validate()
        self._f32: dict[str, np.ndarray] = {}

    # ---- validation
    def _check_embedding(self, md: Metadata, embd: TensorInfo) -> None:
        """The vocabulary size comes from token_embd's shape: check that shape against embedding_length (and the
        tokenizer's token list) first, so a transposed or foreign tensor is named, not a key checked against it."""
        n_embd = md.get(f"{ARCH}.embedding_length")
        if isinstance(n_embd, bool) or not isinstance(n_embd, int):
            return  # geometry_from_metadata reports the key
        shape = list(embd.shape)
        if shape[0] != n_embd:
            hint = " (transposed: ne0 must be n_embd)" if shape[1] == n_embd else ""
            raise ModelFileError(f"{self.path}: tensor 'token_embd.weight' has shape {shape}, expected [{n_embd} "
                                 f"(embedding_length), n_vocab]{hint}")
        tokens = md.get("tokenizer.ggml.tokens")
        if isinstance(tokens, list) and len(tokens) > shape[1]:  # fewer is fine: converters pad the embedding
            raise ModelFileError(f"{self.path}: tensor 'token_embd.weight' has {shape[1]} rows (n_vocab) but "
                                 f"'tokenizer.ggml.tokens' lists {len(tokens)} tokens")

    def _check_block_count(self, md: Metadata) -> None:
        """A corrupt block_count would size per-layer tables before any tensor is checked: the file must hold
        tensors of its last layer."""
        key = f"{ARCH}.block_count"
        n_layers = md.get(key)
        if md.get("general.architecture") != ARCH or isinstance(n_layers, bool) or not isinstance(n_layers, int):
            return  # geometry_from_metadata reports these
        if n_layers > 0 and not any(name.startswith(f"blk.{n_layers - 1}.") for name in self.tensors):
            raise ModelFileError(f"{self.path}: metadata '{key}' = {n_layers} but the file has no tensors of layer "
                                 f"{n_layers - 1} (blk.{n_layers - 1}.*)")

    def _validate(self) -> None:
        for name, spec in self.specs.items():
            info = self.tensors.get(name)
            if info is None:
                raise ModelFileError(f"{self.path}: missing tensor '{name}' (expected shape {list(spec.shape)})")
            if info.shape not in spec.shapes:
                raise ModelFileError(f"{self.path}: tensor '{name}' has shape {list(info.shape)}, "
                                     f"expected {list(spec.shape)}")
        if self.geometry.ple is not None:
            info = self.tensors.get(PLE_TABLE)
            rows = ple_table_rows(self.geometry)
            width = self.geometry.ple.head_dim
            if info is None:
                raise ModelFileError(f"{self.path}: missing tensor '{PLE_TABLE}' (PLE layer "
                                     f"{self.geometry.ple.layer} needs it)")
            if len(info.shape) != 2 or info.shape[0] != width or info.shape[1] < rows:
                raise ModelFileError(f"{self.path}: tensor '{PLE_TABLE}' has shape {list(info.shape)}, "
                                     f"expected [{width}, >= {rows}]")
        for info in self.tensors.values():
            if (info.name in self.specs or info.name == PLE_TABLE) and info.ggml_type not in quants.SUPPORTED:
                raise ModelFileError(f"{self.path}: tensor '{info.name}' has unsupported type {info.type_name} "
                                     f"(strata reads {', '.join(sorted(quants.TYPE_NAMES.values()))})")

    # ---- the mapped file must stay as it was
    def check_unchanged(self) -> None:
        """Raise if the file was truncated or rewritten in place since it was opened (one stat call): its mapped
        pages would then give SIGBUS or a mix of two models. A file replaced by rename is harmless: the mapping
        keeps the old one."""
        now = _identity(self.path)
        if now is None or self._identity is None or now[:2] != self._identity[:2]:
            return
        if now != self._identity:
            was, size = self._identity[2], now[2]
            how = f"{was} -> {size} bytes" if size != was else "rewritten in place, same size"
            raise ModelFileError(f"{self.path}: the model file changed on disk while in use ({how}): stopped "
                                 "before reading it again")

    # ---- access
    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelFileError(f"{self.path}: missing tensor '{name}'") from None

    def f32(self, name: str) -> np.ndarray:
        """Float32 numpy-order copy (or view for F32) of a whole tensor, cached."""
        out = self._f32.get(name)
        if out is None:
            info = self.info(name)
            out = quants.dequantize(info.raw, info.ggml_type)
            if info.ggml_type == quants.F32:
                out = np.asarray(out)
            self._f32[name] = out
        return out

    def rows_f32(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Dequantize only some rows (numpy axis 0 of a 2-D tensor): embedding and n-gram gathers."""
        info = self.info(name)
        return quants.dequantize(np.asarray(info.raw[np.asarray(rows)]), info.ggml_type)

    def type_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for info in self.tensors.values():
            counts[info.type_name] = counts.get(info.type_name, 0) + 1
        return counts


def open_model(path) -> GGUFModel:
    return GGUFModel(str(path))
