"""Synthetic qwen4exp models: presets and a streaming random-weight GGUF writer."""

from .presets import Preset, load_preset
from .writer import estimate_size, write_model

__all__ = ["Preset", "estimate_size", "load_preset", "write_model"]
