"""Helpers shared by the bench scripts (run as `python3 bench/<script>.py`, which puts bench/ on the path)."""

from __future__ import annotations


def patch_kernels(wrap) -> None:
    """Route every kernel lookup through wrap(module, function, kernel) -> the callable launched: the launchers
    look kernels up through strata_cli.gpu.compile.kernel at each launch, so this one patch covers them all."""
    import strata_cli.gpu.compile as compile_mod

    original = compile_mod.kernel

    def lookup(module, function):
        return wrap(module, function, original(module, function))

    compile_mod.kernel = lookup


def fill_context(eng, context: int, rng) -> None:
    """Reset the engine and run + commit random tokens, 16 at a time, until it holds `context` positions."""
    eng.reset()
    while eng.n_past < context:
        n = min(16, context - eng.n_past)
        eng.run(rng.integers(0, eng.g.n_vocab, n), eng.n_past, logits=False)
        eng.commit(n)
