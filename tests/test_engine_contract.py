"""The engine contract (engine/contract.py) held by both engines: run/commit/reset/n_past, what a window returns,
sample, window_timer and capabilities; and two GPU engines on two streams, which must share no workspace."""

from __future__ import annotations

import numpy as np
import pytest

from strata_cli.engine import Capabilities, Engine, WindowResult, make_engine
from strata_cli.engine.reference import ReferenceEngine
from strata_cli.errors import InputError
from strata_cli.model.gguf_file import open_model
from strata_cli.ops.sampling import sample_rows


def _gpu(model, **kw):
    from strata_cli.engine.gpu import GPUEngine

    return GPUEngine(model, **kw)


def check_contract(engine, want_logits: np.ndarray, tokens: np.ndarray, rtol: float) -> None:
    """Drive `engine` through every part of the contract; want_logits [N, V] are the one-pass logits of tokens."""
    assert isinstance(engine, Engine)
    assert isinstance(engine.capabilities, Capabilities)
    assert engine.device in ("cpu", "gpu") and engine.n_ctx >= len(tokens)
    scale = np.abs(want_logits).max()
    engine.reset()
    assert engine.n_past == 0
    first = engine.run(tokens[:5], 0)
    assert isinstance(first, WindowResult) and first.pos0 == 0
    np.testing.assert_array_equal(first.tokens, tokens[:5])
    assert first.logits.shape == (5, engine.g.n_vocab) and first.logits.dtype == np.float32
    np.testing.assert_allclose(first.logits, want_logits[:5], rtol=0, atol=rtol * scale)
    np.testing.assert_array_equal(first.ids, first.logits.argmax(axis=1))
    assert engine.n_past == 0  # run() alone does not advance the sequence
    engine.commit(3)
    assert engine.n_past == 3
    with pytest.raises(InputError, match="commit without a window"):
        engine.commit(1)
    with pytest.raises(InputError, match="starts at position 5"):
        engine.run(tokens[3:6], 5)
    second = engine.run(tokens[3:9], 3)
    assert second.pos0 == 3
    np.testing.assert_allclose(second.logits, want_logits[3:9], rtol=0, atol=rtol * scale)
    for temperature, seed in [(0.0, 1), (0.8, 7), (1.3, 2**33 + 5)]:
        want = sample_rows(second.logits, 3 + np.arange(6), temperature, seed)
        np.testing.assert_array_equal(engine.sample(second, temperature, seed), want)
    engine.commit(6)
    timer = engine.window_timer()
    ms, host_ms = timer(engine, tokens[9:13], engine.n_past, 2)
    assert ms > 0 and host_ms > 0 and engine.n_past == 11
    assert engine.capabilities.graphs == bool(engine.capture_ms)  # the timer replayed a captured graph, or none
    if not engine.capabilities.eager:
        with pytest.raises(InputError, match="--device gpu"):
            engine.window_timer(eager=True)
    engine.reset()
    assert engine.n_past == 0
    again = engine.run(tokens[:5], 0)
    np.testing.assert_array_equal(again.logits, first.logits)  # reset leaves nothing behind


def test_reference_engine_holds_the_contract(fixture_dir):
    model = open_model(fixture_dir / "model-f32.gguf")
    tokens = np.load(fixture_dir / "reference.npz")["tokens"][:16]
    engine = make_engine(model, "cpu")
    assert isinstance(engine, ReferenceEngine)
    assert engine.capabilities == Capabilities(graphs=False, eager=False)
    check_contract(engine, ReferenceEngine(model).run(tokens, 0).logits, tokens, rtol=1e-5)


@pytest.mark.gpu
def test_gpu_engine_holds_the_contract(fixture_dir):
    model = open_model(fixture_dir / "model-q8_0.gguf")
    tokens = np.load(fixture_dir / "reference.npz")["tokens"][:16]
    engine = make_engine(model, "gpu")
    assert engine.capabilities == Capabilities(graphs=True, eager=True)
    check_contract(engine, ReferenceEngine(model).run(tokens, 0).logits, tokens, rtol=1e-3)


