"""`strata cache-sim TRACE`: replay a routing trace against expert cache policies and sizes (tiers/cache_policy.py)."""

from __future__ import annotations

import click

from ._common import STDIN, FileParam, StrataCommand, format_option
from ..tiers.cache_policy import DEFAULT_MAX_COPY
from .profile_info import _slot_list


@click.command(cls=StrataCommand,
               short_help="Replay a routing trace against expert cache policies and sizes: hit rate, copies.")
@click.argument("trace_path", metavar="TRACE", type=FileParam(STDIN, dir_okay=False))
@click.option("--slots", required=True, callback=_slot_list,
              help="Cache sizes: (layer, expert) slots over all layers, as --expert-cache N, e.g. 512,4096.")
@click.option("--policy", "policies", default="static,lru,lfu", show_default=True,
              help="Cache policies, comma-separated (static, lru, lfu).")
@click.option("--profile", "profile_path", type=FileParam(STDIN, dir_okay=False),
              help="Expert profile whose ranked order gives the static set (default: the same share per layer).")
@click.option("--max-copy", default=DEFAULT_MAX_COPY, show_default=True,
              help="Bytes an adaptive policy may copy into VRAM per window (as the engine's --expert-max-copy; "
              "the default is the engine's at the constant rates, tiers/cache_policy.py).")
@click.option("--per-layer", is_flag=True, help="One row per policy, size and layer.")
@format_option()
def command(trace_path, slots, policies, profile_path, max_copy, per_layer, fmt):
    """Serve the trace's windows in order from a VRAM cache of N slots under each policy (static = the profile's
    first N ranked pairs; lru and lfu start from that set and update it between windows) and print per policy and
    size the hit rate (picks served from VRAM / all picks) and the bytes copied into VRAM per window."""
    from ..errors import InputError, OptionError
    from ..report.present import Column, emit
    from ..tiers.cache_policy import check_policy, replay
    from ..tiers.residency import parse_size
    from ..tiers.trace import load_trace

    names = [check_policy(p.strip()) for p in policies.split(",") if p.strip()]
    if not names:
        raise OptionError(f"--policy {policies!r}: name at least one policy")
    budget = parse_size(max_copy, "--max-copy")
    trace = load_trace(trace_path)
    n_pairs = trace.n_layers * trace.n_expert
    for n in slots:
        if n > n_pairs:
            raise OptionError(f"--slots {n}: the trace's model has {n_pairs} (layer, expert) pairs")
    profile = None
    if profile_path is not None:
        from ..tiers.expert_profile import load_profile

        profile = load_profile(profile_path)
        if (profile.n_layers, profile.n_expert) != (trace.n_layers, trace.n_expert):
            raise InputError(f"{profile_path}: profile of another geometry ({profile.n_layers} x {profile.n_expert}, "
                             f"{trace_path} is {trace.n_layers} x {trace.n_expert})")
    rows = [row for name in names for n in slots
            for row in replay(trace, name, n, profile, budget).rows(per_layer)]
    cols = [Column("policy"), Column("slots")] + ([Column("layer")] if per_layer else []) + [
        Column("hit_rate", "hit rate", fmt=lambda v: "-" if v is None else f"{v:.2%}"),
        Column("copied_bytes_per_window", "MB copied/window", fmt=lambda v: f"{v / 1e6:.3f}"),
        Column("swaps_per_window", "swaps/window", fmt=".2f")]
    head = [f"trace {trace_path}: {len(trace.layer)} picks in {trace.n_windows} windows, {trace.n_layers} layers x "
            f"{trace.n_expert} experts; static set: {f'profile {profile_path}' if profile else 'the same share per layer'}"
            f"; at most {budget} bytes copied per window"]
    meta = {"trace": str(trace_path), "profile": profile_path, "windows": trace.n_windows,
            "picks": len(trace.layer), "max_copy_bytes": budget}
    emit(rows, cols, fmt, title="expert cache policies", header_lines=head, meta=meta)
