"""`strata info [MODEL]`: geometry, layer layout, tensor types and sizes."""

from __future__ import annotations

import click

from ._common import load_model, model_argument


@click.command(short_help="Show a model's geometry, layer layout, tensor types and sizes.")
@model_argument
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of tables.")
@click.option("--tensors", "list_tensors", is_flag=True, help="Also list every tensor.")
def command(model, as_json, list_tensors):
    """Show MODEL's geometry (from its GGUF metadata), layer layout, tensor types and sizes."""
    from ..model.info import describe
    from ..present import Column, emit

    m = load_model(model)
    d = describe(m)
    if as_json:
        emit([], None, "json", meta=d)
        return
    head = [f"{d['path']}: {d['file_bytes'] / 2**20:.1f} MiB, {d['tensor_count']} tensors"]
    emit([{"key": k, "value": str(v)} for k, v in d["geometry"].items()],
         [Column("key", justify="left"), Column("value", justify="left")], "table", title="geometry",
         header_lines=head)
    emit(d["layers"], [Column("layer"), Column("kind", justify="left"), Column("extras", justify="left"),
                       Column("bytes", fmt=",")], "table", title="layers")
    emit(d["types"], [Column("type", justify="left"), Column("tensors"), Column("bytes", fmt=",")], "table",
         title="tensor types")
    if list_tensors:
        emit(d["tensors"], [Column("name", justify="left"), Column("shape", justify="left"),
                            Column("type", justify="left"), Column("bytes", fmt=",")], "table", title="tensors")
