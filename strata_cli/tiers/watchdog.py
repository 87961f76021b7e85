"""Watchdog release: no GPU spin or wait may outlive a stalled window or its process.

Every GPU engine's tier host (tiers/host.py) registers itself here. The watchdog thread looks at the busy ones; when one has made no
progress for `timeout_s`, it releases every live verifier (flags to 0xFFFFFFFF, fence, bounded wait for the
streams) and reports one line per verifier. SIGINT/SIGTERM during a window release the same way, then act as
they would have. The first registration starts the process's own watchdog: STRATA_WATCHDOG_S seconds (default
60, as the seed's serve watchdog; 0 = off), which prints its lines on stderr.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import weakref
from typing import Callable

from .. import settings

_live: "weakref.WeakSet" = weakref.WeakSet()
_live_lock = threading.Lock()
_env_watchdog: "Watchdog | None" = None


def register(verifier) -> None:
    """A live verifier (busy, last_progress, released, describe_stall(), release(timeout_ms, reason))."""
    global _env_watchdog
    timeout = settings.WATCHDOG_S.value() if _env_watchdog is None else 0.0
    with _live_lock:
        _live.add(verifier)
        if _env_watchdog is None and timeout > 0:
            _env_watchdog = Watchdog(timeout, on_fire=_to_stderr).start()


def _to_stderr(lines: list[str]) -> None:
    for line in lines:
        print(f"strata: watchdog: {line}", file=sys.stderr, flush=True)


def unregister(verifier) -> None:
    with _live_lock:
        _live.discard(verifier)


def live_verifiers() -> list:
    with _live_lock:
        return list(_live)


def release_message(where: str, idle_ms: float | None) -> str:
    """The one line: 'window N stalled at layer L; GPU waits released; streams idle after X ms'."""
    after = f"streams idle after {idle_ms:.0f} ms" if idle_ms is not None else "streams NOT idle within the bound"
    return f"{where}; GPU waits released; {after}"


def release_live_verifiers(timeout_ms: int = 5000, reason: str = "released", only_busy: bool = False) -> list[str]:
    """Release every live (or every busy) verifier; one message per verifier released."""
    lines = []
    for verifier in live_verifiers():
        if only_busy and not verifier.busy:
            continue
        if verifier.released and not verifier.busy:
            continue
        where = verifier.describe_stall()
        lines.append(release_message(where, verifier.release(timeout_ms=timeout_ms, reason=reason)))
    return lines


class Watchdog:
    """Fires once when a busy verifier shows no progress for timeout_s; then releases all live verifiers."""

    def __init__(self, timeout_s: float, on_fire: Callable[[list[str]], None] | None = None,
                 release_timeout_ms: int = 5000, clock: Callable[[], float] = time.monotonic):
        if timeout_s <= 0:
            raise ValueError("the watchdog needs a timeout > 0 s")
        self.timeout_s = float(timeout_s)
        self.on_fire = on_fire
        self.release_timeout_ms = release_timeout_ms
        self.clock = clock
        self.fired = threading.Event()
        self.fired_at: float | None = None
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def stalled(self) -> list:
        now = self.clock()
        return [v for v in live_verifiers() if v.busy and now - v.last_progress > self.timeout_s]

    def check(self) -> bool:
        """One look; releases and returns True when it fired."""
        if self.fired.is_set() or not self.stalled():
            return False
        self.fired_at = self.clock()
        self.lines = release_live_verifiers(self.release_timeout_ms, reason=f"no progress for {self.timeout_s:g} s")
        self.fired.set()
        if self.on_fire is not None:
            self.on_fire(self.lines)
        return True

    def start(self) -> "Watchdog":
        poll = min(0.05, self.timeout_s / 10)

        def loop():
            while not self._stop.wait(poll):
                if self.check():
                    return

        self._thread = threading.Thread(target=loop, name="strata-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def __enter__(self) -> "Watchdog":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


_installed: dict[int, object] = {}


def install_signal_release() -> bool:
    """SIGINT/SIGTERM release every busy verifier first, then behave as before (KeyboardInterrupt, exit 143).
    Only from the main thread (Python's rule); returns whether the handlers are in place."""
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in (signal.SIGINT, signal.SIGTERM):
        if sig in _installed:
            continue
        previous = signal.getsignal(sig)

        def handler(signum, frame, previous=previous):
            release_live_verifiers(timeout_ms=2000, reason=f"signal {signal.Signals(signum).name}", only_busy=True)
            if callable(previous):
                return previous(signum, frame)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)

        _installed[sig] = previous
        signal.signal(sig, handler)
    return True


def uninstall_signal_release() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, previous in list(_installed.items()):
        signal.signal(sig, previous)
        del _installed[sig]
