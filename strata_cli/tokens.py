"""Token id sequences from files or a seeded random draw."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .errors import InputError


def read_token_file(path: str | Path) -> np.ndarray:
    """Ids separated by whitespace and/or commas; one-line errors name the file, line and bad field."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"{path}: cannot read token file ({exc.strerror or exc})") from None
    ids = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        for field in re.split(r"[\s,]+", line.strip()):
            if not field:
                continue
            if not re.fullmatch(r"[+-]?\d+", field):
                raise InputError(f"{path}:{lineno}: '{field[:20]}' is not a token id")
            ids.append(int(field))
    if not ids:
        raise InputError(f"{path}: no token ids in the file")
    return np.array(ids, dtype=np.int64)


def random_tokens(n: int, vocab: int, seed: int) -> np.ndarray:
    if n < 1:
        raise InputError(f"--random {n}: need at least 1 token")
    return np.random.default_rng(seed).integers(0, vocab, size=n, dtype=np.int64)


def check_range(tokens: np.ndarray, vocab: int, source: str) -> None:
    bad = np.nonzero((tokens < 0) | (tokens >= vocab))[0]
    if bad.size:
        i = int(bad[0])
        raise InputError(f"{source}: token id {int(tokens[i])} at index {i} out of range 0..{vocab - 1}")
