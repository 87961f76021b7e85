"""`strata profile`: where the GPU time of a verify window goes, stage by stage (the profiling graph's stamps)."""

from __future__ import annotations

import click

from ._common import (SEED, FiniteFloatRange, StrataCommand, context_hint, ctx_option, deprecated_alias, format_option,
                      load_engine, load_model, model_argument, require_gpu)

# (key, table header, display format, justify): the table/md columns; csv/json/jsonl print every key, raw
COLUMNS = [("layer", "layer", None, "left"), ("group", "group", None, "left"), ("stage", "stage", None, "left"),
           ("layers", "n", None, "right"), ("ms", "ms/window", ".4f", "right"), ("share", "share", ".1%", "right"),
           ("bytes", "MB", lambda v: f"{v / 1e6:.3f}", "right"), ("floor_us", "floor µs", ".2f", "right"),
           ("x_floor", "x floor", ".1f", "right"), ("bar", "", None, "left")]


@click.command(cls=StrataCommand, short_help="Per-stage GPU time of a verify window (stamped profiling graph).")
@model_argument
@click.option("--window", "window", type=click.IntRange(1, 16), default=1, show_default=True, help="Window size T.")
@click.option("-r", "--repetitions", "repetitions", type=click.IntRange(min=1), default=20,
              show_default=True, help="Profiled windows (after --warmup); as many normal windows are timed too.")
@deprecated_alias("--windows", "-r/--repetitions", "repetitions", type=click.IntRange(min=1))
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Untimed windows before the profiled ones.")
@click.option("-d", "--depth", "depth", type=click.IntRange(min=0), default=32, show_default=True,
              help="Tokens of context committed before the profiled windows.")
@deprecated_alias("--context", "-d/--depth", "depth", type=click.IntRange(min=0))
@click.option("--acceptance", type=FiniteFloatRange(0, 1), default=0.7, show_default=True,
              help="Assumed per-draft acceptance (how many rows each window commits).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the tokens and the drawn n_keep.")
@click.option("--per-layer", "per_layer", is_flag=True, help="Add one row per (layer, stage).")
@format_option()
@ctx_option
def command(model, window, repetitions, warmup, depth, acceptance, seed, per_layer, fmt, n_ctx):
    """ms per window per stage (GDN and QSA layers apart, then the window's own stages: embedding, head), its
    share of the CUDA-event time of the same windows, the bytes it reads (weights, expected distinct experts,
    state at the depth), the time those take at the measured device copy rate (its floor) and how many times that
    floor it took, and a bar; the stamps' total against that event time, and the time of as many windows of the
    normal graph. Needs a CUDA GPU."""
    from ..analysis.speculation import Acceptance
    from ..analysis.traffic import floor_line, floor_summary, stage_bytes, window_bytes
    from ..analysis.window_timing import check_finite, profile_windows
    from ..engine.stage_timing import accounting_line, aggregate, table_rows
    from ..errors import OptionError
    from ..gpu.runtime import copy_bandwidth
    from ..report.envinfo import environment_record, header_line
    from ..report.present import Column, emit
    from ..report.progress import step_progress

    m = load_model(model)
    require_gpu("profile")
    engine = load_engine(m, "gpu", n_ctx)
    if window > engine.max_t:
        raise OptionError(f"--window {window} exceeds the engine's max_t {engine.max_t}")
    if depth + window > engine.n_ctx:
        raise OptionError(f"--depth {depth} + window {window} past the context {engine.n_ctx} "
                          f"({context_hint(engine.n_ctx, m.geometry.n_ctx, '-d/--depth')})")
    check_finite(engine, window, seed)
    with step_progress(f"profiling {repetitions} windows of T = {window}"):
        run = profile_windows(engine, window, repetitions, depth, seed, Acceptance.assumed(acceptance),
                              warmup=warmup)
    reads = stage_bytes(run["reads"], m.geometry, window, depth)
    report = aggregate(run["stamps"], run["plan"], run["event_ms"], window, [r["bytes"] for r in reads])
    bandwidth = float(copy_bandwidth())
    floor = floor_summary(reads, window_bytes(m, window)["total"], bandwidth, report.event_ms)
    env = environment_record("gpu")
    normal, stamped = run["normal_ms_median"], run["profile_ms_median"]
    lines = [f"profiling graph {stamped:.4f} ms (median), normal graph {normal:.4f} ms: the "
             f"{len(run['plan'].slots)} stamp nodes cost {stamped / normal - 1:+.1%}", accounting_line(report),
             floor_line(floor, depth)]
    head = [header_line(env), f"model {m.path} | {window}-token window | {repetitions} windows after {warmup} "
            f"warm-up | depth {depth} | acceptance {acceptance}", *lines]
    meta = {"env": env, "model": m.path, "window": window, "windows": repetitions, "warmup": warmup,
            "depth": depth, "acceptance": acceptance, "seed": seed, "stamps": len(run["plan"].slots),
            "stamped_ms": report.stamped_ms, "event_ms": report.event_ms, "unaccounted_ms": report.unaccounted_ms,
            "unaccounted_share": report.unaccounted_share, "profile_ms_median": stamped, "normal_ms_median": normal,
            **floor}
    columns = [Column(k, h, f, justify=j) for k, h, f, j in COLUMNS]
    emit(table_rows(report, per_layer, bandwidth), columns if fmt in ("table", "md") else None, fmt,
         title="GPU stages of the verify window", header_lines=head, meta=meta)
    if fmt in ("csv", "jsonl"):  # no header lines in these: the comparison goes to stderr
        for line in lines:
            click.echo(line, err=True)
