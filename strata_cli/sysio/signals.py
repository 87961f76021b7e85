"""Signals: `cli.main` runs every command inside `signal_handlers()`, which turns SIGTERM and SIGHUP into
`Terminated` (a KeyboardInterrupt), so every cleanup that runs on Ctrl-C also runs on TERM/HUP; the exit code is
128 + signal. SIGBUS (a memory-mapped model truncated under us) keeps the outputs written so far (files.py's
ACTIVE_OUTPUTS) and exits 135.
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager

from .files import ACTIVE_OUTPUTS


class Terminated(KeyboardInterrupt):
    """SIGTERM / SIGHUP delivered as an exception, so `finally` blocks and temp-file cleanup run."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_SIGBUS_HANDLER = None  # the ctypes callback, kept alive for the life of the process


def _raise_terminated(signum, frame):
    raise Terminated(signum)


@contextmanager
def signal_handlers():
    """SIGTERM and SIGHUP raise Terminated while the block runs (main thread only; previous handlers restored)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            previous[sig] = signal.signal(sig, _raise_terminated)
        except (ValueError, OSError):
            pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _on_sigbus(signum) -> None:
    """Runs on SIGBUS, inside whatever C code touched the vanished page: keep the rows written so far (rename each
    temporary output to a visible NAME.partial), say so in one line, and exit 135 (128 + SIGBUS) at once."""
    kept = []
    for tmp, target in list(ACTIVE_OUTPUTS):
        keep = f"{target}.partial"
        try:
            os.rename(tmp, keep)
            kept.append(keep)
        except OSError:
            pass
    line = ("strata: error: SIGBUS: a memory-mapped file (the model) was truncated or rewritten on disk while in "
            "use; stopped" + (f"; the rows written so far are in {', '.join(kept)}" if kept else "") + "\n")
    try:
        os.write(2, line.encode("utf-8", "backslashreplace"))
    finally:
        os._exit(128 + signal.SIGBUS)


def install_sigbus_handler() -> bool:
    """Catch SIGBUS (a memory-mapped model truncated under us) with a C-level handler that calls _on_sigbus.

    Python's own signal handlers cannot do this: the C handler returns, the faulting load runs again and the
    process spins. A ctypes callback runs Python code in the faulting thread instead (it takes the GIL the thread
    holds or can get); it only renames files, writes one line and _exits. What it cannot do: resume the run, or
    help when the GIL is held forever by another thread. Linux/glibc only; returns whether it was installed."""
    global _SIGBUS_HANDLER
    if _SIGBUS_HANDLER is not None:
        return True
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        handler_type = ctypes.CFUNCTYPE(None, ctypes.c_int)
        handler = handler_type(_on_sigbus)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = [ctypes.c_int, handler_type]
        if libc.signal(signal.SIGBUS, handler) == ctypes.c_void_p(-1).value:
            return False
    except (OSError, AttributeError, ValueError):
        return False
    _SIGBUS_HANDLER = handler
    return True


def exit_code_for_interrupt(exc: KeyboardInterrupt) -> int:
    """128 + the signal number: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + getattr(exc, "signum", signal.SIGINT)
