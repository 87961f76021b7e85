"""`strata make-profile [MODEL]`: count the router's picks over a token sequence and write an expert profile."""

from __future__ import annotations

import click

from ._common import (SEED, STDIN, STDOUT, FileParam, StrataCommand, ctx_option, format_option, load_model,
                      model_argument)
from .logprobs import token_options

TRACE_REFUSED = "a routing trace is a NumPy archive (binary, .npz), written to a file: give a path"


def _cache_spec(ctx, param, value):
    """--expert-cache checked when parsed (one line, exit 2, on any device); None: engine/routing.COUNTING_CACHE."""
    from ..tiers.residency import parse_cache_spec

    return None if value is None else parse_cache_spec(value).text


@click.command(cls=StrataCommand,
               short_help="Count the router's picks of a run and write an expert profile (YAML or STRP).")
@model_argument
@token_options
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of --random.")
@click.option("--holdout", type=FileParam(STDIN, dir_okay=False),
              help="Token file of held-out text: report the profile's hit rate on it per slot count.")
@click.option("--slots", type=click.IntRange(min=0), default=None,
              help="Cache size the profile suggests (default: every pair the run routed to).")
@click.option("--window", type=click.IntRange(1, 64), default=8, show_default=True,
              help="Tokens per window of the counting run (the counts do not depend on it).")
@click.option("-o", "--output", required=True, type=FileParam(STDOUT, dir_okay=False),
              help="Profile to write: .yaml (counts, ranked order) or .bin (the seed's STRP v1); - = YAML on "
              "stdout (the report then goes to stderr).")
@click.option("--force", is_flag=True, help="Overwrite the -o file if it exists.")
@click.option("--device", type=click.Choice(["cpu", "gpu"]), default="cpu", show_default=True,
              help="Count on the numpy engine, or on the GPU engine (the same picks, far faster on a large model).")
@click.option("--expert-cache", default=None, metavar="all|auto|N|SIZE", callback=_cache_spec,
              help="--device gpu: routed experts in VRAM during the counting run. auto: all of them when they fit "
              "in free device memory (the engine's doorbell-free graph), else as many as fit (the host serves the "
              "rest); N slots or a SIZE as verify-bench's. The counts do not depend on it.  [default: auto]")
@click.option("--trace", "trace_path", type=FileParam(STDOUT, TRACE_REFUSED, dir_okay=False),
              help="Also write every routed pick of the counting run here (.npz; the input of `strata cache-sim`).")
@format_option()
@ctx_option
def command(model, token_file, n_random, text, text_file, seed, holdout, slots, window, output, force, trace_path,
            fmt, n_ctx, device, expert_cache):
    """Run MODEL's numpy reference engine (or with --device gpu the GPU engine) over the tokens (every row committed), count how often the router
    picked each (layer, expert) pair, rank the pairs hottest first and write the profile atomically. Prints the
    share of the counted picks the first N ranked pairs serve (coverage) and, with --holdout, the hit rate on the
    held-out tokens."""
    import sys

    from ..engine.routing import COUNTING_CACHE, count_routing
    from ..errors import OptionError
    from ..model.tokens import check_range, read_token_file, tokens_from_options
    from ..report.progress import step_progress
    from ..sysio.files import is_stdio
    from ..tiers.expert_profile import ExpertProfile, check_profile_path, save_profile, slot_counts
    from ..tiers.residency import expert_bytes
    from ..tiers.trace import TraceRecorder, check_trace_path, save_trace
    from .profile_info import report

    if device == "cpu" and expert_cache is not None:
        from ..report.present import warn

        warn(f"--expert-cache {expert_cache}: the numpy engine (--device cpu) keeps every expert in memory")
    cache = COUNTING_CACHE if expert_cache is None else expert_cache
    check_profile_path(output, force=force)  # before the run, not after it
    if trace_path is not None:
        check_trace_path(trace_path)
    m = load_model(model)
    g = m.geometry
    if slots is not None and slots > g.n_layers * g.n_expert:
        raise OptionError(f"--slots {slots}: the model has {g.n_layers * g.n_expert} (layer, expert) pairs")
    tokens, source = tokens_from_options(m, token_file=token_file, n_random=n_random, text=text,
                                         text_file=text_file, seed=seed)
    check_range(tokens, g.n_vocab, source)
    held = None
    if holdout is not None:
        held_tokens = read_token_file(holdout)
        check_range(held_tokens, g.n_vocab, holdout)
    recorder = None if trace_path is None else TraceRecorder(g.n_layers, g.n_expert, expert_bytes(m))
    with step_progress(f"routing {len(tokens)} tokens", total=len(tokens)) as progress:
        counts = count_routing(m, tokens, window, n_ctx, progress, device, trace=recorder, cache=cache)
    profile = ExpertProfile.from_counts(counts, g, m.path, tokens_seen=len(tokens), slots=slots)
    save_profile(profile, output)
    head = [f"wrote {output}: {source} ({len(tokens)} tokens) through {m.path}"]
    if recorder is not None:
        routed = recorder.trace()
        save_trace(routed, trace_path)
        head.append(f"wrote {trace_path}: {len(routed.layer)} picks in {routed.n_windows} windows")
    if holdout is not None:
        with step_progress(f"routing {len(held_tokens)} held-out tokens", total=len(held_tokens)) as progress:
            held = count_routing(m, held_tokens, window, n_ctx, progress, device, cache=cache)
    report(profile, output, slot_counts(profile.n_pairs, [profile.slots]), held, holdout, m, fmt, head=head,
           out=sys.stderr if is_stdio(output) else None)
