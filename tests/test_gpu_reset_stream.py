"""CPU check of GPUEngine.reset's stream discipline (no GPU needed): every state fill is issued while the engine's
own stream is current, and the engine then waits on that stream. The stream is non-blocking, so a fill issued on
the legacy default stream would be ordered neither before the next window nor by self.stream.synchronize()."""

from __future__ import annotations

import types

import numpy as np
from random_models import random_preset, write_random

from strata_cli.engine.gpu.engine import GPUEngine


class _Stream:
    """Stands in for the engine's cupy Stream: records whether it is current and the order of events."""

    def __init__(self, log):
        self.log, self.current = log, False

    def __enter__(self):
        self.current = True
        return self

    def __exit__(self, *exc):
        self.current = False

    def synchronize(self):
        self.log.append(("sync", None, None))


class _Buffer:
    def __init__(self, name, stream, log):
        self.name, self.stream, self.log = name, stream, log

    def fill(self, value):
        self.log.append(("fill", self.name, self.stream.current))


def _stand_in(geometry):
    log = []
    stream = _Stream(log)
    names = [f"{p}.{layer}" for layer in geometry.gdn_layers for p in ("S", "conv")]
    names += [f"{p}.{layer}" for layer in geometry.attn_layers if geometry.compress_ratios[layer]
              for p in ("tail", "pooled")]
    names += ["ple_history", "ple_prev"] if geometry.ple is not None else []
    buf = {name: _Buffer(name, stream, log) for name in names}
    engine = types.SimpleNamespace(g=geometry, buf=buf, stream=stream, gdn_layers=geometry.gdn_layers,
                                   attn_layers=geometry.attn_layers, has_ple=geometry.ple is not None,
                                   wait_commit=lambda: log.append(("wait_commit", None, None)))
    return engine, log, names


def test_reset_fills_every_state_on_the_engine_stream_then_waits_for_it(tmp_path):
    model = write_random(tmp_path, random_preset(np.random.default_rng(51)), 51)
    engine, log, names = _stand_in(model.geometry)
    GPUEngine.reset(engine)
    fills = [(name, on_stream) for kind, name, on_stream in log if kind == "fill"]
    assert sorted(name for name, _ in fills) == sorted(names)
    assert all(on_stream for _, on_stream in fills), [name for name, on_stream in fills if not on_stream]
    assert log[-1][0] == "sync", "reset must wait on the engine stream after its fills"
    assert log[0][0] == "wait_commit", "reset must wait for a commit in flight before its fills"
    assert engine.n_past == 0 and engine._pending is None
