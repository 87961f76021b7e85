"""verify-bench arithmetic against closed forms, on a fake engine with a fake clock (no model, exact times):
E(T), the speedup over T = 1, rows/s and accepted tokens/s, the drawn n_keep (kept_mean), the re-prefill at the
context limit, and the accepted drafts of the draft-noise loop."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from strata_cli.engine.contract import WindowResult
from strata_cli.engine.state import check_n_keep, check_window
from strata_cli.analysis.logprobs import speculative_dump
from strata_cli.analysis.speculation import Acceptance
from strata_cli.analysis.window_timing import run_bench, time_window


class FakeEngine:
    """The window contract's bookkeeping (check_window / check_n_keep) without a model; logs every run."""

    def __init__(self, n_ctx: int, vocab: int = 50, max_t: int | None = 16):
        self.g = SimpleNamespace(n_vocab=vocab)
        self.n_ctx, self.max_t = n_ctx, max_t
        self.runs: list[tuple[int, int]] = []     # (pos0, T)
        self.resets = 0
        self.reset()

    def reset(self):
        self.n_past, self._pending = 0, None
        self.resets += 1

    def run(self, tokens, pos0=None):
        tokens = check_window(tokens, pos0, self.n_past, self.g.n_vocab, self.n_ctx, self.max_t)
        self.runs.append((self.n_past, len(tokens)))
        self._pending = len(tokens)
        logits = np.random.default_rng(self.n_past).standard_normal((len(tokens), self.g.n_vocab))
        return WindowResult(self.n_past, tokens, logits.astype(np.float32), logits.argmax(1))  # the contract's

    def commit(self, n_keep):
        check_n_keep(n_keep, self._pending)
        self.n_past += n_keep
        self._pending = None


def clock(ms_of_window):
    """A timer whose window costs ms_of_window(T) (host share a tenth of it); it runs and commits like the real one
    and logs each n_keep it was given."""
    seen = []

    def timer(engine, tokens, pos, n_keep):
        engine.run(tokens, pos)
        engine.commit(n_keep)
        seen.append(n_keep)
        ms = ms_of_window(len(tokens))
        return ms, ms / 10

    timer.seen = seen
    return timer


def closed_form_e(T: int, a: float) -> float:
    return float(T) if a == 1 else (1 - a ** T) / (1 - a)


@pytest.mark.parametrize("a", [0.0, 0.3, 0.7, 0.95, 1.0])
def test_expected_tokens_closed_form(a):
    acc = Acceptance.assumed(a)
    for T in range(1, 17):
        assert acc.expected_tokens(T) == pytest.approx(closed_form_e(T, a), rel=1e-12, abs=1e-12)


def test_expected_tokens_with_measured_rates():
    """E(T) = 1 + sum_j prod_{i<=j} a_i for per-position rates."""
    rates = (0.9, 0.5, 0.25)
    acc = Acceptance(rates, False, "measured")
    assert acc.expected_tokens(1) == 1.0
    assert acc.expected_tokens(2) == pytest.approx(1.9)
    assert acc.expected_tokens(3) == pytest.approx(1 + 0.9 + 0.45)
    assert acc.expected_tokens(4) == pytest.approx(1 + 0.9 + 0.45 + 0.1125)


@pytest.mark.parametrize("a, T", [(0.7, 4), (0.4, 8), (0.9, 2), (0.0, 5), (1.0, 6)])
def test_drawn_n_keep_follows_the_acceptance_model(a, T):
    """P(keep = j) = a^(j-1) (1-a) for j < T and a^(T-1) for j = T; so the mean is E(T)."""
    rng = np.random.default_rng(11)
    acc = Acceptance.assumed(a)
    n = 40000
    draws = np.array([acc.draw_keep(rng, T) for _ in range(n)])
    assert draws.min() >= 1 and draws.max() <= T
    want = np.array([a ** (j - 1) * (1 - a) for j in range(1, T)] + [a ** (T - 1)])
    got = np.bincount(draws, minlength=T + 1)[1:] / n
    assert np.abs(got - want).max() <= 4 * np.sqrt(0.25 / n)
    sd = max(np.sqrt(np.sum(want * (np.arange(1, T + 1) - closed_form_e(T, a)) ** 2) / n), 1e-12)
    assert abs(draws.mean() - closed_form_e(T, a)) <= 4 * sd


