"""Open a qwen4exp GGUF: memory-mapped, validated against the name table, dequantized lazily per tensor."""

from __future__ import annotations

import os
import re
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


_ESCAPED = re.compile("[\udc80-\udcfe]")  # surrogateescape of a byte that is not UTF-8 (0xFF apart)

def split_string_array(data, offs: int, count: int):
    """The `count` GGUF strings (u64 length + UTF-8 bytes each) from data[offs:], and the offset after the last;
    None where this vectorized path cannot prove its split (a length of 16 MiB or more, five NUL bytes in a row
    inside a string, a string that starts mid-character): the caller then walks the strings one by one.

    Why it is exact: a string's length field has its bytes 3..7 zero, so its offset ends a run of offsets whose next
    5-8 bytes are zero (the string's first byte is not NUL); those run ends are the candidates, and the split is
    accepted only when the first candidate is offs and each next one lies exactly where its predecessor's length
    says, for all `count` strings: the chain of offsets from offs is unique, so the candidates are it."""
    if count == 0:
        return [], offs
    size = len(data) - offs
    window = min(size, count * 16)
    while True:
        if window < 8:
            return None
        w = np.asarray(data[offs:offs + window], dtype=np.uint8)
        zero = w == 0
        z5 = zero[3:window - 4] & zero[4:window - 3]  # z5[i]: bytes i+3..i+7 are zero
        z5 &= zero[5:window - 2]
        z5 &= zero[6:window - 1]
        z5 &= zero[7:window]
        z5[:-1] &= ~z5[1:]  # run ends only
        cand = np.flatnonzero(z5)
        length = w[cand].astype(np.int64)
        length |= w[cand + 1].astype(np.int64) << 8
        length |= w[cand + 2].astype(np.int64) << 16
        nxt = cand + 8 + length
        m = min(len(cand), count)
        if m == 0 or cand[0] != 0 or np.any(cand[1:m] != nxt[:m - 1]):
            return None
        if m == count and nxt[m - 1] <= window:
            break
        if window >= size:
            return None  # the chain runs past the end of the file: the walk names it
        window = min(size, window * 2)
    cand, length = cand[:count], length[:count]
    end = int(nxt[count - 1])
    first = cand[length > 0] + 8
    if np.any((w[first] & 0xC0) == 0x80):
        return None  # a string starting with a continuation byte: invalid alone, the walk raises that
    # each length field becomes one 0xFF byte (never part of valid UTF-8): decoded with surrogateescape it is
    # U+DCFF, and str.split on it cuts the strings apart in C
    keep = np.ones(end, dtype=bool)
    for j in range(7):
        keep[cand + j] = False
    sep = w[:end].copy()
    sep[cand + 7] = 0xFF
    joined = sep[keep].tobytes()
    text = joined.decode("utf-8", "surrogateescape")
    if _ESCAPED.search(text):
        return None  # invalid UTF-8 in a string: the walk raises it
    strings = text.split("\udcff")
    if len(strings) != count + 1:
        return None
    return strings[1:], offs + end


def _fast_reader_class():
    """gguf.GGUFReader with arrays and the tensor table parsed in one pass: gguf builds one numpy view per array
    element, 5 million views (tens of seconds) for the released model's 248k tokens and merges, and six per tensor;
    here a scalar array is one view, a string array one list of str (kept in string_arrays by the field's offset;
    field_value reads it), and each tensor's entry is read with struct (values equal to gguf's, test_info_header)."""
    import struct

    import gguf
    from gguf import GGUFValueType as VT
    from gguf.gguf_reader import ReaderField

    u32, u64 = struct.Struct("<I").unpack_from, struct.Struct("<Q").unpack_from
    type_offset = struct.Struct("<IQ").unpack_from
    max_dims = 4  # GGML_MAX_DIMS: a larger count is a corrupt header, not a tensor

    class FastReader(gguf.GGUFReader):
        string_arrays: dict

        def _buffer(self):
            """The mapped file as mmap (slices are bytes: the fastest to decode), else a memoryview of it."""
            mapped = getattr(self.data, "_mmap", None)
            return mapped if mapped is not None else memoryview(self.data)

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
                split = split_string_array(self.data, offs, count)
                if split is not None:
                    self.string_arrays[kv_start], end = split
                    return end - orig_offs, [raw_itype, alen], [], types
                buf, end, strings = self._buffer(), len(self.data), []
                append = strings.append
                for _ in range(count):  # one by one: the exact walk, and the errors it names
                    (n,) = u64(buf, offs)
                    offs += 8
                    if offs + n > end:
                        raise ValueError("a string length points past the end of the file")
                    append(str(buf[offs:offs + n], "utf-8"))
                    offs += n
                self.string_arrays[kv_start] = strings
                return offs - orig_offs, [raw_itype, alen], [], types
            nptype = self.gguf_scalar_to_np.get(VT(item_type))
            if nptype is None:  # nested arrays: gguf's own walk
                return gguf.GGUFReader._get_field_parts(self, orig_offs, raw_type)
            values = self._get(offs, nptype, count)
            if len(values) != count:
                raise ValueError("an array points past the end of the file")
            return 12 + int(values.nbytes), [raw_itype, alen, values], [2] if count else [], types

        def _build_tensor_info(self, offs, count):
            if self.byte_order != "I":
                return super()._build_tensor_info(offs, count)
            buf, fields = self._buffer(), []
            for _ in range(int(count)):
                orig_offs = offs
                (name_len,) = u64(buf, offs)
                name_bytes = bytes(buf[offs + 8:offs + 8 + name_len])
                if len(name_bytes) != name_len:
                    raise ValueError("a tensor name points past the end of the file")
                offs += 8 + name_len
                (n_dims,) = u32(buf, offs)
                if n_dims > max_dims:
                    raise ValueError(f"tensor '{name_bytes[:80].decode('utf-8', 'replace')}' has {n_dims} "
                                     f"dimensions (GGUF allows {max_dims})")
                dims = struct.unpack_from(f"<{n_dims}Q", buf, offs + 4)
                offs += 4 + 8 * n_dims
                raw_dtype, data_offset = type_offset(buf, offs)
                offs += 12
                # the parts gguf's _build_tensors and _check_tensor_extents read, as gguf's reader types them
                parts = [np.array([name_len], np.uint64), np.frombuffer(name_bytes, np.uint8),
                         np.array([n_dims], np.uint32), np.array(dims, np.uint64), np.array([raw_dtype], np.uint32),
                         np.array([data_offset], np.uint64)]
                fields.append(ReaderField(orig_offs, str(name_bytes, "utf-8"), parts, [1, 3, 4, 5]))
            return offs, fields

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
