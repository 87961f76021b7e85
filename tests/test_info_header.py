"""`strata info` reads the header only: gguf's field walk replaced by a one-pass parse of arrays (same values), a
sparse file of the full size opens without reading tensor data, floats as people write them, parameter counts."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import random
import struct
import subprocess
import sys
import time

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from strata_cli.cli import main
from strata_cli.model import quants as Q
from strata_cli.model.gguf_file import _fast_reader_class, _read_metadata, field_value, open_model, \
    split_string_array
from strata_cli.model.names import PLE_TABLE
from strata_cli.synth.plan import build_plan
from strata_cli.synth.presets import load_preset
from strata_cli.synth.writer import _open_writer


@pytest.mark.parametrize("name", ["model-f32.gguf", "model-q8_0.gguf", "model-bf16.gguf"])
def test_fast_header_parse_gives_gguf_readers_values(fixture_dir, name):
    path = str(fixture_dir / name)
    assert open_model(path).metadata == _read_metadata(gguf.GGUFReader(path), path)


def sparse_model(path, preset: str, ggml_type: int = Q.Q8_0) -> int:
    """The header of a preset's model and a hole for all its tensor data (no data block is ever written)."""
    plan = build_plan(load_preset(preset), ggml_type)
    _open_writer(plan, path).close()
    os.truncate(path, plan.file_bytes())
    return plan.file_bytes()


