"""`strata verify-bench`: what a verify window of T tokens costs, per T."""

from __future__ import annotations

import click

from ._common import ctx_option, device_option, load_model, model_argument

COLUMNS = [("window", "T", None), ("ms_median", "ms/window", ".3f"), ("ms_p10", "p10", ".3f"),
           ("ms_p90", "p90", ".3f"), ("host_ms", "host ms", ".3f"), ("rows_per_s", "rows/s", ",.0f"), ("expected_tokens", "E tokens", ".2f"),
           ("accepted_tok_per_s", "accepted tok/s", ",.0f"), ("speedup_vs_t1", "speedup vs T=1", ".2f")]


FLOOR_COLUMNS = [("capture_ms", "capture ms", ".1f"), ("read_gb", "GB read", ".3f"), ("floor_ms", "floor ms", ".3f"),
                 ("x_floor", "x floor", ".2f")]


def _add_floor(records: list[dict], model) -> None:
    """Bytes each window reads, and the time that takes at the measured device copy rate."""
    from ..gpu.runtime import copy_bandwidth
    from ..traffic import window_bytes

    bandwidth = copy_bandwidth()
    for rec in records:
        traffic = window_bytes(model, rec["window"])
        rec.update(read_gb=traffic["total"] / 1e9, dense_gb=traffic["dense"] / 1e9,
                   expert_gb=traffic["experts"] / 1e9, copy_tb_s=bandwidth / 1e12,
                   floor_ms=traffic["total"] / bandwidth * 1e3)
        rec["x_floor"] = rec["ms_median"] / rec["floor_ms"]


def _windows(text: str) -> list[int]:
    from ..errors import InputError

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"--window '{text}': expected comma-separated integers like 1,2,4,8") from None
    if not values or min(values) < 1:
        raise InputError(f"--window '{text}': window sizes must be >= 1")
    return values


@click.command(short_help="Time verify windows per window size.")
@model_argument
@click.option("--window", "window_list", default="1,2,4,8", show_default=True, help="Window sizes T, comma-separated.")
@click.option("--windows", "n_windows", type=click.IntRange(min=1), default=20, show_default=True,
              help="Timed windows per T (after a warm-up).")
@click.option("--acceptance", type=click.FloatRange(0, 1), default=0.7, show_default=True,
              help="Per-draft acceptance probability for accepted tok/s and n_keep.")
@click.option("--context", type=click.IntRange(min=0), default=32, show_default=True,
              help="Tokens in the sequence before the timed windows.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--eager", is_flag=True, help="GPU: launch the kernels one by one instead of replaying the graph.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
@device_option
@ctx_option
def command(model, window_list, n_windows, acceptance, context, seed, eager, fmt, device, n_ctx):
    """Per window size T: ms per window (median, p10, p90), rows/s, and accepted tokens/s at --acceptance."""
    from ..bench import run_bench
    from ..engine import make_engine
    from ..envinfo import environment_record, header_line
    from ..errors import InputError
    from ..present import Column, emit

    windows = _windows(window_list)
    m = load_model(model)
    engine = make_engine(m, device, n_ctx=n_ctx)
    if eager and not engine.capabilities.eager:
        raise InputError("--eager compares graph replay with eager launches: it needs --device gpu")
    if engine.max_t is not None and max(windows) > engine.max_t:
        raise InputError(f"--window {max(windows)} exceeds the engine's max_t {engine.max_t}")
    if context + max(windows) > engine.n_ctx:
        raise InputError(f"--context {context} + window {max(windows)} past the context {engine.n_ctx}")
    env = environment_record(engine.device)
    records = run_bench(engine, windows, n_windows, acceptance, context, seed, timer=engine.window_timer(eager))
    mode = "eager" if eager else ("graph" if engine.capabilities.graphs else "numpy")
    columns = [Column(k, h, f) for k, h, f in COLUMNS]
    if engine.device == "gpu":
        _add_floor(records, m)
        columns += [Column(k, h, f) for k, h, f in FLOOR_COLUMNS]
    for rec in records:
        if engine.capabilities.graphs:
            rec["capture_ms"] = engine.capture_ms.get(rec["window"])
        rec.update(device=engine.device, mode=mode, acceptance=acceptance, context=context, model=m.path,
                   **{k: v for k, v in env.items() if k != "device"})
    head = [header_line(env), f"model {m.path} | {mode} | context {context} | acceptance {acceptance} | "
            f"{n_windows} windows per T"]
    emit(records, columns, fmt, header_lines=head, title="verify windows",
         meta={"env": env} if fmt == "json" else None)
