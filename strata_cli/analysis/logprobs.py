"""Token-by-token log-prob dumps, computed through verify windows the way a speculative loop runs them.

Row p (p = 0..N-2) is the distribution after tokens[0..p] with target tokens[p+1]. The sequence is fed as
windows of T tokens: tokens[pos] (the last accepted token) plus T-1 drafts. With draft noise each draft is
replaced by a wrong token with probability P; rows after the first wrong draft are dropped and commit keeps
the accepted prefix. A correct engine gives the same dump for every T and P.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ..engine.contract import window_nonfinite
from ..errors import NonFiniteError
from ..ops.basic import log_softmax64
from .dumps import LogprobRow
from .speculation import LoopStats


def logprob_rows(logits: np.ndarray, positions: np.ndarray, targets: np.ndarray, topk: int,
                 extra_id: int | None, full_dist: bool = False) -> list[LogprobRow]:
    """logits [n, V] at `positions` with their targets -> dump rows (log-softmax in float64); with `full_dist`
    each row keeps its whole distribution."""
    lp = log_softmax64(logits)
    rows = []
    for i in range(len(lp)):
        row, target = lp[i], int(targets[i])
        top = int(np.argmax(row))
        lp_extra = renorm = float("nan")
        if extra_id is not None:
            lp_extra = float(row[extra_id])
            if target != extra_id:
                renorm = float(row[target] - np.log1p(-np.exp(lp_extra))) if lp_extra < 0 else float("nan")
        order = np.argsort(-row, kind="stable")[:topk] if topk > 0 else []
        rows.append(LogprobRow(int(positions[i]), target, float(row[target]), top, float(row[top]),
                               int(top == target), lp_extra, renorm, [(int(j), float(row[j])) for j in order],
                               dist=row.tolist() if full_dist else None))
    return rows


def window_logits(engine, tokens: np.ndarray, window: int, progress=None) -> Iterator[tuple]:
    """Feed tokens[0..N-2] as windows of `window` tokens, committing each whole; yield (positions, logits [T, V],
    targets) per window. Row p is the distribution after tokens[0..p] with target tokens[p+1]."""
    n = len(tokens)
    engine.reset()
    while engine.n_past < n - 1:
        pos = engine.n_past
        T = min(window, n - 1 - pos)
        result = engine.run(tokens[pos:pos + T], pos)
        bad = window_nonfinite(result)
        if bad:  # statistics over NaN logits would be NaN that look like numbers
            raise NonFiniteError(f"{engine.model.path}: non-finite values (NaN/Inf) in the window at positions "
                                 f"{pos}..{pos + T - 1}, first in {bad}")
        logits = np.asarray(result.logits[:T])
        engine.commit(T)
        if progress is not None:
            progress(engine.n_past, n - 1)
        yield pos + np.arange(T), logits, tokens[pos + 1:pos + 1 + T]


def _wrong_token(rng: np.random.Generator, true_id: int, vocab: int) -> int:
    return int((true_id + rng.integers(1, vocab)) % vocab)


def speculative_dump(engine, tokens: np.ndarray, window: int, *, draft_noise: float = 0.0, seed: int = 0,
                     topk: int = 0, extra_id: int | None = None, full_dist: bool = False,
                     progress=None, on_rows=None, allow_nonfinite: bool = False) -> tuple[list[LogprobRow], LoopStats]:
    """Feed tokens[0..N-2] through verify windows of `window` tokens; return the N-1 dump rows and what the loop
    accepted (a draft is accepted when it is the sequence's token: the noise did not replace it).

    on_rows(rows, nonfinite) is called with each window's kept rows as they are produced (nonfinite: None, or
    where that window first went non-finite), so a caller can write them out at once. A window whose values
    go non-finite raises NonFiniteError naming the first layer/stage, unless allow_nonfinite (then its rows
    carry nonfinite=True and on_rows hears where).
    """
    n = len(tokens)
    vocab = engine.g.n_vocab
    rng = np.random.default_rng(seed)
    rows: list[LogprobRow] = []
    stats = LoopStats(window)
    engine.reset()
    while engine.n_past < n - 1:
        pos = engine.n_past
        T = min(window, n - 1 - pos)
        fed = tokens[pos:pos + T].copy()
        n_keep = T
        for j in range(1, T):
            if draft_noise > 0 and rng.random() < draft_noise:
                fed[j] = _wrong_token(rng, int(fed[j]), vocab)
                n_keep = j
                break
        result = engine.run(fed, pos)
        bad = window_nonfinite(result)
        if bad and not allow_nonfinite:
            raise NonFiniteError(f"non-finite values (NaN/Inf) in the window at positions {pos}..{pos + T - 1}, "
                                 f"first in {bad}; {len(rows)} rows before it were finite (--allow-nonfinite "
                                 "writes such rows, marked, instead of stopping)")
        # committed before the host computes the rows (from the logits run() copied out): on the GPU the commit
        # runs while the host works on them (engine/gpu/engine.py: the asynchronous commit)
        engine.commit(n_keep)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # only with --allow-nonfinite
            new = logprob_rows(np.asarray(result.logits[:n_keep]), pos + np.arange(n_keep),
                               tokens[pos + 1:pos + 1 + n_keep], topk, extra_id, full_dist)
        if bad:
            for row in new:
                row.nonfinite = True
            stats.nonfinite_windows += 1
        rows += new
        if on_rows is not None:
            on_rows(new, bad)
        stats.record(T, n_keep)
        if progress is not None:
            progress(engine.n_past, n - 1)
    return rows, stats
