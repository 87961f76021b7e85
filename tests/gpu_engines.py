"""Builders of the GPU engine tests (test_gpu_engine.py, test_gpu_tiers.py, test_gpu_tiers_pcie.py): synthetic
models, the plain and the tiered GPU engine, and the relative error they are compared by."""

from __future__ import annotations

import numpy as np

from strata_cli.model.gguf_file import open_model


def rel_err(a, b) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def gpu_engine(model, **kw):
    from strata_cli.engine.gpu import GPUEngine

    return GPUEngine(model, **kw)


def tiered_engine(model, n_ctx=None, **tiers):
    """The GPU engine with a TierConfig of `tiers` (none given: every expert in VRAM, no tiers object)."""
    from strata_cli.tiers.config import TierConfig

    return gpu_engine(model, n_ctx=n_ctx, tiers=TierConfig(**tiers) if tiers else None)


def synthetic_model(tmp_path, preset, seed, ggml_type, **overrides):
    """A make-model preset (with overrides) written to tmp_path and opened."""
    from strata_cli.synth import load_preset, write_model

    p = load_preset(preset).with_overrides(**overrides) if overrides else load_preset(preset)
    path = tmp_path / f"{preset}-{seed}-{ggml_type}.gguf"
    write_model(path, p, seed=seed, ggml_type=ggml_type)
    return open_model(path)
