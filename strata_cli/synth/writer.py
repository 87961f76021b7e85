"""Stream a random-weight qwen4exp GGUF to disk, one chunk at a time (the flash-next geometry is ~190 GB)."""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

from ..errors import InputError
from ..model.geometry import ARCH
from ..sysio.files import output_path
from . import fill
from .plan import ModelPlan, build_plan
from .presets import Preset
from .recipes import Recipe

Progress = Callable[[int, int], None]  # (bytes_done, bytes_total)
# (tensor index, chunk index, elements) -> the chunk's raw bytes; chunks are fill.chunk_sizes of each tensor
ChunkSource = Callable[[int, int, int], np.ndarray]


def parse_type(ggml_type: str | int | Recipe) -> int | Recipe:
    """'Q8_0' / 'iq2_xs' / a GGML type id -> the GGML type id of the file's main tensors; a Recipe as is."""
    if isinstance(ggml_type, Recipe):
        return ggml_type
    if isinstance(ggml_type, int) and ggml_type in fill.LLAMA_FTYPE:
        return ggml_type
    key = str(ggml_type).upper()
    if key not in fill.FILE_TYPES:
        raise InputError(f"--type {ggml_type}: choose one of {', '.join(fill.FILE_TYPES)}")
    return fill.FILE_TYPES[key]


PLAN_BYTES_PER_TOKEN = 160  # Python memory of one vocabulary entry of the plan (name string, type, list slots)
PLAN_BYTES_PER_TENSOR = 1024


def _element_bytes(choice) -> float:
    """Bytes per element of the main tensors (Q8_0: 34 per 32); for a recipe, the smallest any GGML type takes."""
    import gguf

    file_type = parse_type(choice)
    if isinstance(file_type, int):
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(file_type)]
        return type_size / block
    return min(size / block for block, size in gguf.GGML_QUANT_SIZES.values())


def size_lower_bound(preset: Preset, ggml_type) -> tuple[int, int]:
    """(file bytes, planning memory bytes), both lower bounds computed arithmetically from the preset alone:
    no tensor list, tokenizer list or prime search is built, so absurd overrides are refused in microseconds."""
    p, bpe = preset, _element_bytes(ggml_type)
    file_bytes = 2 * p.vocab_size * p.hidden_size * bpe  # token_embd + output
    file_bytes += 16 * p.vocab_size  # tokenizer strings
    experts = 3 * p.num_experts * p.hidden_size * p.moe_intermediate_size
    shared = 3 * p.hidden_size * p.shared_expert_intermediate_size
    file_bytes += p.num_hidden_layers * (experts + shared) * bpe
    if p.ple_layer is not None:
        file_bytes += p.ple_heads * p.ngram_vocab_size_base * p.ple_head_dim * bpe
    memory = p.vocab_size * PLAN_BYTES_PER_TOKEN + p.num_hidden_layers * 40 * PLAN_BYTES_PER_TENSOR
    return int(file_bytes), int(memory)


def estimate_size(preset: Preset, ggml_type: str | int | Recipe) -> int:
    """Exact size in bytes of the file write_model produces (header included)."""
    return build_plan(preset, parse_type(ggml_type)).file_bytes()


def write_model(out_path, preset: Preset, *, seed: int = 0, ggml_type: str | int | Recipe = "F32",
                progress: Progress | None = None) -> Path:
    """Write a random-weight model for `preset`; it appears at out_path only once complete."""
    plan = build_plan(preset, parse_type(ggml_type))
    out = Path(out_path)
    # a locked temporary file beside OUT, removed on any exception (Ctrl-C, SIGTERM/SIGHUP via the CLI, a full
    # disk); a second writer of the same OUT is refused
    with output_path(out, what="model") as partial:
        write_plan(plan, partial, _random_chunks(plan, seed), progress)
    return out


def _random_chunks(plan: ModelPlan, seed: int) -> ChunkSource:
    def chunk(ti: int, ci: int, n: int) -> np.ndarray:
        t = plan.tensors[ti]
        return fill.chunk_bytes(t.init, t.ggml_type, n, seed, ti, ci)

    return chunk


def _open_writer(plan: ModelPlan, path: Path) -> gguf.GGUFWriter:
    writer = gguf.GGUFWriter(path, arch=ARCH)
    for t in plan.tensors:
        # logical numpy-order shape; the writer stores it reversed (ne0 first)
        writer.add_tensor_info(t.name, tuple(reversed(t.shape)), np.dtype(np.float32), t.nbytes,
                               raw_dtype=gguf.GGMLQuantizationType(t.ggml_type))
    for key, value, vtype, sub_type in plan.kvs:
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    return writer


def _chunk_jobs(plan: ModelPlan):
    """(tensor index, chunk index, elements, last chunk of its tensor?) in file order."""
    for ti, t in enumerate(plan.tensors):
        sizes = fill.chunk_sizes(t.n_elements)
        for ci, n in enumerate(sizes):
            yield ti, ci, n, ci == len(sizes) - 1


def write_plan(plan: ModelPlan, path: Path, chunks: ChunkSource, progress: Progress | None) -> None:
    """Write the GGUF of `plan` to `path`: the header, then every tensor's chunks from `chunks`, generated ahead on
    all cores and written in file order."""
    total = plan.file_bytes()
    writer = _open_writer(plan, path)
    try:
        fout = writer.fout[0]
        writer.write_padding(fout, fout.tell())  # tensor data starts aligned
        if fout.tell() != plan.header_bytes():
            raise AssertionError(f"header is {fout.tell()} bytes, planned {plan.header_bytes()}")
        done = fout.tell()
        if progress:
            progress(done, total)
        workers = min(os.cpu_count() or 1, 16)
        with ThreadPoolExecutor(workers) as pool:
            pending: deque = deque()

            def drain_one() -> int:
                future, tensor, last = pending.popleft()
                data = future.result()
                fout.write(data)
                if last:
                    writer.write_padding(fout, tensor.nbytes)
                return fout.tell()

            # generate ahead on all cores, write in order; memory stays at about one chunk per worker
            for ti, ci, n, last in _chunk_jobs(plan):
                t = plan.tensors[ti]
                pending.append((pool.submit(chunks, ti, ci, n), t, last))
                if len(pending) >= workers + 2:
                    done = drain_one()
                    if progress:
                        progress(done, total)
            while pending:
                done = drain_one()
                if progress:
                    progress(done, total)
        if done != total:
            raise AssertionError(f"wrote {done} bytes, planned {total}")
        fout.flush()
    finally:
        writer.close()
