"""A plain-data description of a loaded model for `strata info` (tables or JSON)."""

from __future__ import annotations

import re

from .gguf_file import GGUFModel


def describe(m: GGUFModel) -> dict:
    g = m.geometry
    per_layer: dict[int, int] = {}
    by_type: dict[str, list[int]] = {}
    tensors = []
    for info in m.tensors.values():
        match = re.match(r"blk\.(\d+)\.", info.name)
        if match:
            layer = int(match.group(1))
            per_layer[layer] = per_layer.get(layer, 0) + info.n_bytes
        count = by_type.setdefault(info.type_name, [0, 0])
        count[0] += 1
        count[1] += info.n_bytes
        tensors.append({"name": info.name, "shape": list(info.shape), "type": info.type_name, "bytes": info.n_bytes})
    layers = []
    for layer in range(g.n_layers):
        extras = []
        if g.layer_is_attn[layer]:
            ratio = g.compress_ratios[layer]
            extras.append(f"QSA ratio {ratio}" if ratio else "dense (ratio 0)")
        if g.ple is not None and g.ple.layer == layer:
            extras.append("PLE")
        layers.append({"layer": layer, "kind": "attention" if g.layer_is_attn[layer] else "gated deltanet",
                       "extras": ", ".join(extras), "bytes": per_layer.get(layer, 0)})
    return {
        "path": m.path, "file_bytes": m.file_size, "tensor_count": len(m.tensors),
        "geometry": g.summary(), "layers": layers,
        "types": [{"type": t, "tensors": c, "bytes": b} for t, (c, b) in sorted(by_type.items())],
        "tensors": tensors, "warnings": list(g.warnings),
    }
