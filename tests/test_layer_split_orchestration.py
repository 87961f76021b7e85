"""engine/gpu/layer_split.GPUSplitEngine's orchestration on the CPU: its stages are stand-ins that run numpy
stages (ReferenceEngine over the same layer ranges) behind the calls GPUSplitEngine makes of a GPUEngine, and CuPy
and the CUDA runtime are stand-ins that log every launch, event, wait and peer copy on a simulated clock. Checked:
the hand-off copies exactly the window's rows of R into the next stage before that stage launches (its stream
waits for the hand-off's event), the head is the last stage's, commit reaches every stage, and the per-stage and
hand-off times are the events' (the device run of the same engine: tests/test_gpu_layer_split.py)."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
from spec_windows import speculative_run

from strata_cli.engine.contract import Capabilities, WindowResult
from strata_cli.engine.layer_plan import SplitConfig, plan_split
from strata_cli.engine.reference import ReferenceEngine
from strata_cli.model.gguf_file import open_model

LAUNCH_MS, COPY_MS, COMMIT_MS = 1.0, 0.25, 0.5


class _Sim:
    """The simulated device: a clock, a log, and device pointers -> host arrays."""

    def __init__(self):
        self.clock, self.log, self.memory, self.device = 0.0, [], {}, 0

    def register(self, arr):
        ptr = 0x1000 * (len(self.memory) + 1)
        self.memory[ptr] = arr
        return SimpleNamespace(data=SimpleNamespace(ptr=ptr), arr=arr)


class _Stream:
    def __init__(self, sim, name):
        self.sim, self.name, self.ptr = sim, name, id(self)

    def wait_event(self, event):
        self.sim.log.append(("wait", self.name, event.name))

    def synchronize(self):
        pass


class _Event:
    def __init__(self, sim):
        self.sim, self.t, self.name = sim, None, None

    def record(self, stream):
        self.t = self.sim.clock
        self.sim.log.append(("event", stream.name, self.name))


class _Stage:
    """What GPUSplitEngine calls of a GPUEngine, run by a numpy stage."""

    capabilities = Capabilities(graphs=True, eager=True)

    def __init__(self, sim, model, n_ctx=None, max_t=None, layers=None, tiers=None):
        assert tiers is None  # these stages keep every expert in VRAM (tiers per stage: test_tier_windows_cpu.py)
        self.sim, self.device = sim, sim.device
        self.ref = ReferenceEngine(model, n_ctx=n_ctx, max_t=max_t or 16, layers=layers)
        self.model, self.g, self.n_ctx, self.max_t, self.layers = model, model.geometry, self.ref.n_ctx, 16, layers
        g = self.g
        self.name = f"stage{layers[0]}"
        self.stream = _Stream(sim, self.name)
        self.buf = {"R": sim.register(np.full((16, g.hc, g.n_embd), np.nan, np.float32)),
                    "logits": np.full((16, g.n_vocab), np.nan, np.float32)}
        self.stage = SimpleNamespace(out_ids=SimpleNamespace(host=np.full(16, -1, np.int32)))
        self.capture_ms, self.n_past, self._pending = {}, 0, None
        self.tiers, self.tier_note = None, None

    def stage_window(self, tokens):
        self.tokens = np.asarray(tokens)
        return len(tokens)

    def launch_window(self, T, eager=False):
        assert self.sim.device == self.device, "launched with another device current"
        hand_in = None if self.layers[0] == 0 else self.buf["R"].arr[:T].astype(np.float64).copy()
        assert hand_in is None or np.isfinite(hand_in).all(), "the hand-off did not fill R before the launch"
        out = self.ref.stage_run(self.tokens, hand_in)
        if isinstance(out, WindowResult):
            self.buf["logits"][:T] = out.logits
            self.stage.out_ids.host[:T] = out.ids
        else:
            self.buf["R"].arr[:T] = out
        self.buf["R"].arr[T:] = np.nan  # rows past T: never handed on
        self.sim.clock += LAUNCH_MS
        self.sim.log.append(("launch", self.name, T, eager))

    def graph(self, T, profile=False):
        assert self.sim.device == self.device, "captured with another device current"
        self.sim.log.append(("capture", self.name, T))

    def launch_commit(self, n_keep, eager=False):
        self.ref.commit(n_keep)
        self.sim.clock += COMMIT_MS
        self.sim.log.append(("commit", self.name, n_keep))

    def reset(self):
        self.ref.reset()
        self.n_past = 0

    def wait_commit(self):
        assert self.sim.device == self.device, "waited with another device current"
        self.sim.log.append(("wait_commit", self.name))

    def _synchronize(self):
        self.sim.log.append(("sync", self.name))

    def close(self):
        self.sim.log.append(("close", self.name))

    def _nonfinite_rows(self, T):
        return None


@pytest.fixture
def simulated(monkeypatch):
    from strata_cli.engine.gpu import layer_split as ls

    sim = _Sim()

    @contextmanager
    def device(d):
        before, sim.device = sim.device, d
        try:
            yield
        finally:
            sim.device = before

    def peer_copy(dst, dst_dev, src, src_dev, nbytes, stream):
        d, s = sim.memory[dst].reshape(-1).view(np.uint8), sim.memory[src].reshape(-1).view(np.uint8)
        d[:nbytes] = s[:nbytes]
        sim.clock += COPY_MS
        sim.log.append(("copy", src_dev, dst_dev, nbytes))
        return (0,)

    cuda = SimpleNamespace(Device=device, Event=lambda: _Event(sim),
                           get_elapsed_time=lambda a, b: b.t - a.t)
    fake_cp = SimpleNamespace(cuda=cuda, asnumpy=np.asarray)
    rt = SimpleNamespace(cudaMemcpyPeerAsync=peer_copy, cudaDeviceCanAccessPeer=lambda a, b: (0, 1),
                         cudaDeviceEnablePeerAccess=lambda d, f: (0,),
                         cudaError_t=SimpleNamespace(cudaErrorPeerAccessAlreadyEnabled=704))
    monkeypatch.setattr(ls, "cupy", lambda: fake_cp)
    monkeypatch.setattr(ls, "cudart", lambda: rt)
    monkeypatch.setattr(ls, "GPUEngine", lambda model, **kw: _Stage(sim, model, **kw))
    monkeypatch.setattr(ls, "_load_kernels", lambda stage: None)
    return sim


def _engine(model, counts, devices):
    from strata_cli.engine.gpu.layer_split import GPUSplitEngine

    plan = plan_split(SplitConfig(len(counts), counts, devices), model, max(devices) + 1)
    engine = GPUSplitEngine(model, plan)
    for p, ev in zip(plan, engine.events):  # name the events for the log
        for k, e in ev.items():
            e.name = f"{k}{p.index}"
    return engine


@pytest.fixture(scope="module")
def model(fixture_dir):
    return open_model(fixture_dir / "model-f32.gguf")


@pytest.mark.parametrize("counts, devices", [((3, 5), (0, 0)), ((3, 5), (0, 1)), ((1, 3, 4), (0, 1, 2))])
def test_split_orchestration_equals_one_engine(simulated, model, fixture_dir, counts, devices):
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    engine = _engine(model, counts, devices)
    got, got_ids = speculative_run(engine, tokens, np.random.default_rng(3), 16, allow_zero=True)
    want, want_ids = speculative_run(ReferenceEngine(model), tokens, np.random.default_rng(3), 16, allow_zero=True)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_ids, want_ids)
    assert engine.n_past == len(tokens) and all(s.n_past == len(tokens) for s in engine.stages)
    if len(set(devices)) > 1:
        assert "peer copy" in engine.split_note


def test_window_order_handoff_rows_and_times(simulated, model, fixture_dir):
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    engine = _engine(model, (2, 3, 3), (0, 1, 2))
    g = model.geometry
    timer = engine.window_timer()
    assert simulated.log[-3:] == [("capture", s.name, 1) for s in engine.stages]  # before the first timed window
    simulated.log.clear()
    ms, _ = timer(engine, tokens[:5], 0, 3)
    names = [s.name for s in engine.stages]
    want = [("wait_commit", name) for name in names]  # a commit() before this window is not timed
    want += [("event", names[-1], None)]  # the begin event, on the last device while idle
    for i, name in enumerate(names):
        if i:
            want.append(("wait", name, f"hand{i - 1}"))
        want += [("event", name, f"start{i}"), ("launch", name, 5, False), ("event", name, f"end{i}")]
        if i + 1 < len(names):
            want += [("copy", i, i + 1, 5 * g.hc * g.n_embd * 4), ("event", name, f"hand{i}")]
    for i, name in enumerate(names):
        want += [("commit", name, 3), ("event", name, f"commit{i}")]
    want += [("wait", names[-1], f"commit{i}") for i in range(len(names) - 1)] + [("event", names[-1], None)]
    want += [("sync", name) for name in names]
    assert simulated.log == want
    stage_ms, hand_ms = engine.stage_times[5][-1]
    assert stage_ms == [LAUNCH_MS] * 3 and hand_ms == [COPY_MS] * 2
    assert ms == 3 * LAUNCH_MS + 2 * COPY_MS + 3 * COMMIT_MS
    assert engine.n_past == 3 and all(s.n_past == 3 for s in engine.stages)
    report = engine.stage_report(5, 1)
    assert [r["device"] for r in report] == [0, 1, 2] and report[0]["handoff_ms_median"] == COPY_MS
    simulated.log.clear()
    engine.close()
    assert simulated.log == [("close", n) for n in names]


def test_commit_checks_the_window(simulated, model, fixture_dir):
    from strata_cli.errors import InputError

    engine = _engine(model, (4, 4), (0, 0))
    with pytest.raises(InputError, match="commit without a window"):
        engine.commit(1)
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    engine.run(tokens[:4], 0)
    with pytest.raises(InputError, match="outside 0..4"):
        engine.commit(5)
    engine.commit(4)
    assert engine.n_past == 4


def test_commit_is_not_waited_for(simulated, model, fixture_dir):
    """commit() launches every stage's commit and returns (GPUEngine's asynchronous commit): no stream is
    synchronised after it; the next window's launches follow on each stage's stream, then one wait per stage."""
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    engine = _engine(model, (3, 5), (0, 1))
    names = [s.name for s in engine.stages]
    engine.run(tokens[:4], 0)
    simulated.log.clear()
    engine.commit(2)
    assert simulated.log == [entry for i, name in enumerate(names)
                             for entry in (("commit", name, 2), ("event", name, f"commit{i}"))]
    simulated.log.clear()
    engine.run(tokens[2:5], 2)
    assert [e for e in simulated.log if e[0] in ("launch", "sync")] == [
        *(("launch", name, 3, False) for name in names), *(("sync", name) for name in names)]
    simulated.log.clear()
    engine.wait_commit()
    assert simulated.log == [("wait_commit", name) for name in names]
