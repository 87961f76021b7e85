"""`strata graph-nodes`: what the captured window (or commit) graph holds."""

from __future__ import annotations

import click

from ._common import StrataCommand, ctx_option, format_option, load_engine, load_model, model_argument, require_gpu
from ._tiers import tier_config, tier_options


@click.command(cls=StrataCommand, short_help="Count and list the nodes of a captured window graph (GPU).")
@model_argument
@click.option("--window", "window", type=click.IntRange(1, 16), default=4, show_default=True, help="Window size T.")
@click.option("--commit", "commit", is_flag=True, help="Describe the commit graph instead of the window graph.")
@click.option("--profile", "profile", is_flag=True,
              help="Describe the profiling variant of the window graph (with its stage stamps).")
@format_option()
@ctx_option
@tier_options
def command(model, window, commit, profile, fmt, n_ctx, **tier_args):
    """Node count, edge count (and how many are programmatic), the nodes each layer adds (window graphs of one token
    group), and one row per node kind (kernel function names via the driver API, memcpy, memset, host), most
    frequent first. Needs a CUDA GPU."""
    from ..errors import OptionError
    from ..report.envinfo import environment_record, header_line
    from ..report.present import Column, emit
    from ..report.progress import step_progress

    if commit and profile:
        raise OptionError("--profile describes the profiling window graph; the commit graph has no stamps")
    m = load_model(model)
    require_gpu("graph-nodes")
    engine = load_engine(m, "gpu", n_ctx, tiers=tier_config(**tier_args))
    with step_progress("capturing the commit graph" if commit else f"capturing the T = {window} window graph"):
        graph = engine.commit_graph() if commit else engine.graph(window, profile=profile)
        layer_nodes = [] if commit or profile else engine.layer_nodes(window)
    summary = graph.summary()
    what = "commit graph" if commit else f"{window}-token {'profiling ' if profile else ''}window graph"
    env = environment_record("gpu")
    head = [header_line(env), f"model {m.path} | {what}: {summary.nodes} nodes, {summary.edges} edges "
            f"({summary.programmatic} programmatic)"]
    if layer_nodes:
        head.append(f"nodes per layer: {' '.join(map(str, layer_nodes))} (max {max(layer_nodes)}, "
                    f"{sum(layer_nodes)} of {summary.nodes} in the layers)")
    kind = "commit" if commit else ("profile" if profile else "window")
    meta = {"env": env, "model": m.path, "graph": kind, "window": window, "nodes": summary.nodes,
            "edges": summary.edges, "programmatic": summary.programmatic, "layer_nodes": layer_nodes}
    emit([{"node": k, "count": c} for k, c in summary.kinds],
         [Column("node", justify="left"), Column("count")], fmt, title=what, header_lines=head, meta=meta)
