"""Every file strata reads or writes goes through here: no lost data, one line for every OS error.

How to use it (commands and library code alike):

* Writing an output that may be `-` (stdout)::

      from strata_cli.sysio.files import output_stream
      with output_stream(path_or_dash, what="logprob dump") as fh:   # text; binary=True for bytes
          fh.write(...)

  `-` (or None) streams to stdout. A path gets a temporary file beside it (`.NAME.partial`, locked with flock),
  which replaces the target only when the block ends without an exception; on any exception (Ctrl-C, SIGTERM,
  SIGHUP, a full disk) the temporary file is removed and the old target is left untouched. A second strata
  writing the same path at the same time is refused in one line. OS errors become one `StrataError` line that
  names the path ("{path}: cannot write logprob dump: No space left on device"). A path that exists and is not
  a regular file (/dev/null, a FIFO, the /dev/fd/N of `>(cmd)`) is written into directly, never replaced; a
  symlink is written through (the temporary file goes beside its target).

* Writing by path through a library that opens the file itself (the GGUF writer)::

      with output_path(out, what="model") as tmp:   # tmp: the locked temporary path to write
          write_everything_to(tmp)

* Checking an output path before spending time on the work: `check_output_path(path, force=...)` (a
  trailing `/`, a directory, a missing or unwritable parent, a name too long, an existing file without --force).

* Reading: `read_text(path, what=...)` / `read_bytes(path, what=...)` (`-` = stdin) and
  `check_input_file(path, what=...)`, which says precisely why a path is unusable (no such file, no such
  directory, permission denied, a symlink loop, a FIFO or device where a regular file is needed, a directory).

* `os_error(exc, path, action)` turns any OSError into the one-line `StrataError`.

Signals (SIGTERM / SIGHUP as Ctrl-C, the SIGBUS handler that keeps partial outputs) are signals.py's; the memory
probe is memory.py's.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from ..errors import InputError, StrataError

STDIO = "-"
PARTIAL_SUFFIX = ".partial"
ACTIVE_OUTPUTS: list[tuple[Path, Path]] = []  # (temporary file, target) of outputs being written now (signals.py)


def is_stdio(path) -> bool:
    return path is None or str(path) == STDIO


# ---------------------------------------------------------------- messages

def os_reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "too many levels of symbolic links (a symlink loop)"
    if exc.errno == errno.ENAMETOOLONG:
        return "file name too long"
    return exc.strerror or str(exc) or type(exc).__name__


def os_error(exc: OSError, path, action: str) -> StrataError:
    """`{path}: cannot {action}: {reason}`; the reason is the OS's, made plain for the common confusions."""
    return StrataError(f"{path}: cannot {action}: {os_reason(exc)}")


