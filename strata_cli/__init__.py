"""strata: a speculative-decoding verify engine for qwen4exp GGUF models, with a numpy reference path."""

__version__ = "0.1.0"
