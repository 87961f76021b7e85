"""`strata info` reads the header only: gguf's field walk replaced by a one-pass parse of arrays (same values), a
sparse file of the full size opens without reading tensor data, floats as people write them, parameter counts."""

from __future__ import annotations

import json
import os
import time

import gguf
import pytest
from click.testing import CliRunner

from strata_cli.cli import main
from strata_cli.model import quants as Q
from strata_cli.model.gguf_file import _read_metadata, open_model
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
