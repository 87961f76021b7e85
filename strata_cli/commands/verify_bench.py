"""`strata verify-bench`: what a verify window of T tokens costs, per T (options named as llama-bench names them)."""

from __future__ import annotations

import click

from ._common import (SEED, STDIN, FileParam, FiniteFloatRange, StrataCommand, context_hint, ctx_option,
                      deprecated_alias, device_option, format_option, load_engine, load_model, model_argument,
                      parse_window_list)
from ._split import split_config, split_options
from ._stages import add_stages, emit_stage_table
from ._tiers import tier_config, tier_options
from .logprobs import token_options

# (key, table header, display format): the table/md columns; csv/json/jsonl print every key of the record, raw
COLUMNS = [("window", "T", None), ("ms_median", "ms/window", ".3f"), ("ms_p10", "p10", ".3f"),
           ("ms_p90", "p90", ".3f"), ("ms_stddev", "stddev", ".3f"), ("host_ms", "host ms", ".3f"),
           ("rows_per_s", "rows/s", ",.0f"), ("expected_tokens", "E tokens", ".2f"),
           ("accepted_tok_per_s", "accepted tok/s", ",.0f"), ("speedup_vs_t1", "speedup vs T=1", ".2f"),
           ("ms_vs_t1", "t/t(1)", ".2f")]
GPU_COLUMNS = [("capture_ms", "capture ms", ".1f"), ("read_bytes", "GB read", lambda v: f"{v / 1e9:.3f}"),
               ("floor_ms", "floor ms", ".3f"), ("x_floor", "x floor", ".2f")]
DEFAULT_ACCEPTANCE = 0.7


def _add_floor(records, model) -> None:
    """Bytes each window reads, and the measured device copy rate (the floor follows from both)."""
    from ..analysis.traffic import window_bytes
    from ..gpu.runtime import copy_bandwidth

    bandwidth = copy_bandwidth()
    for rec in records:
        traffic = window_bytes(model, rec.window)
        rec.read_bytes, rec.dense_bytes = int(round(traffic["total"])), int(traffic["dense"])
        rec.expert_bytes, rec.copy_bytes_per_s = int(round(traffic["experts"])), float(bandwidth)


@click.command(cls=StrataCommand, short_help="Time verify windows per window size.")
@model_argument
@click.option("--window", "window_list", default="1,2,4,8", show_default=True, help="Window sizes T, comma-separated.")
@click.option("-r", "--repetitions", type=click.IntRange(min=1), default=20, show_default=True,
              help="Timed windows per T (after --warmup untimed ones).")
@deprecated_alias("--windows", "-r/--repetitions", "repetitions", type=click.IntRange(min=1))
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Untimed windows per T before the timed ones.")
@click.option("-d", "--depth", type=click.IntRange(min=0), default=32, show_default=True,
              help="Tokens of context committed before the timed windows (--ctx is the cells allocated).")
@deprecated_alias("--context", "-d/--depth", "depth", type=click.IntRange(min=0))
@click.option("--acceptance", type=FiniteFloatRange(0, 1), default=None,
              help=f"Assumed per-draft acceptance for n_keep, E(T) and the speedup  [default: {DEFAULT_ACCEPTANCE}]")
@click.option("--acceptance-from", "acceptance_dump", type=FileParam(STDIN, dir_okay=False),
              help="Use the per-position acceptance a `strata logprobs --draft-noise` loop measured (its dump).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the tokens and the drawn n_keep.")
@click.option("--eager", is_flag=True, help="GPU: launch the kernels one by one instead of replaying the graph.")
@token_options(with_random=False)
@format_option()
@device_option
@ctx_option
@tier_options
@split_options
def command(model, window_list, repetitions, warmup, depth, acceptance, acceptance_dump, seed, eager, token_file,
            text, text_file, fmt, device, n_ctx, gpus, layer_split, **tier_args):
    """Per window size T: ms per window (median, p10, p90, stddev over -r timed windows), rows/s, E(T) tokens per
    window and the speedup over T = 1 at the assumed or measured acceptance, under the run's provenance.
    With expert tiers (GPU): the VRAM / PCIe / CPU shares of the routed entries, the GPU's time in each wait and
    the host's time per window; --expert-cache as a list (0,4096,12GiB,all) sweeps the cache sizes. With --tokens,
    --text or --text-file the context and the windows follow that text (else seeded random ids)."""
    from ..errors import OptionError

    split = split_config(gpus, layer_split)
    expert_cache = tier_args["expert_cache"]
    caches = [c.strip() for c in expert_cache.split(",")] if expert_cache else [None]
    if "" in caches:
        raise OptionError(f"--expert-cache '{expert_cache}': an empty cache size in the list")
    configs = [tier_config(**tier_args, cache_override=cache) for cache in caches]  # every spec checked before the first run
    sources = dict(token_file=token_file, text=text, text_file=text_file)
    for tiers in configs:
        _bench(model, window_list, repetitions, warmup, depth, acceptance, acceptance_dump, seed, eager, fmt,
               device, n_ctx, tiers, sources, split)


