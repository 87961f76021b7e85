"""`strata info [MODEL]`: geometry, layer layout, tensor types and sizes."""

from __future__ import annotations

import click

from ._common import StrataCommand, deprecated_alias, format_option, load_model, model_argument

TENSOR_COLUMNS = [("name", "name", None, "left"), ("layer", "layer", None, "right"),
                  ("shape", "shape", lambda s: " x ".join(map(str, s)), "left"), ("type", "type", None, "left"),
                  ("bytes", "bytes", ",", "right")]


@click.command(cls=StrataCommand, short_help="Show a model's geometry, layer layout, tensor types and sizes.")
@model_argument
@format_option()
@deprecated_alias("--json", "--format json", "fmt", flag_value="json")
@click.option("--tensors", "list_tensors", is_flag=True, help="table/md: also list every tensor.")
def command(model, fmt, list_tensors):
    """Show MODEL's geometry (from its GGUF metadata), layer layout, tensor types and sizes.

    table and md print the geometry, the layers, the tensor types (and with --tensors every tensor); json is one
    document of numbers (geometry, layers, types, tensors, warnings); csv and jsonl list one row per tensor."""
    from ..model.info import describe, layer_extras, params_text
    from ..report.present import Column, emit
    from ..report.progress import step_progress

    with step_progress(f"reading the header of {model or 'the default model'}"):  # no tensor data is read
        m = load_model(model)
        d = describe(m)
    tensor_columns = [Column(k, h, f, j) for k, h, f, j in TENSOR_COLUMNS]
    if fmt == "json":  # numbers and names only: the roles' "Q4_K x47, Q5_K" text is the table's
        emit([], None, "json", meta=dict(d, roles=[{k: v for k, v in r.items() if k != "types"} for r in d["roles"]]))
        return
    if fmt in ("csv", "jsonl"):
        emit(d["tensors"], [c.key for c in tensor_columns], fmt)
        return
    head = [f"{d['path']}: {d['file_bytes'] / 2**20:.1f} MiB, {d['tensor_count']} tensors, "
            f"{d['bits_per_weight']:.3f} bits per weight, {params_text(d['params_total'])} parameters "
            f"({params_text(d['params_active'])} active per token)"]
    tok = d["tokenizer"]
    tokenizer = (f"{tok['model']}/{tok['pre']}, {tok['tokens']} tokens, {tok['merges']} merges"
                 + ("" if tok["text_input"] else " (--text not available)")) if tok["model"] else "none"
    emit([{"key": k, "value": str(v)} for k, v in m.geometry.summary().items()] +
         [{"key": "tokenizer", "value": tokenizer}],
         [Column("key", justify="left"), Column("value", justify="left")], fmt, title="geometry",
         header_lines=head)
    layers = [dict(row, extras=layer_extras(row)) for row in d["layers"]]
    emit(layers, [Column("layer"), Column("kind", justify="left"), Column("extras", justify="left"),
                  Column("bytes", fmt=",")], fmt, title="layers")
    emit(d["types"], [Column("type", justify="left"), Column("tensors"), Column("bytes", fmt=","),
                      Column("bits_per_weight", fmt=".3f")], fmt, title="tensor types")
    emit(d["roles"], [Column("role", justify="left"), Column("types", justify="left"), Column("params", fmt=","),
                      Column("bytes", fmt=","), Column("bits_per_weight", fmt=".3f")], fmt,
         title="tensor roles (type mix)")
    if list_tensors:
        emit(d["tensors"], tensor_columns, fmt, title="tensors")
