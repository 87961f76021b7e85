"""Verify-window benchmark: time run()+commit() per window size, one record per size.

Acceptance model: each draft is accepted with probability A while all before it were, so a window of T
tokens keeps 1 + (accepted drafts) rows and yields E(T) = (1 - A^T) / (1 - A) tokens on average
(Leviathan et al. 2023); the speedup over T = 1 decode is E(T) * t(1) / t(T), drafting cost excluded.
"""

from __future__ import annotations

import time

import numpy as np


def expected_tokens(window: int, acceptance: float) -> float:
    if acceptance >= 1.0:
        return float(window)
    return (1.0 - acceptance ** window) / (1.0 - acceptance)


def _prefill(engine, context: int, rng, chunk: int) -> None:
    engine.reset()
    vocab = engine.g.n_vocab
    while engine.n_past < context:
        T = min(chunk, context - engine.n_past)
        engine.run(rng.integers(0, vocab, T), engine.n_past)
        engine.commit(T)


def _n_keep(rng, window: int, acceptance: float) -> int:
    keep = 1
    while keep < window and rng.random() < acceptance:
        keep += 1
    return keep


def time_window(engine, window: int, n_windows: int, acceptance: float, context: int, seed: int,
                warmup: int = 2, timer=None) -> dict:
    """Median/p10/p90 ms of `n_windows` windows of `window` tokens after `context` tokens.

    `timer(engine, tokens, pos, n_keep) -> (ms, host_ms)` measures one window; the default times run + commit on
    the host clock (the CPU engine: host_ms = ms). The GPU engine passes its CUDA-event timer, whose host_ms is
    the host's share (staging + launches)."""
    rng = np.random.default_rng(seed)
    chunk = engine.max_t or 64
    _prefill(engine, context, rng, chunk)
    vocab = engine.g.n_vocab
    samples, host, kept = [], [], []
    for i in range(warmup + n_windows):
        if engine.n_past + window > engine.n_ctx:
            _prefill(engine, context, rng, chunk)
        tokens = rng.integers(0, vocab, window)
        n_keep = _n_keep(rng, window, acceptance)
        if timer is None:
            t0 = time.perf_counter()
            engine.run(tokens, engine.n_past)
            engine.commit(n_keep)
            ms = host_ms = (time.perf_counter() - t0) * 1e3
        else:
            ms, host_ms = timer(engine, tokens, engine.n_past, n_keep)
        if i >= warmup:
            samples.append(ms)
            host.append(host_ms)
            kept.append(n_keep)
    ms = np.array(samples)
    med = float(np.median(ms))
    exp = expected_tokens(window, acceptance)
    return {"window": window, "windows": n_windows, "ms_median": med, "ms_p10": float(np.percentile(ms, 10)),
            "ms_p90": float(np.percentile(ms, 90)), "host_ms": float(np.median(host)),
            "rows_per_s": window / med * 1e3,
            "expected_tokens": exp, "accepted_tok_per_s": exp / med * 1e3, "kept_mean": float(np.mean(kept))}


def run_bench(engine, windows: list[int], n_windows: int, acceptance: float, context: int, seed: int = 0,
              timer=None) -> list[dict]:
    """One record per window size, with the speedup over T = 1 (measured as the baseline if not asked)."""
    records = {T: time_window(engine, T, n_windows, acceptance, context, seed, timer=timer)
               for T in sorted(set(windows) | {1})}
    base = records[1]["ms_median"]
    out = []
    for T in windows:
        rec = dict(records[T])
        rec["speedup_vs_t1"] = rec["expected_tokens"] * base / rec["ms_median"]
        out.append(rec)
    return out
