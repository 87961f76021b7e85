"""Every STRATA_* environment variable strata reads: its name, its parser and its default, in one table (README
"Environment"). The CLI checks them all when a command starts, so a bad value is one line naming the variable
(exit 2) before any work; nothing else in strata_cli reads a STRATA_* variable from os.environ.

`Setting.value()` reads the variable when asked: the window switches and the GEMV kernel choices are read where a
graph is recorded or a kernel launched (a test or a benchmark compares both paths in one process; a captured graph
keeps what was chosen at capture). Values strata's own modules hand each other go as parameters, never through the
environment (e.g. stall-test's stall window: tiers/config.py TierConfig.stall_window).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping

from .errors import EXIT_USAGE, InputError


class SettingError(InputError):
    """A STRATA_* variable holds a value strata does not take."""

    exit_code = EXIT_USAGE


def _switch(name: str, raw: str) -> bool:
    if raw in ("0", "1"):
        return raw == "1"
    raise SettingError(f"{name}={raw!r}: expected 0 or 1")


def _text(name: str, raw: str) -> str:
    return raw


def _window_number(name: str, raw: str) -> int:
    if not raw.isdigit():
        raise SettingError(f"{name}={raw!r}: expected a window number (1-based) or 0")
    return int(raw)


def _seconds(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise SettingError(f"{name}={raw!r}: expected seconds >= 0 (0 = no watchdog)")
    return value


def _thread_count(name: str, raw: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise SettingError(f"{name}={raw!r}: expected a positive thread count")
    return int(raw)


@dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[str, str], object]  # (name, the stripped non-empty value) -> the value; SettingError if bad
    default: object                      # unset or empty

    def value(self, env: Mapping[str, str] | None = None):
        raw = (os.environ if env is None else env).get(self.name, "").strip()
        return self.default if raw == "" else self.parse(self.name, raw)


TRACEBACK = Setting("STRATA_TRACEBACK", _switch, False)                  # 1: errors raise with their traceback
VERIFY_PROFILE = Setting("STRATA_VERIFY_PROFILE", _switch, False)        # 1: GPU windows stamped, one-line summary
CACHE = Setting("STRATA_CACHE", _text, None)                             # the cache directory (sysio/cache.py)
GIT_COMMIT = Setting("STRATA_GIT_COMMIT", _text, None)                   # the commit a record names (report/envinfo.py)
WATCHDOG_S = Setting("STRATA_WATCHDOG_S", _seconds, 60.0)                # tiers/watchdog.py; 0 = off
TEST_VERIFY_STALL = Setting("STRATA_TEST_VERIFY_STALL", _window_number, 0)  # test hook: window whose flag is withheld
POOL_NATIVE = Setting("STRATA_POOL_NATIVE", _switch, True)               # 0: the CPU pool computes with numpy
POOL_THREADS = Setting("STRATA_POOL_THREADS", _thread_count, None)       # the CPU pool's team size; unset: every core

ALL = (TRACEBACK, VERIFY_PROFILE, CACHE, GIT_COMMIT, WATCHDOG_S, TEST_VERIFY_STALL, POOL_NATIVE, POOL_THREADS)


def check_environment(env: Mapping[str, str] | None = None) -> None:
    """Parse every STRATA_* setting now: the first bad one is a SettingError (one line, exit 2)."""
    for setting in ALL:
        setting.value(env)