@pytest.mark.gpu
def test_two_engines_on_two_streams_share_no_workspace(tmp_path):
    """Each engine's split-K partials and tile counters come from its own arena: windows of two engines replayed
    concurrently on their own streams give the bits each gives alone. The model's hyper-connection GEMVs (n_in
    2048, few rows) split over grid z, the path whose workspace used to be one per process."""
    from strata_cli.gpu import launch_util as U
    from strata_cli.gpu.runtime import cupy
    from strata_cli.ops.hyper import DN_ROW_GROUP
    from strata_cli.synth import load_preset, write_model

    preset = load_preset("small").with_overrides(layers=4, vocab=4096)
    path = tmp_path / "small-bf16.gguf"
    write_model(path, preset, seed=5, ggml_type="BF16")
    model = open_model(path)
    g = model.geometry
    n_dn = -(-(g.hc_lowrank + g.hc) // DN_ROW_GROUP) * DN_ROW_GROUP  # the stacked down + inject rows
    assert U.gemv_split(n_dn, g.hc * g.n_embd, max_z=U.GEMV_MAX_ZSPLIT)[1] > 1  # the path under test
    engines = [_gpu(model), _gpu(model)]
    a, b = engines
    assert a.stream.ptr != b.stream.ptr
    assert a.buf["gemv_tiles"].data.ptr != b.buf["gemv_tiles"].data.ptr
    rng = np.random.default_rng(2)
    plans = [[(rng.integers(0, g.n_vocab, 16), int(rng.integers(1, 17))) for _ in range(12)] for _ in engines]

    alone = []
    for eng, plan in zip(engines, plans):
        eng.reset()
        rows = []
        for tokens, keep in plan:
            rows.append(eng.run(tokens, eng.n_past).logits)
            eng.commit(keep)
        alone.append(rows)

    for eng in engines:
        eng.reset()
    together = [[], []]
    for step in range(len(plans[0])):
        for eng, plan in zip(engines, plans):  # both windows in flight at once
            eng.launch_window(eng.stage_window(plan[step][0]))
        for i, eng in enumerate(engines):
            eng.stream.synchronize()
            together[i].append(cupy().asnumpy(eng.buf["logits"][:16]))
        for eng, plan in zip(engines, plans):  # both commits in flight at once
            eng.launch_commit(plan[step][1])
        for eng, plan in zip(engines, plans):
            eng.stream.synchronize()
            eng.n_past += plan[step][1]
    for i in range(2):
        for step, (got, want) in enumerate(zip(together[i], alone[i])):
            np.testing.assert_array_equal(got, want, err_msg=f"engine {i}, window {step}")


def _fake_cupy(monkeypatch, error: Exception):
    """A CuPy that imports but whose CUDA runtime fails, as on a machine with a broken driver."""
    import importlib.machinery
    import sys
    import types

    def device_count():
        raise error

    cp = types.ModuleType("cupy")
    cp.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
    cp.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=device_count))
    monkeypatch.setitem(sys.modules, "cupy", cp)


def test_gpu_probe_names_a_broken_cuda_stack(monkeypatch):
    from strata_cli import engine

    _fake_cupy(monkeypatch, RuntimeError("cudaErrorInsufficientDriver: driver too old\nsecond line"))
    installed, why = engine.gpu_probe()
    assert installed and why == "CuPy is installed but unusable: RuntimeError: cudaErrorInsufficientDriver: driver too old"


def test_device_auto_says_why_it_falls_back_when_the_gpu_stack_is_broken(monkeypatch, fixture_dir):
    from click.testing import CliRunner

    from strata_cli import engine
    from strata_cli.cli import main

    model = str(fixture_dir / "model-q8_0.gguf")
    args = ["logprobs", model, "--random", "5", "--device", "auto"]
    monkeypatch.setattr(engine, "gpu_probe", lambda: (True, "CuPy is installed but sees no CUDA device"))
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("strata: warning:")]
    assert warnings == ["strata: warning: --device auto: CuPy is installed but sees no CUDA device; running the "
                        "numpy engine (--device cpu)"]
    monkeypatch.setattr(engine, "gpu_probe", lambda: (False, "CuPy is not installed"))  # nothing to fix: no line
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0 and "warning" not in result.stderr
    monkeypatch.setattr(engine, "gpu_probe", lambda: (True, None))
    assert engine.resolve_device("auto") == "gpu"
