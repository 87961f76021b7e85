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