def test_record_arithmetic_against_closed_forms():
    """With t(T) = 2 + 0.5 T ms: rows/s = T / t, accepted tok/s = E(T) / t, speedup = E(T) t(1) / t(T); kept_mean is
    the mean of the n_keep the timer committed, which follows E(T)."""
    a, reps = 0.6, 400
    timer = clock(lambda T: 2.0 + 0.5 * T)
    engine = FakeEngine(n_ctx=4096)
    records = run_bench(engine, [4, 2], reps, Acceptance.assumed(a), depth=8, seed=3, timer=timer, warmup=2)
    assert [r.window for r in records] == [4, 2]
    t1 = 2.5
    for rec in records:
        T, t = rec.window, 2.0 + 0.5 * rec.window
        flat = rec.flat()
        assert flat["ms_median"] == flat["ms_p10"] == flat["ms_p90"] == t
        assert flat["host_ms"] == pytest.approx(t / 10)
        assert flat["expected_tokens"] == pytest.approx(closed_form_e(T, a))
        assert flat["rows_per_s"] == pytest.approx(T / t * 1e3)
        assert flat["accepted_tok_per_s"] == pytest.approx(closed_form_e(T, a) / t * 1e3)
        assert flat["speedup_vs_t1"] == pytest.approx(closed_form_e(T, a) * t1 / t)
        assert len(rec.kept) == reps and all(1 <= k <= T for k in rec.kept)
        assert abs(flat["kept_mean"] - closed_form_e(T, a)) <= 0.15
    # the records keep exactly the timed windows' n_keep, in order (T = 1 first, then 2, then 4; warm-ups dropped)
    n = reps + 2
    assert records[1].kept == timer.seen[n + 2:2 * n]
    assert records[0].kept == timer.seen[2 * n + 2:3 * n]


def test_speedup_uses_the_measured_t1():
    """A T = 1 window that costs 3 ms and a T = 8 window that costs 6 ms at acceptance 1: E = 8, speedup 4."""
    timer = clock(lambda T: 3.0 if T == 1 else 6.0)
    (rec,) = run_bench(FakeEngine(n_ctx=4096), [8], 5, Acceptance.assumed(1.0), depth=0, seed=0, timer=timer)
    assert rec.expected_tokens == 8 and rec.speedup_vs_t1 == pytest.approx(4.0)


def test_prefill_again_only_past_the_context():
    """Acceptance 1 keeps every row: windows of 3 after 2 tokens in a context of 8 start at 2 and 5 (5 + 3 = 8 fills
    the context exactly and still runs), then the sequence is prefilled again."""
    timer = clock(lambda T: 1.0)
    engine = FakeEngine(n_ctx=8, max_t=None)
    engine.resets = 0
    time_window(engine, 3, 6, Acceptance.assumed(1.0), depth=2, seed=0, timer=timer, warmup=0)
    starts = [pos for pos, T in engine.runs if T == 3]
    assert starts == [2, 5, 2, 5, 2, 5]
    assert engine.resets == 1 + 2          # the first prefill, then one per context overflow
    assert max(pos + T for pos, T in engine.runs) == 8


def test_draft_noise_loop_accepts_at_one_minus_noise():
    """Each draft is replaced with probability p: per-position acceptance 1 - p, tokens per window (kept rows) with
    mean E(T) at a = 1 - p, and every position committed exactly once."""
    p, T, n = 0.35, 5, 6001
    engine = FakeEngine(n_ctx=n + 16, vocab=40)
    tokens = np.random.default_rng(0).integers(0, 40, n)
    rows, stats = speculative_dump(engine, tokens, T, draft_noise=p, seed=4)
    assert [r.pos for r in rows] == list(range(n - 1))
    assert stats.rows_kept == n - 1 and stats.windows == len(engine.runs)
    assert sum(stats.histogram) == stats.windows
    for j, rate in enumerate(stats.per_position, start=1):
        sd = np.sqrt(p * (1 - p) / stats.offered[j - 1])
        assert abs(rate - (1 - p)) <= 4 * sd, j
    kept_mean = stats.rows_kept / stats.windows
    assert abs(kept_mean - closed_form_e(T, 1 - p)) <= 0.05
    assert stats.mean_accepted == pytest.approx(kept_mean - 1)
