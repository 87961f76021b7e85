"""The variants of kernels/gemv_quant.cu, one per block type: the name of each, and its generated head (`#define
QTYPE`, the type table and the type's grid or value table: model/quant_tables.device_prefix, the one emitter of the
kernels' type tables). Pure Python: tests compile every variant on CPU (NVRTC) and check the tables.
"""

from __future__ import annotations

from ..model import quant_tables
from ..model import quants as Q

BASE = "gemv_quant"
# Block types with their own kernels elsewhere (kernels/gemv.cu, gemv_q8r.cu) are not compiled here.
TYPES = tuple(t for t in Q.BLOCK_TYPES if t != Q.Q8_0)
GRID_TYPES = tuple(t for t in TYPES if Q.QUANT_TYPES[t].grid)


def variant(ggml_type: int) -> str:
    """Module variant name of a type (compile.kernel's 'gemv_quant.<variant>')."""
    return Q.TYPE_NAMES[ggml_type].lower()


def prefix(name: str) -> str:
    """C source put before kernels/gemv_quant.cu for variant `name` (a lower-case type name, e.g. 'iq2_xs')."""
    ggml_type = Q.TYPE_IDS.get(name.upper())
    if ggml_type not in TYPES:
        raise ValueError(f"gemv_quant: no variant '{name}' (types: {', '.join(variant(t) for t in TYPES)})")
    return quant_tables.device_prefix(ggml_type)
