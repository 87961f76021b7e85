"""A rich progress bar on stderr that fits write_model's (bytes_done, bytes_total) callback."""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn


@contextmanager
def byte_progress(description: str, console: Console | None = None):
    """Yields a callback(bytes_done, bytes_total) that drives one bar; the bar disappears when done."""
    console = console or Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update
