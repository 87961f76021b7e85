"""GPU side: lazy CuPy/cuda-bindings runtime, the CUDA C kernel loader and one launcher per kernel family.

Nothing here is imported by CPU code paths; every module imports CuPy inside functions or at its own import,
and `strata_cli.engine.gpu_probe()` is the one probe the rest of the tool uses.
"""
