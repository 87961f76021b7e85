"""Helpers shared by the bench scripts (run as `python3 bench/<script>.py`, which puts bench/ on the path)."""

from __future__ import annotations


def patch_kernels(wrap) -> None:
    """Route every launcher's kernel lookup through wrap(module, function, kernel) -> the callable launched."""
    import strata_cli.engine.gpu.engine as engine_mod
    import strata_cli.engine.gpu.window as window_mod
    import strata_cli.gpu.compile as compile_mod
    from strata_cli.gpu import launch_dense, launch_gdn, launch_moe, launch_pack, launch_ple, launch_qsa

    original = compile_mod.kernel

    def lookup(module, function):
        return wrap(module, function, original(module, function))

    for mod in (launch_dense, launch_gdn, launch_moe, launch_pack, launch_ple, launch_qsa, window_mod, engine_mod):
        mod.kernel = lookup


def fill_context(eng, context: int, rng) -> None:
    """Reset the engine and run + commit random tokens, 16 at a time, until it holds `context` positions."""
    eng.reset()
    while eng.n_past < context:
        n = min(16, context - eng.n_past)
        eng.run(rng.integers(0, eng.g.n_vocab, n), eng.n_past, logits=False)
        eng.commit(n)
