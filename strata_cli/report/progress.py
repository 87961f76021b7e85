"""Progress on stderr for the long steps (model load, graph capture, logprobs, each T of verify-bench, writes).

Bars are drawn only when stderr is a terminal; piped or redirected, stderr gets no progress at all (the callbacks
still work, they draw nothing). Bars are transient: they disappear when the step ends.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

# rich.progress is imported only when a bar is drawn (stderr a terminal): a piped `strata info` of a 50 GB file
# runs in well under a second, and its import is a measurable share of that


def _no_bar(*args, **kwargs) -> None:
    """The callback of a step whose bar is not drawn (stderr piped or redirected)."""


def _stderr(console: Console | None) -> Console:
    if console is not None:
        return console
    from .present import err_console

    return err_console()


@contextmanager
def byte_progress(description: str, console: Console | None = None):
    """Yields a callback(bytes_done, bytes_total) that drives one bar."""
    console = _stderr(console)
    if not console.is_terminal:
        yield _no_bar
        return
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


@contextmanager
def step_progress(description: str, total: int | None = None, console: Console | None = None):
    """Yields a callback(done, total=None, description=None) for a step of `total` units (None: a spinner)."""
    console = _stderr(console)
    if not console.is_terminal:
        yield _no_bar
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(description, total=total)

        def update(done: int, total: int | None = None, description: str | None = None) -> None:
            fields = {"completed": done}
            if total is not None:
                fields["total"] = total
            if description is not None:
                fields["description"] = description
            bar.update(task, **fields)

        yield update


FAILED_NOTE_S = 1.0  # a load phase that fails sooner prints nothing of its own


@contextmanager
def timed_phase(description: str, console: Console | None = None, quiet: bool = False):
    """One phase of a long load: a spinner while it runs (a terminal only), then one line on stderr, `load: WHAT in
    S s` (WHAT: the yielded dict's "what", default the description), or `load: DESCRIPTION failed after S s` when it
    raised after FAILED_NOTE_S or more, so a log shows where a slow or stuck load spent its time (a quick refusal,
    e.g. a profile of another model, stays the one line of its error). quiet: the spinner only."""
    console = _stderr(console)
    info = {"what": description}
    t0 = time.perf_counter()
    try:
        with step_progress(description, console=console):
            yield info
    except BaseException:
        if not quiet and time.perf_counter() - t0 >= FAILED_NOTE_S:
            console.print(f"load: {description} failed after {time.perf_counter() - t0:.2f} s", style="dim",
                          highlight=False, soft_wrap=True)
        raise
    if not quiet:
        console.print(f"load: {info['what']} in {time.perf_counter() - t0:.2f} s", style="dim", highlight=False,
                      soft_wrap=True)
