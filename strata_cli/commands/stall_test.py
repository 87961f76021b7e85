"""`strata stall-test`: a window whose last flag never rises, the watchdog's release, and a fresh engine after."""

from __future__ import annotations

import click

from ._common import StrataCommand, ctx_option, deprecated_alias, load_model, model_argument, require_gpu
from ._tiers import tier_config, tier_options

STALL_RELEASED = 5  # exit code: the stalled window was released (README, Exit codes)


@click.command(cls=StrataCommand, short_help="Stall a verify window on purpose; the watchdog must release it (GPU).")
@model_argument
@click.option("--stall-window", "stall_at", type=click.IntRange(min=1), default=2, show_default=True,
              help="The window (1-based) whose last flag the host withholds.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.01), default=1.0, show_default=True,
              help="Seconds without progress before the watchdog releases the GPU waits.")
@click.option("--window", "n_tokens", type=click.IntRange(1, 16), default=4, show_default=True,
              help="Tokens per verify window T (as --window everywhere else).")
@deprecated_alias("--tokens", "--window", "n_tokens", type=click.IntRange(1, 16))
@ctx_option
@tier_options
def command(model, stall_at, timeout_s, n_tokens, n_ctx, **tier_args):
    """Runs windows of --window T tokens until window N (--stall-window), whose last flag the host withholds
    (tiers/config.py stall_window): the GPU waits, and the watchdog (no progress for --timeout s) releases every GPU
    wait, prints one line and the engine refuses later windows. Then a fresh engine must run a window. Exits 5 after
    a release (the stall is the point), 1 if anything else goes wrong."""
    import sys

    import numpy as np

    from ..engine import make_engine
    from ..errors import StrataError
    from ..report.present import err_console
    from ..tiers.host import EngineReleased
    from ..tiers.watchdog import Watchdog

    m = load_model(model)
    require_gpu("stall-test")
    tiers = tier_config(**tier_args)
    stalled = tier_config(**tier_args, stall_window=stall_at)
    rng = np.random.default_rng(0)
    engine = make_engine(m, "gpu", n_ctx=n_ctx, max_t=n_tokens, tiers=stalled)
    dog = Watchdog(timeout_s).start()  # tiers/watchdog.py: releases every live verifier, one line each
    released = None
    try:
        for _ in range(stall_at):
            tokens = rng.integers(0, m.geometry.n_vocab, n_tokens)
            try:
                engine.run(tokens, engine.n_past)
            except EngineReleased as exc:
                released = exc
                break
            engine.commit(n_tokens)
    finally:
        dog.stop()
    if released is None or not dog.fired.wait(10):
        raise StrataError(f"window {stall_at} did not stall (no watchdog release)")
    print(dog.lines[0], flush=True)
    try:
        engine.run(rng.integers(0, m.geometry.n_vocab, n_tokens), engine.n_past)
    except EngineReleased as exc:
        err_console().print(f"the released engine refuses later windows: {exc}", style="dim", highlight=False)
    else:
        raise StrataError("the released engine ran another window (it must refuse)")
    engine.close()  # its threads and pinned buffers go before the fresh engine is built
    with make_engine(m, "gpu", n_ctx=n_ctx, max_t=n_tokens, tiers=tiers) as fresh:
        result = fresh.run(rng.integers(0, m.geometry.n_vocab, n_tokens), 0)
        fresh.commit(n_tokens)
    print(f"a fresh engine ran a {n_tokens}-token window (greedy ids {' '.join(map(str, result.ids.tolist()))})",
          flush=True)
    sys.exit(STALL_RELEASED)
