"""The embedded default model: the `tiny` preset (F32, seed 0), generated once into the strata cache.

Its name carries a hash of the generator (synth/*.py and the preset files), so a strata whose synthetic weights
differ never uses an older strata's file. Beside it lies `NAME.sha256`, the SHA-256 of the file as written; a model
whose size or checksum does not match (a same-size corruption) is regenerated. Concurrent first uses wait on
`.NAME.lock`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

from ..report.progress import byte_progress
from ..sysio.cache import CacheError, usable_cache_dir
from ..sysio.files import os_reason, output_stream
from . import estimate_size, load_preset, write_model

DEFAULT_PRESET, DEFAULT_TYPE, DEFAULT_SEED = "tiny", "F32", 0
DEFAULT_STEM = f"qwen4exp-{DEFAULT_PRESET}-{DEFAULT_TYPE.lower()}-seed{DEFAULT_SEED}"
CHECKSUM_SUFFIX = ".sha256"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _intact(path: Path, size: int) -> bool:
    """The file has the planned size and the checksum recorded when it was written."""
    try:
        if not path.is_file() or path.stat().st_size != size:
            return False
        recorded = path.with_name(path.name + CHECKSUM_SUFFIX).read_text(encoding="ascii").split()
        return bool(recorded) and recorded[0] == file_sha256(path)
    except (OSError, UnicodeDecodeError):
        return False


def generator_tag() -> str:
    """12 hex digits of the SHA-256 of what decides the default model's bytes: the synth package's sources and the
    preset files."""
    from . import presets

    here = Path(__file__).resolve().parent
    files = sorted(here.glob("*.py")) + sorted(presets.presets_dir().glob("*.yaml"))
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:12]


def default_name() -> str:
    return f"{DEFAULT_STEM}-{generator_tag()}.gguf"


def default_model_path() -> Path:
    """Path of the default model, generating it (a few MB, well under a second) on first use or when it does not
    match its checksum."""
    preset = load_preset(DEFAULT_PRESET)
    size = estimate_size(preset, DEFAULT_TYPE)
    directory = usable_cache_dir()
    name = default_name()
    path = directory / name
    if _intact(path, size):
        return path
    lock_path = directory / f".{name}.lock"
    try:
        lock_fd = os.open(lock_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise CacheError(f"{lock_path}: cannot use the strata cache: {os_reason(exc)}") from None
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # a concurrent first use writes it; we then find it intact
        if _intact(path, size):
            return path
        with byte_progress(f"generating default model {path.name}") as progress:
            write_model(path, preset, seed=DEFAULT_SEED, ggml_type=DEFAULT_TYPE, progress=progress)
        with output_stream(path.with_name(path.name + CHECKSUM_SUFFIX), what="default model checksum") as fh:
            fh.write(f"{file_sha256(path)}  {path.name}\n")
    finally:
        os.close(lock_fd)
    return path


def resolve_model(model_arg: str | None) -> str:
    """The model the user named, or the default one (None only: commands/_common.load_model refuses an empty
    string before it gets here)."""
    return str(default_model_path()) if model_arg is None else str(model_arg)
