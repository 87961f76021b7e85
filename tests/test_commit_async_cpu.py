"""GPUEngine's asynchronous commit on the CPU: the real engine/gpu/engine.py (construction, warm-up, run, commit,
launch_commit, stage_window, reset, read_state, close, the event timer, the tiered launch) over a simulated stream,
with CuPy, the window and commit recorders and the captured graphs replaced by stand-ins.

The simulated stream queues every launch and runs it only when the host waits (a stream synchronize, or an event
synchronize up to that event), as the GPU runs work after the host moved on. The window and the commit run the numpy
ReferenceEngine (the "device") with what they read at run time: the window the mapped tokens and positions, the
commit the mapped n_keep. So a host that rewrote n_keep under a queued commit, or a window staged at the wrong
position, changes the logits; and every host-side write and read checks, as it happens, that no commit it could
race is still queued. Checked: the windows equal the numpy engine's bit for bit (eager and graph), commit() leaves
its commit queued with no host wait after it, the next window's staging happens while it is queued, the next write
of n_keep comes after the commit's event, and reset, read_state, close, the timer and a tiered window's host wait
for it; the real commit recorder reads no mapped buffer but n_keep. The device run (async against a synchronous
commit, bit for bit): tests/test_gpu_commit_async.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from spec_windows import speculative_run

from strata_cli.engine.reference import ReferenceEngine


class Sim:
    def __init__(self):
        self.log: list[tuple] = []
        self.stream: Stream | None = None

    def queued(self, kind: str) -> bool:
        return any(label == kind for label, _ in self.stream.queue)


class Stream:
    def __init__(self, sim):
        self.sim, self.queue, self.ptr = sim, [], 101

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def enqueue(self, label: str, op) -> None:
        self.queue.append((label, op))
        self.sim.log.append(("launch", label))

    def run_until(self, op=None) -> None:
        while self.queue:
            label, queued = self.queue.pop(0)
            queued()
            self.sim.log.append(("ran", label))
            if queued is op:
                return

    def synchronize(self) -> None:
        self.sim.log.append(("sync",))
        self.run_until()


class Event:
    def __init__(self, sim):
        self.sim, self.op, self.stream = sim, None, None
        self.done = True

    def record(self, stream) -> None:
        self.done, self.stream = False, stream

        def reached():
            self.done = True

        self.op = reached
        stream.enqueue("event", reached)

    def synchronize(self) -> None:
        self.sim.log.append(("event_sync",))
        if not self.done:
            self.stream.run_until(self.op)


class Logged(np.ndarray):
    """A host or device array whose writes the simulation checks and logs (name: what it is)."""

    def __setitem__(self, key, value):
        sim, name = self.sim, self.name
        if name == "n_keep":
            assert not sim.queued("commit"), "the host rewrote the mapped n_keep under a queued commit"
        sim.log.append(("write", name))
        super().__setitem__(key, value)

    def fill(self, value):
        assert not self.sim.queued("commit"), f"{self.name} zeroed under a queued commit"
        self.sim.on_fill()
        super().fill(value)

    def set(self, values):
        self[...] = values


def logged(sim, name, shape, dtype) -> Logged:
    arr = np.zeros(shape, dtype).view(Logged)
    arr.sim, arr.name = sim, name
    return arr


@pytest.fixture(scope="module")
def model(fixture_dir):
    from strata_cli.model.gguf_file import open_model

    return open_model(fixture_dir / "model-f32.gguf")


@pytest.fixture
def simulated(monkeypatch, model):
    """(make_engine(), sim): GPUEngines on the simulated stream, each with its own numpy 'device' (sim.device)."""
    from strata_cli.engine.gpu import buffers
    from strata_cli.engine.gpu import engine as engine_mod

    sim = Sim()

    class Mapped:
        def __init__(self, shape, dtype):
            self.host = logged(sim, "mapped", shape, dtype)
            self.device = self.host

        def free(self):
            pass

    def plan(g, n_ctx, M, layers):
        arena = buffers.plan_buffers(g, n_ctx, M, layers)
        arena.allocate = lambda: {name: logged(sim, name, shape, dtype) for name, shape, dtype in arena.specs}
        return arena

    def new_stream():
        sim.stream = Stream(sim)
        return sim.stream

    def asnumpy(arr):
        assert not sim.queued("commit"), "committed state read under a queued commit"
        sim.log.append(("read",))
        return np.array(arr)

    def record_window(e, T, stream):
        def window():
            tokens = e.stage.tokens.host[:T].copy()
            positions = e.stage.positions.host[:T].copy()
            np.testing.assert_array_equal(positions, sim.device.n_past + np.arange(T))  # staged at its n_past
            result = sim.device.run(tokens)
            np.ndarray.__setitem__(e.buf["logits"], slice(0, T), result.logits)
            np.ndarray.__setitem__(e.stage.out_ids.host, slice(0, T), result.ids)

        stream.enqueue("window", window)

    def record_commit(e, stream):
        def commit():
            sim.device.commit(int(e.stage.n_keep.host[0]))  # the n_keep it reads when it runs

        stream.enqueue("commit", commit)

    class Graph:
        def __init__(self, record, stream):
            self.record = record

        def launch(self, stream):
            self.record(stream)

        def destroy(self):
            pass

    fake_cp = SimpleNamespace(
        cuda=SimpleNamespace(Event=lambda disable_timing=False: Event(sim),
                             Device=lambda: SimpleNamespace(synchronize=lambda: sim.stream.synchronize()),
                             get_elapsed_time=lambda a, b: 1.0),
        asnumpy=asnumpy, get_default_memory_pool=lambda: SimpleNamespace(free_all_blocks=lambda: None))
    sampling = SimpleNamespace(sample_rows=lambda *a, out=None, **k: out)
    monkeypatch.setattr(engine_mod, "cupy", lambda: fake_cp)
    monkeypatch.setattr(engine_mod, "new_stream", new_stream)
    monkeypatch.setattr(engine_mod, "plan_buffers", plan)
    monkeypatch.setattr(engine_mod, "DeviceWeights", lambda model, pack_q8, skip: None)
    monkeypatch.setattr(engine_mod, "record_window", record_window)
    monkeypatch.setattr(engine_mod, "record_commit", record_commit)
    monkeypatch.setattr(engine_mod, "CapturedGraph", Graph)
    monkeypatch.setattr(engine_mod, "launch_sampling", sampling)
    monkeypatch.setattr(buffers, "MappedBuffer", Mapped)

    def make_engine():
        sim.device = ReferenceEngine(model, n_ctx=64, max_t=16)
        sim.on_fill = sim.device.reset  # reset() zeroes the device's states: the numpy device's reset
        engine = engine_mod.GPUEngine(model, n_ctx=64, max_t=16)
        engine.stage.n_keep.host.name = "n_keep"
        engine.stage.tokens.host.name = "tokens"
        engine.stage.positions.host.name = "positions"
        sim.log.clear()
        return engine

    return make_engine, sim


def _after(log, entry):
    return log[len(log) - log[::-1].index(entry):]


@pytest.mark.parametrize("eager", [False, True], ids=["graph", "eager"])
def test_async_commit_windows_equal_the_numpy_engine(simulated, model, fixture_dir, eager):
    make_engine, sim = simulated
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    engine = make_engine()
    if eager:
        run, commit = engine.run, engine.commit
        engine.run = lambda t, pos0=None: run(t, pos0, eager=True)
        engine.commit = lambda n: commit(n, eager=True)
    got, got_ids = speculative_run(engine, tokens, np.random.default_rng(2), 16, allow_zero=True)
    want, want_ids = speculative_run(ReferenceEngine(model, n_ctx=64, max_t=16), tokens, np.random.default_rng(2),
                                     16, allow_zero=True)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_ids, want_ids)
    # the last commit is still queued: nothing waited for it after its launch
    assert sim.queued("commit") and engine.n_past == len(tokens)
    assert _after(sim.log, ("launch", "commit")) == [("launch", "event")]
    engine.close()
    assert not sim.stream.queue


def test_commit_order(simulated, fixture_dir):
    make_engine, sim = simulated
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    engine = make_engine()
    engine.run(tokens[:5], 0)
    sim.log.clear()
    engine.commit(3)
    assert sim.log == [("write", "n_keep"), ("launch", "commit"), ("launch", "event")]
    assert engine.n_past == 3  # n_past is the contract's at once; the device's follows on the stream
    sim.log.clear()
    result = engine.run(tokens[3:7], 3)
    # staged while the commit is queued (it reads neither), launched behind it, one wait for both
    assert sim.log[:4] == [("write", "tokens"), ("write", "positions"), ("launch", "window"), ("sync",)]
    assert sim.log[4:7] == [("ran", "commit"), ("ran", "event"), ("ran", "window")]
    assert result.logits.shape[0] == 4
    sim.log.clear()
    # a second launch_commit while one is queued (launch_commit's contract): n_keep written after the event only
    engine.launch_commit(2)
    engine.launch_commit(1)
    assert sim.log == [("write", "n_keep"), ("launch", "commit"), ("launch", "event"), ("event_sync",),
                       ("ran", "commit"), ("ran", "event"), ("write", "n_keep"), ("launch", "commit"),
                       ("launch", "event")]


@pytest.mark.parametrize("reader", ["read_state", "reset", "close", "timer", "tiered", "sample"])
def test_host_reads_wait_for_the_commit(simulated, fixture_dir, reader):
    """Each host path that reads or rewrites committed state runs only after the queued commit ran (the stand-ins
    assert it at the read/fill itself; here: the wait comes first and the commit ran before the path's own work)."""
    make_engine, sim = simulated
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    engine = make_engine()
    result = engine.run(tokens[:4], 0)
    engine.commit(4)
    sim.log.clear()
    if reader == "read_state":
        state = engine.read_state("S.0")
        assert state.shape == engine.buf["S.0"].shape
        assert sim.log[:3] == [("event_sync",), ("ran", "commit"), ("ran", "event")] and sim.log[3] == ("read",)
    elif reader == "reset":
        engine.reset()
        assert sim.log[:3] == [("event_sync",), ("ran", "commit"), ("ran", "event")]
        assert engine.n_past == 0 and sim.device.n_past == 0
    elif reader == "close":
        engine.close()
        assert sim.log == [("sync",), ("ran", "commit"), ("ran", "event")]
    elif reader == "timer":
        timer = engine.window_timer()
        sim.log.clear()
        timer(engine, tokens[4:7], 4, 2)
        assert sim.log[:3] == [("event_sync",), ("ran", "commit"), ("ran", "event")]
        assert ("write", "tokens") in sim.log[3:] and engine.n_past == 6 and sim.device.n_past == 6
    elif reader == "tiered":  # the tier host's begin() must see the stream as this window's alone
        seen = []

        def launched(T, launch):
            seen.append(sim.queued("commit"))
            launch()
            sim.stream.synchronize()

        engine.tiers = SimpleNamespace(close=lambda: None)
        engine.tier_host = SimpleNamespace(launched=launched, close=lambda: None)
        engine.run(tokens[4:6], 4)
        assert seen == [False] and sim.log[:3] == [("write", "tokens"), ("write", "positions"), ("event_sync",)]
    else:  # sampling reads the last window's logits, which the commit does not write: ordered by the stream
        engine.sample(result, 0.7, 1)
        assert ("launch", "commit") not in sim.log and ("ran", "commit") in sim.log



def test_the_commit_recorder_reads_only_n_keep_from_the_host(monkeypatch, model):
    """The real record_commit (engine/gpu/window.py) over logging launchers: of the mapped staging buffers it touches
    n_keep alone (copied into the arena first), and it reads the window's tokens and positions from the arena, which
    the next window's graph rewrites only after the commit on the stream; so staging the next window while the commit
    is in flight clobbers nothing it reads."""
    from strata_cli.engine.gpu import window

    g = model.geometry
    launches = []

    def logger(name):
        def launch(*args, **kwargs):
            launches.append((name, [*args, *kwargs.values()]))
        return launch

    names = {window.gdn: ("gdn_conv_commit", "gdn_commit_state"), window.qsa: ("indexer_commit",),
             window.ple: ("ple_history_commit", "ple_prev_commit")}
    for module, launchers in names.items():
        for name in launchers:
            monkeypatch.setattr(module, name, logger(name))
    monkeypatch.setattr(window, "copy_async", logger("copy_async"))
    monkeypatch.setattr(window, "qkv_rows", lambda e, layer: e.buf[f"qkv.{layer}"])  # an arena buffer (a view of it)
    arena = {}

    class Buf(dict):
        def __missing__(self, name):
            arena[name] = self[name] = SimpleNamespace(name=name)
            return self[name]

    stage = SimpleNamespace(**{k: SimpleNamespace(host=object(), device=SimpleNamespace(name=f"mapped {k}"))
                               for k in ("tokens", "positions", "n_keep", "out_ids", "out_nonfinite")})
    w = SimpleNamespace(blk_f32=lambda layer, name: None)
    e = SimpleNamespace(buf=Buf(), w=w, g=g, stage=stage, gdn_layers=g.gdn_layers, attn_layers=g.attn_layers,
                        has_ple=g.ple is not None)
    window.record_commit(e, stream=None)
    mapped = {id(v.device) for v in vars(stage).values()}
    touched = [(name, arg.name) for name, args in launches for arg in args if id(arg) in mapped]
    assert touched == [("copy_async", "mapped n_keep")] and launches[0][0] == "copy_async"
    assert {"tokens", "positions", "n_keep"} <= set(arena)  # the arena copies, not the mapped buffers
    assert {name for name, _ in launches} >= {"gdn_conv_commit", "gdn_commit_state", "indexer_commit",
                                              "ple_history_commit", "ple_prev_commit"}
