"""The draft-noise loop of `strata logprobs --draft-noise` (analysis/logprobs.speculative_dump: windows of drafts,
a random accepted prefix committed) timed with the engine's asynchronous commit against the synchronous one (each
commit waited for as soon as it is launched, as before issue 18 item 4; a flag of this script only, the engine has
no such switch), on one engine, the two loops alternating, after one untimed loop that captures every window graph.

    python3 bench/commit_async_bench.py [MODEL] [--tokens 512] [--window 8] [--draft-noise 0.3] [--reps 5]
        [--expert-cache N --pcie-frac F]          (on a GPU machine, from the repo root; MODEL: the q8_0 fixture)

Prints per variant the median wall ms of a loop and per window (host time: the loop's logprob rows, staging,
launches and waits), the async/sync ratio, and checks that both loops wrote the same rows."""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import time

import numpy as np

from strata_cli.analysis.logprobs import speculative_dump
from strata_cli.engine import make_engine
from strata_cli.model.gguf_file import open_model
from strata_cli.tiers.config import TierConfig

# the tests' fixture (tests/conftest.py: $STRATA_FIXTURES, else ../shared/fixtures/qwen4exp-tiny)
FIXTURES = (os.environ.get("STRATA_FIXTURES")
            or pathlib.Path(__file__).resolve().parents[2] / "shared/fixtures/qwen4exp-tiny")
FIXTURE = pathlib.Path(FIXTURES) / "model-q8_0.gguf"


class SyncCommit:
    """The engine with each commit waited for at once (the synchronous commit)."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def commit(self, n_keep: int) -> None:
        self.engine.commit(n_keep)
        self.engine.wait_commit()


def _key(rows) -> list[str]:
    """The rows as comparable text (their NaN fields, lp_extra without --extra-id, compare equal)."""
    return [repr(r) for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=str(FIXTURE))
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--draft-noise", type=float, default=0.3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--expert-cache", default=None, help="expert tiers: VRAM slots (as strata's --expert-cache)")
    ap.add_argument("--pcie-frac", type=float, default=0.0)
    args = ap.parse_args()
    model = open_model(args.model)
    tokens = np.random.default_rng(args.seed).integers(0, model.geometry.n_vocab, args.tokens)
    tiers = TierConfig(cache=args.expert_cache, pcie_frac=args.pcie_frac) if args.expert_cache else None
    with make_engine(model, "gpu", n_ctx=args.tokens, max_t=max(args.window, 1), tiers=tiers) as engine:
        variants = {"async": engine, "sync": SyncCommit(engine)}

        def loop(e):
            t0 = time.perf_counter()
            rows, stats = speculative_dump(e, tokens, args.window, draft_noise=args.draft_noise, seed=args.seed)
            return (time.perf_counter() - t0) * 1e3, rows, stats

        _, want, stats = loop(engine)  # captures every window graph
        ms = {name: [] for name in variants}
        for _ in range(args.reps):
            for name, e in variants.items():
                t, rows, _ = loop(e)
                if _key(rows) != _key(want):
                    raise SystemExit(f"the {name} loop wrote other rows than the first loop")
                ms[name].append(t)
    print(f"{args.model}: {args.tokens} tokens, window {args.window}, draft noise {args.draft_noise}, "
          f"{stats.windows} windows a loop, {args.reps} reps, tiers {'off' if tiers is None else tiers.cache}"
          f"{f' pcie {args.pcie_frac}' if tiers else ''}")
    med = {name: statistics.median(v) for name, v in ms.items()}
    for name, v in ms.items():
        print(f"  {name:5s} commit: {med[name]:9.2f} ms a loop (min {min(v):.2f}), "
              f"{med[name] / stats.windows * 1e3:8.1f} us a window")
    print(f"  async / sync: {med['async'] / med['sync']:.3f} "
          f"({(med['sync'] - med['async']) / stats.windows * 1e3:+.1f} us a window saved)")


if __name__ == "__main__":
    main()