def _kind(mode: int) -> str | None:
    """A non-regular file's kind, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def input_problem(path, *, regular: bool = True) -> str | None:
    """Why `path` cannot be read as an input file, in words; None when it can (as far as stat tells)."""
    text = str(path)
    if text == "":
        return "an empty path names no file"
    try:
        st = os.stat(text)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            parent = os.path.dirname(os.path.abspath(text))
            if os.path.islink(text):
                return "a dangling symbolic link (its target does not exist)"
            if not os.path.isdir(parent):
                return f"no such directory {parent}"
            return "no such file"
        if exc.errno == errno.EACCES:
            return "permission denied (a directory on the path cannot be searched)"
        if exc.errno == errno.ENOTDIR:
            return "a component of the path is not a directory"
        return os_reason(exc)
    kind = _kind(st.st_mode)
    if kind == "a directory":
        return "is a directory, not a file"
    if kind and regular:
        return f"is {kind}, not a regular file"
    if not os.access(text, os.R_OK):
        return "permission denied (not readable)"
    return None


def check_input_file(path, *, what: str, regular: bool = True) -> str:
    """The path, or an InputError saying why the input `what` cannot be read from it."""
    problem = input_problem(path, regular=regular)
    if problem:
        raise InputError(f"{path or repr(path)}: cannot read {what}: {problem}")
    return str(path)


# ---------------------------------------------------------------- reading

def read_bytes(path, *, what: str, limit: int | None = None) -> bytes:
    """All bytes of `path` (`-` = stdin); refuses more than `limit` bytes in one line."""
    if is_stdio(path):
        data = sys.stdin.buffer.read(limit + 1 if limit else -1)
        where = "stdin"
    else:
        check_input_file(path, what=what, regular=False)
        where = str(path)
        try:
            with open(path, "rb") as fh:
                data = fh.read(limit + 1 if limit else -1)
        except OSError as exc:
            raise os_error(exc, path, f"read {what}") from None
    if limit is not None and len(data) > limit:
        raise InputError(f"{where}: {what} is larger than {limit} bytes (the limit)")
    return data


def read_text(path, *, what: str, limit: int | None = None) -> str:
    """UTF-8 text of `path` (`-` = stdin; a UTF-8 BOM is accepted); binary or other encodings fail in one line."""
    where = "stdin" if is_stdio(path) else str(path)
    data = read_bytes(path, what=what, limit=limit)
    if data.startswith(b"\xff\xfe") or data.startswith(b"\xfe\xff"):
        raise InputError(f"{where}: {what} is UTF-16 text; strata reads UTF-8 (or ASCII)")
    nul = data.find(b"\0")
    if nul >= 0:
        raise InputError(f"{where}: {what} is a binary file (NUL byte at offset {nul}), not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{where}:{line}: {what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start})") from None


# ---------------------------------------------------------------- writing

def _name_max(directory: str) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def partial_path(path) -> Path:
    """The temporary file beside `path`: `.NAME.partial`, shortened with a hash when NAME is near NAME_MAX."""
    target = Path(path)
    name = f".{target.name}{PARTIAL_SUFFIX}"
    limit = _name_max(str(target.parent) if str(target.parent) else ".")
    if len(os.fsencode(name)) > limit:
        digest = hashlib.sha1(os.fsencode(target.name)).hexdigest()[:12]
        name = f".{os.fsencode(target.name)[:limit - 40].decode('utf-8', 'ignore')}~{digest}{PARTIAL_SUFFIX}"
    return target.with_name(name)


def check_output_path(path, *, what: str, force: bool = True) -> Path:
    """Refuse an output path before any work: a trailing `/`, a directory, a missing or unwritable parent, a name
    longer than the filesystem allows, or (without force) an existing file. Returns the path."""
    text = str(path)
    if text == "":
        raise InputError(f"'': an empty path names no file to write the {what} to")
    if text.endswith(os.sep):
        raise InputError(f"{text}: names a directory; give a file name to write the {what} to")
    target = Path(text)
    parent = str(target.parent) or "."
    try:
        st = os.stat(parent)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise InputError(f"{text}: cannot write the {what}: no such directory {parent}") from None
        raise os_error(exc, text, f"write the {what}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"{text}: cannot write the {what}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{text}: cannot write the {what}: permission denied (directory {parent} is not "
                         "writable)")
    limit = _name_max(parent)
    if len(os.fsencode(target.name)) > limit:
        raise InputError(f"{text}: cannot write the {what}: file name is {len(os.fsencode(target.name))} bytes, "
                         f"the filesystem allows {limit}")
    if os.path.isdir(text):
        raise InputError(f"{text}: is a directory; give a file name to write the {what} to")
    if os.path.lexists(text) and not force:
        raise InputError(f"{text}: file exists (use --force to overwrite)")
    return target


def _lock(fd: int, target, what: str, wait: bool) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        raise InputError(f"{target}: another strata process is writing this {what} right now; refusing to "
                         "write the same file") from None


@contextmanager
def output_path(path, *, what: str, wait: bool = False) -> Iterator[Path]:
    """Yields the locked temporary path beside `path`; renamed onto `path` only when the block completes.

    On any exception (KeyboardInterrupt, Terminated, OSError...) the temporary file is removed and `path` keeps
    its old contents. An OSError is re-raised as one StrataError line naming `path`. With wait=True a second
    writer waits for the first instead of being refused.
    """
    target = _real_target(path)
    kind = _existing_kind(target)
    if kind:
        raise InputError(f"{path}: is {kind}; the {what} is written to a regular file only (renamed into place)")
    tmp = partial_path(target)
    fd = -1
    try:
        while True:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            _lock(fd, target, what, wait)
            try:
                if os.path.samestat(os.fstat(fd), os.stat(tmp)):
                    break
            except FileNotFoundError:
                pass
            # the writer we waited for renamed its file into place: start over with a fresh temporary file
            os.close(fd)
            fd = -1
        os.ftruncate(fd, 0)  # a stale file of a killed run
        ACTIVE_OUTPUTS.append((tmp, target))
        try:
            yield tmp
            os.replace(tmp, target)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        finally:
            ACTIVE_OUTPUTS.remove((tmp, target))
    except OSError as exc:
        raise os_error(exc, target, f"write the {what}") from None
    finally:
        if fd >= 0:
            os.close(fd)


def _real_target(path) -> Path:
    """Where a write to `path` should land: through a symlink to its target (the link stays a link)."""
    return Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)


def _existing_kind(path) -> str | None:
    """'a character device', 'a FIFO (named pipe)', ... when `path` exists and is not a regular file or directory."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    kind = _kind(mode)
    return None if kind in (None, "a directory") else kind


def _unlink_quietly(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def stdout_text() -> IO[str]:
    """sys.stdout, or a one-line error when the process was started with stdout closed (`>&-`)."""
    if sys.stdout is None or getattr(sys.stdout, "closed", False):
        raise StrataError("stdout is closed: nowhere to write the output (give -o FILE or reopen stdout)")
    return sys.stdout


@contextmanager
def output_stream(path, *, what: str, binary: bool = False, wait: bool = False) -> Iterator[IO]:
    """A file object for `path` (`-`/None = stdout): see the module docstring. Flushed (and fsynced) before the
    rename; stdout is flushed at the end so a full device is reported here, not at exit."""
    if is_stdio(path):
        out = stdout_text()
        fh = out.buffer if binary else out
        try:
            yield fh
            fh.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise os_error(exc, "stdout", f"write the {what}") from None
        return
    check_output_path(path, what=what)
    if _existing_kind(path):  # /dev/null, a FIFO, /dev/fd/N of `>(cmd)`: stream into it, never replace it
        try:
            with open(path, "wb" if binary else "w", encoding=None if binary else "utf-8") as fh:
                yield fh
                fh.flush()
        except OSError as exc:
            raise os_error(exc, path, f"write the {what}") from None
        return
    with output_path(path, what=what, wait=wait) as tmp:
        try:
            with open(tmp, "wb" if binary else "w", encoding=None if binary else "utf-8",
                      newline=None if binary else "\n") as fh:
                yield fh
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise os_error(exc, path, f"write the {what}") from None
