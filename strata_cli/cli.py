"""The `strata` root group: lazily loaded subcommands and the one error policy for all of them."""

from __future__ import annotations

import importlib
import os
import sys

import click

from . import __version__
from .errors import StrataError

# name -> (module under strata_cli.commands exposing a click command `command`, short help for `strata --help`).
# The short help lives here so that `strata --help` imports no command module (and no numpy, CuPy, ...).
COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("info", "Show a model's geometry, layer layout, tensor types and sizes."),
    "make-model": ("make_model", "Write a synthetic random-weight qwen4exp GGUF."),
    "logprobs": ("logprobs", "Dump per-position logprobs of a token sequence."),
    "compare": ("compare", "Compare two logprob dumps of the same tokens."),
    "compare-models": ("compare_models", "KL divergence, PPL ratio, Δp and top-1 agreement of one model against "
                       "another."),
    "verify-bench": ("verify_bench", "Time verify windows per window size."),
    "graph-nodes": ("graph_nodes", "Count and list the nodes of a captured window graph (GPU)."),
}

TRACEBACK_ENV = "STRATA_TRACEBACK"


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return "; ".join(lines) or type(exc).__name__


def _unavailable(name: str, short_help: str) -> click.Command:
    """Stands in for a command whose module is not in this build; takes any arguments, fails in one line."""

    def fail(args):
        raise StrataError(f"command '{name}' is not available in this build")

    return click.Command(name, callback=fail, short_help=short_help, add_help_option=False,
                         params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
                         context_settings={"ignore_unknown_options": True, "allow_extra_args": True})


class LazyGroup(click.Group):
    """A group whose commands are imported on first use; `--help` reads their short help from `lazy_commands`."""

    def __init__(self, *args, lazy_commands: dict[str, tuple[str, str]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy_commands = lazy_commands if lazy_commands is not None else {}

    def parse_args(self, ctx, args):
        ctx.meta["strata.argv"] = list(args)  # records.command_line: what the user typed, for provenance
        return super().parse_args(ctx, args)

    def list_commands(self, ctx):
        return list(self.lazy_commands) + sorted(set(self.commands) - set(self.lazy_commands))

    def get_command(self, ctx, name):
        if name in self.commands:
            return self.commands[name]
        if name not in self.lazy_commands:
            return None
        module_name, short_help = self.lazy_commands[name]
        qualified = f"{__package__}.commands.{module_name}"
        try:
            module = importlib.import_module(qualified)
        except ModuleNotFoundError as exc:
            if exc.name != qualified:  # the command exists but something it imports is missing: a real bug
                raise
            return _unavailable(name, short_help)
        command = getattr(module, "command", None)
        if not isinstance(command, click.Command):
            raise TypeError(f"{qualified} has no click command named 'command'")
        return command

    def format_commands(self, ctx, formatter):
        rows = []
        for name in self.list_commands(ctx):
            if name in self.lazy_commands and name not in self.commands:
                rows.append((name, self.lazy_commands[name][1]))
            else:
                command = self.commands[name]
                if not command.hidden:
                    rows.append((name, command.get_short_help_str(formatter.width)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except StrataError as exc:
            if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
                raise
            click.echo(f"strata: error: {_one_line(exc)}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt:
            click.echo("", err=True)
            ctx.exit(130)
        except BrokenPipeError:
            _silence_stdout()
            ctx.exit(1)


def _silence_stdout() -> None:
    """The reader went away (`strata ... | head`): point stdout at /dev/null so the exit flush does not complain."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


@click.group(cls=LazyGroup, lazy_commands=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="strata", message="%(prog)s %(version)s")
def main():
    """strata: load qwen4exp GGUF MoE models and run, check and time the speculative-decoding verify window.

    The numpy reference engine runs anywhere (--device cpu); the CuPy/CUDA-graph engine needs a GPU
    (--device gpu). MODEL arguments are optional and default to a tiny synthetic model generated once into
    $STRATA_CACHE (default ~/.cache/strata).

    Errors are printed as one line and exit 1; set STRATA_TRACEBACK=1 to see the traceback.
    """