def test_info_of_a_sparse_model_reads_no_tensor_data(tmp_path):
    path = tmp_path / "small.gguf"
    size = sparse_model(path, "small")
    assert os.stat(path).st_blocks * 512 < size // 10  # a hole: reading its data would be all zeros anyway
    start = time.perf_counter()
    model = open_model(path)
    elapsed = time.perf_counter() - start
    assert model.file_size == size and len(model.metadata["tokenizer.ggml.tokens"]) == 32768
    assert elapsed < 5, elapsed  # a loaded 2-core CI box; about 0.1 s on an idle one
    result = CliRunner().invoke(main, ["info", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    meta = json.loads(result.stdout)["meta"]
    assert meta["geometry"]["eps"] == 1e-06 and meta["geometry"]["attention"]["rope_base"] == 1e7


def test_info_floats_and_parameter_counts(fixture_dir):
    result = CliRunner().invoke(main, ["info", str(fixture_dir / "model-f32.gguf")])
    assert result.exit_code == 0, result.output
    assert "| eps               | 1e-06 " in result.stdout
    assert "9.99999" not in result.stdout
    model = open_model(fixture_dir / "model-f32.gguf")
    from strata_cli.model.info import parameter_counts

    counts = parameter_counts(model)
    g = model.geometry
    total = sum(int(t.raw.size) if t.ggml_type == Q.F32 else 0 for t in model.tensors.values())
    routed = sum(int(t.raw.size) for name, t in model.tensors.items() if "_exps." in name)
    embd = model.tensors["token_embd.weight"].shape
    assert counts["params_total"] == total  # F32: one element per value
    ple = model.tensors.get(PLE_TABLE)
    expected = total - routed + routed * g.n_expert_used // g.n_expert - embd[0] * embd[1] + embd[0]
    if ple is not None:
        expected += -ple.shape[0] * ple.shape[1] + ple.shape[0] * g.ple.n_heads
    assert counts["params_active"] == expected
    assert "4.74M parameters (" in result.stdout and " active per token)" in result.stdout


def walk_strings(buf: bytes, offs: int, count: int):
    """The reference: GGUF strings one by one (u64 length, UTF-8 bytes)."""
    out = []
    for _ in range(count):
        (n,) = struct.unpack_from("<Q", buf, offs)
        out.append(buf[offs + 8:offs + 8 + n].decode("utf-8"))
        offs += 8 + n
    return out, offs


def test_vectorized_string_split_is_the_walk_or_declines():
    """The one-pass split of a string array (no Python loop over 500k tokens) gives exactly the walk's strings and
    end offset, or None (then the reader walks): empty strings, NUL runs, multibyte characters cut at string
    boundaries, 0xFF and other invalid bytes, long strings, junk before and after."""
    rng = random.Random(19)
    pieces = [b"a", b"\xc4\xa0", b"\xe4\xb8\xad", b"\xf0\x9f\x98\x80", b"\x00", b"\x00" * 5, b"\xff", b"\xe4\xb8",
              b"\xad", b" ", b"z" * 300]
    fast = declined = 0
    for _ in range(3000):
        pool = pieces[:rng.choice([1, 4, 5, 9, 11])]
        strings = [b"".join(rng.choice(pool) for _ in range(rng.choice([0, 1, 2, 5])))
                   for _ in range(rng.randint(0, 30))]
        pre = bytes(rng.randrange(256) for _ in range(rng.randint(0, 9)))
        post = bytes(rng.choice([0, 0, 7, 255]) for _ in range(rng.randint(0, 24)))
        buf = pre + b"".join(struct.pack("<Q", len(b)) + b for b in strings) + post
        got = split_string_array(memoryview(buf), len(pre), len(strings))
        try:
            want = walk_strings(buf, len(pre), len(strings))
        except UnicodeDecodeError:
            want = None
        if got is None:
            declined += 1
        else:
            fast += 1
            assert got == want, (strings, got, want)
    assert fast > 500 and declined > 500, (fast, declined)  # both paths exercised
    text = ["Ġthe", "中文", "", "a" * 70000, "x"] * 1000  # a tokenizer-like list: the fast path takes it
    buf = b"".join(struct.pack("<Q", len(t.encode())) + t.encode() for t in text)
    assert split_string_array(memoryview(buf), 0, len(text)) == (text, len(buf))


def test_reader_walks_what_the_split_declines(tmp_path):
    """A token list the split declines (a string of NUL bytes) is read by the walk: the same values as gguf's."""
    path = str(tmp_path / "nul.gguf")
    tokens = ["a", "\x00" * 9, "", "中", "b"] * 50
    writer = gguf.GGUFWriter(path, "qwen4exp")
    writer.add_token_list(tokens)
    writer.add_array("test.merges", ["a b", "c d"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    reader = _fast_reader_class()(path, "r")
    field = reader.fields["tokenizer.ggml.tokens"]
    assert field_value(reader, field) == tokens == gguf.GGUFReader(path, "r").fields["tokenizer.ggml.tokens"].contents()
    assert field_value(reader, reader.fields["test.merges"]) == ["a b", "c d"]


def resident_bytes(path, start: int, end: int) -> int:
    """Bytes of path[start:end) in the page cache (mincore over a fresh mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = mmap.PAGESIZE
    start += -start % page  # the first whole page of the range: the header's last page holds the header
    length = end - start
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        vec = ctypes.create_string_buffer((length + page - 1) // page)
        assert libc.mincore(addr, length, vec) == 0, os.strerror(ctypes.get_errno())
        libc.munmap(addr, length)
    finally:
        os.close(fd)
    return int((np.frombuffer(vec.raw, np.uint8) & 1).sum()) * page


def test_info_reads_no_tensor_data_and_imports_no_writer(tmp_path):
    """`strata info` of a full-size file (issue 19: a 50 GB file's metadata in under a second) reads the header
    only: after it, the file's tensor data is not in the page cache (a sha256, a whole-file read or a dequantized
    tensor would bring it in), and the command imported neither the synthetic-model writer, the engines, the
    tokenizer library nor rich's progress bars (stderr is no terminal). The header itself is parsed without a Python
    loop per token (test_vectorized_string_split_is_the_walk_or_declines)."""
    path = tmp_path / "flash-next.gguf"
    size = sparse_model(path, "flash-next", Q.Q2_K)
    assert size > 50e9
    data_start = _fast_reader_class()(str(path), "r").data_offset  # the header's end (gguf's own reader: 15 s)
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # what that read (and its read-ahead) brought in
    os.close(fd)
    assert resident_bytes(path, data_start, size) == 0
    script = ("import sys\nfrom strata_cli.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
              "    code = e.code\nprint(' '.join(sorted(sys.modules)), file=sys.stderr)\nsys.exit(code)\n")
    proc = subprocess.run([sys.executable, "-c", script, "info", str(path), "--format", "json"], capture_output=True,
                          text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stderr
    meta = json.loads(proc.stdout)["meta"]
    assert meta["file_bytes"] == size and meta["tokenizer"]["tokens"] == 248320 and meta["params_total"] > 1e11
    modules = set(proc.stderr.split())
    for unwanted in ("strata_cli.synth", "strata_cli.engine", "strata_cli.tiers", "strata_cli.gpu",
                     "strata_cli.analysis", "tokenizers", "rich.progress", "cupy"):
        assert unwanted not in modules, f"strata info imported {unwanted}"
    # the header pages and what the kernel reads ahead of them; never the tensor data (tens of GB)
    assert resident_bytes(path, data_start, size) < 8 << 20
