"""The CUDA-graph verify engine (imported only for --device gpu)."""

from .engine import GPUEngine

__all__ = ["GPUEngine"]
