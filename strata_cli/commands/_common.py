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

STDIN, STDOUT = "stdin", "stdout"


class FileParam(click.Path):
    """The type of every file argument and option (tests/test_stdio_args.py finds them all by it). stdio: what `-`
    would be for it (STDIN for an input, STDOUT for an output); with a `refused` reason `-` is refused at parse time
    in one line (exit 2) saying why, else the command reads stdin or writes stdout. At most one argument of a
    command reads stdin, and one writes stdout (StrataCommand). Existence and kind are checked where the file is
    opened (one line, exit 1)."""

    def __init__(self, stdio: str, refused: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.stdio, self.refused = stdio, refused

    def convert(self, value, param, ctx):
        if str(value) == "-" and self.refused:
            self.fail(f"'-' ({self.stdio}) is not supported: {self.refused}", param, ctx)
        return super().convert(value, param, ctx)


def _param_label(param) -> str:
    return param.opts[0] if isinstance(param, click.Option) else param.human_readable_name


class StrataCommand(click.Command):
    """Every strata subcommand (cli.LazyGroup refuses any other): two arguments that are both `-` and read stdin
    (or both write stdout) are one usage error before the command runs, whatever it would do with them."""

    def invoke(self, ctx):
        for role in (STDIN, STDOUT):
            dashes = [_param_label(p) for p in self.params if isinstance(p.type, FileParam) and not p.type.refused
                      and p.type.stdio == role and str(ctx.params.get(p.name)) == "-"]
            if len(dashes) > 1:
                verb = "read stdin" if role == STDIN else "write stdout"
                raise click.UsageError(f"{' and '.join(dashes)} are each '-': only one argument can {verb}", ctx)
        return super().invoke(ctx)


# a model is memory-mapped (every reader maps the file and seeks in it): '-' cannot name one; refused at parse time,
# so a GPU-only command on a box without a GPU says this, not that it needs a GPU
MODEL_IN = FileParam(STDIN, "a GGUF model is memory-mapped, give a path")
MODEL_OUT = FileParam(STDOUT, "a GGUF model is written to a file (every reader memory-maps it), give a path")
model_argument = click.argument("model", required=False, metavar="[MODEL]", type=MODEL_IN)
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

    if model_arg is None:  # only then the synth package (numpy writer, presets): `info BIG.gguf` stays fast
        from ..synth.default_model import resolve_model

        model_arg = resolve_model(None)
    elif str(model_arg) == "":
        from ..errors import StrataError

        raise StrataError("MODEL is an empty string: give a GGUF path, or leave MODEL out for the default model")
    model = open_model(model_arg)
    for message in model.geometry.warnings:
        warn(f"{model.path}: {message}")
    return model


def load_engine(model, device: str, n_ctx: int | None = None, max_t: int | None = None, tiers=None, split=None):
    """The verify engine for `model` on `device`, behind a spinner (the GPU engine uploads every weight; with expert
    tiers (commands/_tiers.py) only the resident experts; split: --gpus / --layer-split, commands/_split.py)."""
    from ..engine import make_engine
    from ..report.progress import step_progress

    t0 = time.perf_counter()
    with step_progress(f"loading {model.path} (--device {device})"):
        engine = make_engine(model, device, n_ctx=n_ctx, max_t=max_t, tiers=tiers, split=split)
    if engine.tiers is not None:  # a tiered load also brings the experts' pages in: say how long it took
        from ..report.present import err_console

        err_console().print(f"engine built in {time.perf_counter() - t0:.1f} s", style="dim", highlight=False,
                            soft_wrap=True)
    return engine



def parse_window_list(text: str, option: str = "--window") -> list[int]:
    """`1,2,4,8` -> [1, 2, 4, 8]; an empty item, a repeated size, a non-integer or a size below 1 is one usage error
    (exit 2) naming the option."""
    from ..errors import OptionError

    items = [item.strip() for item in text.split(",")]
    if "" in items:
        raise OptionError(f"{option} '{text}': an empty item in the list (expected e.g. 1,2,4,8)")
    try:
        values = [int(item) for item in items]
    except ValueError:
        raise OptionError(f"{option} '{text}': expected comma-separated integers like 1,2,4,8") from None
    if min(values) < 1:
        raise OptionError(f"{option} '{text}': window sizes must be >= 1")
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise OptionError(f"{option} '{text}': {', '.join(map(str, repeated))} given twice")
    return values


def context_hint(n_ctx: int, model_ctx: int, lower: str) -> str:
    """What to change when a run does not fit the context: --ctx up to the model's context_length where that is
    larger, else `lower` (the option that asks for the positions)."""
    if n_ctx < model_ctx:
        return f"raise --ctx, up to the model's context_length {model_ctx}"
    return f"the model's context_length is {model_ctx}: lower {lower}"


def require_gpu(command: str) -> None:
    """The GPU-only commands (graph-nodes, profile, stall-test) have no numpy engine and no --device option: say
    what they need, not an option they do not take."""
    from ..engine import gpu_probe
    from ..errors import DeviceUnavailable

    _, why = gpu_probe()
    if why is not None:
        raise DeviceUnavailable(f"{command} runs on the GPU only (an NVIDIA GPU with CUDA and CuPy): {why}")


def run_provenance(env: dict, seed: int, n_ctx: int, **models) -> dict:
    """The provenance a JSON dump carries, in verify-bench's record keys (records.Provenance.flat): timestamp, the
    command line, seed, n_ctx, per model (by role: model, base, other) its path, bytes, header sha256 and type mix,
    and the environment record."""
    from ..report.records import ModelIdentity, command_line, utc_timestamp

    out = {"timestamp": utc_timestamp(), "command": command_line(), "seed": seed, "n_ctx": n_ctx}
    for role, model in models.items():
        ident = ModelIdentity.of(model)
        out.update({role: ident.path, f"{role}_bytes": ident.size_bytes, f"{role}_sha256": ident.header_sha256,
                    f"{role}_types": ident.type_mix})
    out.update(env)
    return out
