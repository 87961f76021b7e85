"""The strata cache directory (the embedded default model, the CPU pool's built kernels): $STRATA_CACHE, else
$XDG_CACHE_HOME/strata, else ~/.cache/strata."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .. import settings
from ..errors import StrataError
from .files import os_reason


class CacheError(StrataError):
    """The strata cache directory cannot be used."""


def _cache_source() -> tuple[Path, str]:
    """(the cache directory, the setting it came from, for messages)."""
    if settings.CACHE.value():
        return Path(settings.CACHE.value()).expanduser(), "$STRATA_CACHE"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec: a relative value is invalid and must be ignored
        return Path(xdg) / "strata", "$XDG_CACHE_HOME"
    home = os.environ.get("HOME")
    if not home:
        try:
            home = str(Path.home())
        except (RuntimeError, KeyError):
            raise CacheError("no cache directory: HOME is not set (set STRATA_CACHE to a writable directory, "
                             "or give a MODEL)") from None
    return Path(home).expanduser() / ".cache" / "strata", "$HOME"


def cache_dir() -> Path:
    """$STRATA_CACHE, else $XDG_CACHE_HOME/strata (if absolute), else ~/.cache/strata."""
    return _cache_source()[0]


def usable_cache_dir() -> Path:
    """The cache directory, created if needed; a CacheError line when it cannot be used."""
    path, source = _cache_source()
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "Permission denied (not writable)")
    except OSError as exc:
        if exc.errno == errno.EEXIST or isinstance(exc, (FileExistsError, NotADirectoryError)):
            reason = "a file is in the way (not a directory)"
        else:
            reason = os_reason(exc)
        raise CacheError(f"{path}: cannot use as the strata cache (from {source}): {reason}; set STRATA_CACHE "
                         "to a writable directory, or give a MODEL") from None
    return path