def _text_ids(m, sources: dict, need: int):
    """The ids of --tokens / --text / --text-file (None: random ids), checked against the vocabulary and long
    enough for the context and the largest window."""
    from ..errors import InputError
    from ..model.tokens import check_range, tokens_from_options

    if all(v is None for v in sources.values()):
        return None, "random ids"
    ids, source = tokens_from_options(m, **sources)
    check_range(ids, m.geometry.n_vocab, source)
    if len(ids) < need:
        raise InputError(f"{source}: {len(ids)} tokens; --depth and the largest --window need {need}")
    return ids, f"{source} ({len(ids)} tokens)"


def _bench(model, window_list, repetitions, warmup, depth, acceptance, acceptance_dump, seed, eager, fmt, device,
           n_ctx, tiers, sources, split=None):
    from ..analysis.speculation import Acceptance, acceptance_from_dump
    from ..analysis.window_timing import run_bench
    from ..errors import InputError, OptionError
    from ..report.envinfo import environment_record, header_line
    from ..report.present import Column, emit
    from ..report.progress import step_progress
    from ..report.records import ModelIdentity, Provenance, command_line, utc_timestamp

    windows = parse_window_list(window_list)
    if acceptance is not None and acceptance_dump:
        raise OptionError("give --acceptance A or --acceptance-from DUMP, not both")
    accept = acceptance_from_dump(acceptance_dump) if acceptance_dump else \
        Acceptance.assumed(DEFAULT_ACCEPTANCE if acceptance is None else acceptance)
    if accept.max_window() is not None and max(windows) > accept.max_window():
        raise InputError(f"--window {max(windows)}: {acceptance_dump} measured acceptance up to T = "
                         f"{accept.max_window()} only")
    m = load_model(model)
    text, text_label = _text_ids(m, sources, depth + max(windows))
    engine = load_engine(m, device, n_ctx, tiers=tiers, split=split)
    if eager and not engine.capabilities.eager:
        raise OptionError("--eager compares graph replay with eager launches: it needs --device gpu")
    if engine.max_t is not None and max(windows) > engine.max_t:
        raise OptionError(f"--window {max(windows)} exceeds the engine's max_t {engine.max_t}")
    if depth + max(windows) > engine.n_ctx:
        raise OptionError(f"--depth {depth} + window {max(windows)} past the context {engine.n_ctx} "
                          f"({context_hint(engine.n_ctx, m.geometry.n_ctx, '-d/--depth')})")
    env = environment_record(engine.device)
    mode = "eager" if eager else ("graph" if engine.capabilities.graphs else "numpy")
    timer = engine.window_timer(eager)
    sizes = sorted(set(windows) | {1})
    with step_progress("timing windows", total=len(sizes)) as progress:
        def step(T):
            progress(sizes.index(T), description=f"T = {T}: {repetitions} windows")

        records = run_bench(engine, windows, repetitions, accept, depth, seed, warmup=warmup, timer=timer,
                            progress=step, text=text)
    columns = [Column(k, h, f) for k, h, f in COLUMNS]
    if engine.device == "gpu":
        _add_floor(records, m)
        columns += [Column(k, h, f) for k, h, f in GPU_COLUMNS]
    if engine.capabilities.graphs:
        for rec in records:
            rec.capture_ms = engine.capture_ms.get(rec.window)
    split_run = getattr(engine, "stages", None) is not None
    if split_run:  # the layer split: per stage time, bytes, hand-off, tiers (the table's second table)
        add_stages(records, engine, m, repetitions)
    if engine.tiers is not None:  # expert tiers: shares and waits per T (tiers/stats.py)
        from ..tiers.stats import TIER_COLUMNS, add_tier_stats

        add_tier_stats(records, engine, repetitions)
        columns += [Column(k, h, f) for k, h, f in TIER_COLUMNS]
    engine.close()
    prov = Provenance(timestamp=utc_timestamp(), command=command_line(), seed=seed, depth=depth,
                      n_ctx=engine.n_ctx, warmup=warmup, repetitions=repetitions,
                      acceptance=accept.rates[0] if accept.constant else None,
                      acceptance_per_position=None if accept.constant else list(accept.rates),
                      acceptance_source=accept.source, mode=mode, model=ModelIdentity.of(m), env=env,
                      tokens=text_label)
    for rec in records:
        rec.provenance = prov
    head = [header_line(env), f"model {m.path} | {mode} | depth {depth} | ctx {engine.n_ctx} | acceptance "
            f"{accept.describe()} | {repetitions} windows per T after {warmup} warm-up | tokens: {text_label}"]
    for note in (engine.tier_note, getattr(engine, "split_note", None)):
        if note:
            head.append(note)
    emit([rec.flat() for rec in records], columns if fmt in ("table", "md") else None, fmt, header_lines=head,
         title="verify windows", meta={"provenance": prov.flat()})
    if split_run and fmt in ("table", "md"):  # csv/json/jsonl: the same values as each row's stageI_* keys
        emit_stage_table(records, fmt)
