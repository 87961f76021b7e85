"""The embedded default model: the `tiny` preset (F32, seed 0), generated once into the strata cache."""

from __future__ import annotations

import os
from pathlib import Path

from .synth import estimate_size, load_preset, write_model
from .progress import byte_progress

DEFAULT_PRESET, DEFAULT_TYPE, DEFAULT_SEED = "tiny", "F32", 0
DEFAULT_NAME = f"qwen4exp-{DEFAULT_PRESET}-{DEFAULT_TYPE.lower()}-seed{DEFAULT_SEED}.gguf"


def cache_dir() -> Path:
    """$STRATA_CACHE, else $XDG_CACHE_HOME/strata, else ~/.cache/strata."""
    if os.environ.get("STRATA_CACHE"):
        return Path(os.environ["STRATA_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "strata"


def default_model_path() -> Path:
    """Path of the default model, generating it (a few MB, well under a second) on first use."""
    preset = load_preset(DEFAULT_PRESET)
    path = cache_dir() / DEFAULT_NAME
    # a wrong size means a stale or foreign file (e.g. the preset changed): regenerate it
    if path.is_file() and path.stat().st_size == estimate_size(preset, DEFAULT_TYPE):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with byte_progress(f"generating default model {path.name}") as progress:
        # write_model writes a partial file and renames it, so concurrent first uses are safe
        write_model(path, preset, seed=DEFAULT_SEED, ggml_type=DEFAULT_TYPE, progress=progress)
    return path


def resolve_model(model_arg: str | None) -> str:
    """The model the user named, or the default one."""
    return str(model_arg) if model_arg else str(default_model_path())
