"""Timing of verify windows (`strata verify-bench`): run()+commit() per window size, one BenchRecord per size.

Each timed window commits the rows an acceptance model draws (speculation.Acceptance: an assumed constant rate or
the per-position rates a loop measured), so commit costs what it would in a speculative loop. The speedup over
T = 1 decode is E(T) * t(1) / t(T), drafting cost excluded (Leviathan et al. 2023).
"""

from __future__ import annotations

import numpy as np

from ..report.records import BenchRecord
from .speculation import Acceptance


class TokenStream:
    """The ids a timed run feeds its windows: seeded random ids, or a text's ids in order (a cursor that moves on by
    the rows each window commits, back to the text's start when the text runs out)."""

    def __init__(self, rng, vocab: int, text: np.ndarray | None = None):
        self.rng, self.vocab, self.text, self.cursor = rng, vocab, text, 0

    def take(self, n: int) -> np.ndarray:
        if self.text is None:
            return self.rng.integers(0, self.vocab, n)
        if self.cursor + n > len(self.text):
            self.cursor = 0
        return self.text[self.cursor:self.cursor + n]

    def kept(self, n: int) -> None:
        self.cursor += n


def prefill(engine, depth: int, tokens: TokenStream, chunk: int) -> None:
    """Reset the engine and commit `depth` tokens of the stream in windows of at most `chunk`."""
    engine.reset()
    while engine.n_past < depth:
        T = min(chunk, depth - engine.n_past)
        engine.run(tokens.take(T), engine.n_past)
        engine.commit(T)
        tokens.kept(T)


def time_window(engine, window: int, repetitions: int, acceptance: Acceptance, depth: int, seed: int, timer,
                warmup: int = 2, text: np.ndarray | None = None) -> BenchRecord:
    """`repetitions` timed windows of `window` tokens after `depth` tokens of context, after `warmup` untimed ones.
    The windows read seeded random ids, or with `text` the text's ids in order (TokenStream).

    `timer(engine, tokens, pos, n_keep) -> (ms, host_ms)` (the engine's window_timer) measures one window: the
    numpy engine on the host clock (host_ms = ms), the GPU engine with CUDA events, host_ms the host's share
    (staging + launches)."""
    rng = np.random.default_rng(seed)
    stream = TokenStream(rng, engine.g.n_vocab, text)
    chunk = engine.max_t or 64
    prefill(engine, depth, stream, chunk)
    samples, host, kept = [], [], []
    for i in range(warmup + repetitions):
        if engine.n_past + window > engine.n_ctx:
            prefill(engine, depth, stream, chunk)
        tokens = stream.take(window)
        n_keep = acceptance.draw_keep(rng, window)
        ms, host_ms = timer(engine, tokens, engine.n_past, n_keep)
        stream.kept(n_keep)
        if i >= warmup:
            samples.append(float(ms))
            host.append(float(host_ms))
            kept.append(int(n_keep))
    return BenchRecord(window=window, samples_ms=samples, host_samples_ms=host, kept=kept,
                       expected_tokens=acceptance.expected_tokens(window))


def check_finite(engine, window: int, seed: int) -> None:
    """One untimed window first: timing a model whose values go NaN/Inf would report numbers of nothing."""
    from ..errors import NonFiniteError
    from ..engine.contract import window_nonfinite

    engine.reset()
    tokens = np.random.default_rng(seed).integers(0, engine.g.n_vocab, min(window, engine.n_ctx))
    where = window_nonfinite(engine.run(tokens, 0))
    engine.commit(0)
    engine.reset()
    if where:
        raise NonFiniteError(f"non-finite values (NaN/Inf) in a {len(tokens)}-token window, first in {where}: "
                             "the model's weights or metadata are broken; nothing to time")


def run_bench(engine, windows: list[int], repetitions: int, acceptance: Acceptance, depth: int, seed: int, timer,
              warmup: int = 2, progress=None, text: np.ndarray | None = None) -> list[BenchRecord]:
    """One record per window size, with the speedup over T = 1 (measured as the baseline if not asked); the windows
    follow `text` when given (time_window).

    `progress(T)` is called before each window size is timed."""
    check_finite(engine, max(windows), seed)
    records: dict[int, BenchRecord] = {}
    for T in sorted(set(windows) | {1}):
        if progress is not None:
            progress(T)
        records[T] = time_window(engine, T, repetitions, acceptance, depth, seed, timer, warmup=warmup, text=text)
    base = records[1].ms_median
    out = []
    for T in windows:
        rec = records[T]
        rec.speedup_vs_t1 = rec.expected_tokens * base / rec.ms_median
        rec.ms_vs_t1 = rec.ms_median / base
        out.append(rec)
    return out


def profile_windows(engine, window: int, repetitions: int, depth: int, seed: int, acceptance: Acceptance,
                    warmup: int = 2) -> dict:
    """GPU: `repetitions` windows of the profiling graph after `depth` tokens (stamps [N, slots] uint64 and the
    CUDA-event ms of each window alone), their stage_timing.Plan and what each stamped stage reads (reads:
    engine/stage_bytes.StageReads per stamp), and the median event ms of as many normal
    windows (what the stamps cost). Windows commit the rows `acceptance` draws, as in time_window."""
    sink: list = []
    stamped = time_window(engine, window, repetitions, acceptance, depth, seed, engine.window_only_timer(True, sink),
                          warmup=warmup)
    normal = time_window(engine, window, repetitions, acceptance, depth, seed, engine.window_only_timer(False),
                         warmup=warmup)
    kept = [(s, ms) for T, s, ms in sink if T == window][-repetitions:]
    return {"stamps": np.stack([s for s, _ in kept]), "event_ms": np.array([ms for _, ms in kept]),
            "plan": engine.profile_plans[window], "reads": engine.profile_reads[window],
            "profile_ms_median": stamped.ms_median,
            "normal_ms_median": normal.ms_median}
