"""The `strata` root group: lazily loaded subcommands and the one error policy for all of them."""

from __future__ import annotations

import importlib
import os
import sys

import click

from . import __version__, settings
from .errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, StrataError
from .sysio.files import os_reason
from .sysio.signals import exit_code_for_interrupt, install_sigbus_handler, signal_handlers

# name -> (module under strata_cli.commands exposing a click command `command`, short help for `strata --help`).
# The short help lives here so that `strata --help` imports no command module (and no numpy, CuPy, ...).
COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("info", "Show a model's geometry, layer layout, tensor types and sizes."),
    "make-model": ("make_model", "Write a synthetic random-weight qwen4exp GGUF."),
    "quantize": ("quantize", "Quantize an F32/F16/BF16 qwen4exp GGUF to another type or a recipe."),
    "logprobs": ("logprobs", "Dump per-position logprobs of a token sequence."),
    "compare": ("compare", "Compare two logprob dumps of the same tokens."),
    "compare-models": ("compare_models", "KL divergence, PPL ratio, Δp and top-1 agreement of one model against "
                       "another."),
    "verify-bench": ("verify_bench", "Time verify windows per window size."),
    "make-profile": ("make_profile", "Count the router's picks of a run and write an expert profile (YAML or STRP)."),
    "profile-info": ("profile_info", "Show an expert profile: coverage and held-out hit rate per cache size."),
    "cache-sim": ("cache_sim", "Replay a routing trace against expert cache policies and sizes: hit rate, copies."),
    "graph-nodes": ("graph_nodes", "Count and list the nodes of a captured window graph (GPU)."),
    "stall-test": ("stall_test", "Stall a verify window on purpose; the watchdog must release it (GPU)."),
    "profile": ("profile", "Per-stage GPU time of a verify window (stamped profiling graph)."),
}

def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return "; ".join(lines) or type(exc).__name__


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
        qualified = f"{__package__}.commands.{self.lazy_commands[name][0]}"
        module = importlib.import_module(qualified)
        command = getattr(module, "command", None)
        from .commands._common import StrataCommand

        if not isinstance(command, StrataCommand):  # its `-` rule: one reader of stdin, one writer of stdout
            raise TypeError(f"{qualified} has no StrataCommand named 'command'")
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
            result = super().invoke(ctx)
            _verify_profile_lines()
            return result
        except StrataError as exc:
            if _traceback_wanted():
                raise
            _error_line(_one_line(exc))
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt as exc:  # Ctrl-C, and SIGTERM / SIGHUP through sysio/signals.signal_handlers
            click.echo("", err=True)
            ctx.exit(exit_code_for_interrupt(exc))
        except BrokenPipeError:
            _silence_stdout()
            ctx.exit(EXIT_ERROR)
        except OSError as exc:  # an OS error no library call translated (full disk, closed stdout, ...)
            if _traceback_wanted():
                raise
            where = exc.filename if exc.filename is not None else "strata"
            _error_line(f"{where}: {os_reason(exc)}")
            ctx.exit(EXIT_ERROR)
        except MemoryError:
            if _traceback_wanted():
                raise
            _error_line("out of memory (the host could not allocate what this command needs; try a smaller "
                        "--ctx, fewer tokens or a smaller model)")
            ctx.exit(EXIT_ERROR)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """click's main with one error policy: usage errors are one line too (exit 2), stdout is flushed
        inside the policy (a full device or closed stdout is one line), SIGTERM/SIGHUP clean up like Ctrl-C."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        code = EXIT_OK
        _tolerant_encoding()
        install_sigbus_handler()
        with signal_handlers():
            try:
                result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
                code = result if isinstance(result, int) and not isinstance(result, bool) else EXIT_OK
                problem = _flush_stdout()
                if problem:
                    _error_line(problem)
                    code = EXIT_ERROR
            except click.exceptions.NoArgsIsHelpError as exc:
                click.echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
                code = EXIT_USAGE
            except click.UsageError as exc:
                hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
                _error_line(f"{exc.format_message()}{hint}")
                code = EXIT_USAGE
            except click.ClickException as exc:
                _error_line(exc.format_message())
                code = exc.exit_code
            except click.Abort as exc:
                code = exit_code_for_interrupt(exc.__context__) if isinstance(
                    exc.__context__, KeyboardInterrupt) else EXIT_INTERRUPTED
            except KeyboardInterrupt as exc:
                code = exit_code_for_interrupt(exc)
            except BrokenPipeError:
                _silence_stdout()
                code = EXIT_ERROR
        sys.exit(code)


def _tolerant_encoding() -> None:
    """An ASCII (or other narrow) stdout/stderr, e.g. PYTHONIOENCODING=ascii or LANG=C: characters it cannot
    encode ("Δ", box drawing, non-ASCII paths) are written as backslash escapes instead of crashing the command."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and stream.errors == "strict":
                stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass


def _verify_profile_lines() -> None:
    """STRATA_VERIFY_PROFILE: the seed's one-line stage summary of the GPU windows the command ran (stderr)."""
    if not settings.VERIFY_PROFILE.value():
        return
    from .engine.stage_timing import pending_lines

    for line in pending_lines():
        click.echo(line, err=True)


def _silence_stdout() -> None:
    """The reader went away (`strata ... | head`): point stdout at /dev/null so the exit flush does not complain."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _traceback_wanted() -> bool:
    try:
        return settings.TRACEBACK.value()
    except settings.SettingError:  # the error being reported may be this very setting's
        return False


def _error_line(message: str) -> None:
    """`strata: error: ...` on stderr, as one line whatever the message holds and whatever stderr can encode."""
    line = " ".join(f"strata: error: {message}".split())
    try:
        click.echo(line, err=True)
    except UnicodeEncodeError:
        click.echo(line.encode("ascii", "backslashreplace").decode("ascii"), err=True)
    except (OSError, ValueError, AttributeError):  # stderr closed too: nothing left to tell
        pass


def _flush_stdout() -> str | None:
    """Flush data now so a full device is reported in one line, not at interpreter exit; the problem or None."""
    if sys.stdout is None:
        return None
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        _silence_stdout()
        return f"stdout: cannot write the output: {os_reason(exc)}"
    except ValueError:  # stdout closed by the command
        pass
    return None

@click.group(cls=LazyGroup, lazy_commands=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="strata", message="%(prog)s %(version)s")
def main():
    """strata: load qwen4exp GGUF MoE models and run, check and time the speculative-decoding verify window.

    The numpy reference engine runs anywhere (--device cpu); the CuPy/CUDA-graph engine needs a GPU
    (--device gpu). MODEL arguments are optional and default to a tiny synthetic model generated once into
    $STRATA_CACHE (default ~/.cache/strata).

    Errors are printed as one line (exit 1; usage errors exit 2; compare thresholds 3; non-finite values 4;
    signals 128+N); set STRATA_TRACEBACK=1 to see the traceback.
    """
    settings.check_environment()  # a bad STRATA_* value is one line (exit 2) before any work
