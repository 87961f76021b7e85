"""Options and loading shared by the commands: MODEL, --device, --ctx, --format, deprecated spellings."""

from __future__ import annotations

import time

import click

from ..report.present import RECORD_FORMATS


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that also refuses nan and +-inf (click's range checks let nan through)."""

    name = "finite float range"

    def convert(self, value, param, ctx):
        import math

        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


SEED_MAX = 2**63 - 1
SEED = click.IntRange(0, SEED_MAX)  # numpy's generators take non-negative seeds

model_argument = click.argument("model", required=False, metavar="[MODEL]")
device_option = click.option("--device", type=click.Choice(["cpu", "gpu", "auto"]), default="auto",
                             show_default=True, help="cpu = numpy reference; gpu = CUDA graph engine; auto = gpu if "
                             "one is usable, else cpu.")
ctx_option = click.option("--ctx", "n_ctx", type=click.IntRange(min=1), default=None,
                          help="Context cells to allocate (default: min(model context, 4096)).")


def format_option(formats=RECORD_FORMATS, default: str = "table"):
    """--format: table/md for reading, csv/json/jsonl for scripts (raw numbers)."""
    return click.option("--format", "fmt", type=click.Choice(list(formats)), default=default, show_default=True,
                        help="table and md for reading; csv, json, jsonl hold raw numbers for scripts.")


def deprecated_alias(old: str, new: str, dest: str, type=None, flag_value=None):
    """A hidden old spelling that keeps working: given, it fills `dest` (with its value, or `flag_value` for a
    flag) and says on stderr what replaces it."""

    def fill(ctx, param, value):
        if value is None or value is False:
            return
        from ..report.present import warn

        warn(f"{old} is deprecated: use {new}")
        ctx.params[dest] = flag_value if flag_value is not None else value

    extra = {"is_flag": True, "default": False} if flag_value is not None else {"type": type, "default": None}
    return click.option(old, f"deprecated_{dest}", hidden=True, expose_value=False, callback=fill,
                        help=f"Deprecated spelling of {new}.", **extra)


def load_model(model_arg: str | None):
    """Open MODEL, or the embedded default tiny model (generated once into the cache)."""
    from ..model.gguf_file import open_model
    from ..report.present import warn
    from ..synth.default_model import resolve_model

    model = open_model(resolve_model(model_arg))
    for message in model.geometry.warnings:
        warn(f"{model.path}: {message}")
    return model


def load_engine(model, device: str, n_ctx: int | None = None, max_t: int | None = None, tiers=None):
    """The verify engine for `model` on `device`, behind a spinner (the GPU engine uploads every weight; with expert
    tiers (commands/_tiers.py) only the resident experts)."""
    from ..engine import make_engine
    from ..report.progress import step_progress

    t0 = time.perf_counter()
    with step_progress(f"loading {model.path} (--device {device})"):
        engine = make_engine(model, device, n_ctx=n_ctx, max_t=max_t, tiers=tiers)
    if engine.tiers is not None:  # a tiered load also brings the experts' pages in: say how long it took
        from ..report.present import err_console

        err_console().print(f"engine built in {time.perf_counter() - t0:.1f} s", style="dim", highlight=False)
    return engine
