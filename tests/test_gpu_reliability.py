"""GPU side of issue 9: the head's argmax pass flags rows holding NaN/Inf (kernels/sampling.cu, written into mapped
host memory), the GPU engine reports them, and its arena is refused against free VRAM (test_reliability_input).

Outputs are poisoned first (ids and flags -7), so a flag the kernel forgets to write fails the test.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFReader
from kernel_helpers import poisoned, to_dev

from strata_cli.ops import sampling

pytestmark = pytest.mark.gpu


def _sprinkle(rng, logits, rows, values=(np.nan, np.inf, -np.inf)):
    """Put one non-finite value at a random column of each of `rows`."""
    for t in rows:
        logits[t, rng.integers(0, logits.shape[1])] = values[t % len(values)]


@pytest.mark.parametrize("T", (1, 3, 7, 16))
@pytest.mark.parametrize("V", (1, 257, 5000, 300001))
def test_argmax_flags_nonfinite_rows_like_numpy(T, V):
    from strata_cli.gpu import launch_sampling

    rng = np.random.default_rng(7 * T + V)
    logits = rng.standard_normal((T, V)).astype(np.float32)
    _sprinkle(rng, logits, [t for t in range(T) if t % 2 == 1])
    ids, flags = poisoned((T,), np.int32), poisoned((T,), np.int32)
    launch_sampling.argmax_rows(to_dev(logits), out=ids, nonfinite=flags)
    np.testing.assert_array_equal(flags.get(), sampling.nonfinite_rows(logits))
    finite = sampling.nonfinite_rows(logits) == 0
    np.testing.assert_array_equal(ids.get()[finite], sampling.argmax_rows(logits)[finite])
    # no `nonfinite` given: the scratch's row flags take them
    scratch = launch_sampling.ArgmaxScratch.empty()
    scratch.row_bad.fill(-7)
    launch_sampling.argmax_rows(to_dev(logits), out=ids, scratch=scratch)
    np.testing.assert_array_equal(scratch.row_bad[:T].get(), sampling.nonfinite_rows(logits))


def test_all_finite_rows_flag_nothing_and_all_nan_rows_flag_all():
    from strata_cli.gpu import launch_sampling

    logits = np.random.default_rng(3).standard_normal((5, 4099)).astype(np.float32)
    flags = poisoned((5,), np.int32)
    launch_sampling.argmax_rows(to_dev(logits), nonfinite=flags)
    assert flags.get().tolist() == [0] * 5
    logits[:] = np.nan
    ids = poisoned((5,), np.int32)
    launch_sampling.argmax_rows(to_dev(logits), out=ids, nonfinite=flags)
    assert flags.get().tolist() == [1] * 5 and ids.get().tolist() == [-1] * 5


def _poison_router(fixture_dir, tmp_path):
    bad = tmp_path / "nan-router.gguf"
    shutil.copyfile(fixture_dir / "model-f32.gguf", bad)
    reader = GGUFReader(str(bad), "r+")
    tensor = next(t for t in reader.tensors if t.name == "blk.1.ffn_gate_inp.weight")
    tensor.data[...] = np.nan
    tensor.data.flush()
    del reader
    return bad


def test_gpu_engine_reports_nonfinite_windows_graph_and_eager(fixture_dir, tmp_path):
    from strata_cli.engine.gpu import GPUEngine
    from strata_cli.model.gguf_file import open_model

    clean = GPUEngine(open_model(fixture_dir / "model-f32.gguf"), n_ctx=64)
    for eager in (False, True):
        clean.reset()
        assert clean.run(np.array([1, 2, 3]), 0, eager=eager).nonfinite is None
    engine = GPUEngine(open_model(_poison_router(fixture_dir, tmp_path)), n_ctx=64)
    for eager in (False, True):
        engine.reset()
        result = engine.run(np.array([1, 2, 3]), 0, eager=eager, logits=False)  # the flag needs no logits copy
        assert result.nonfinite and result.nonfinite.startswith("the logits (window rows 0, 1, 2")


def test_gpu_logprobs_and_bench_exit_4_on_nan_model(fixture_dir, tmp_path):
    from strata_cli.cli import main

    bad = _poison_router(fixture_dir, tmp_path)
    for args in (["logprobs", bad, "--random", 9, "--device", "gpu"],
                 ["verify-bench", bad, "--window", "1,2", "-r", 1, "--device", "gpu"]):
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == 4, result.output
        errors = [line for line in result.stderr.splitlines() if line.startswith("strata: error: ")]
        assert len(errors) == 1 and "non-finite" in errors[0] and "the logits" in errors[0], result.stderr
