"""Token id sequences from files or a seeded random draw."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ..errors import InputError, OptionError
from ..sysio.files import read_text


MAX_ID_DIGITS = 18  # below 2**63: anything longer cannot be a token id of any vocabulary
MAX_TOKEN_FILE_BYTES = 1 << 30


def read_token_file(path: str | Path) -> np.ndarray:
    """Ids separated by whitespace and/or commas (`-` = stdin, UTF-8); one-line errors name the file, line and
    bad field."""
    text = read_text(path, what="token file", limit=MAX_TOKEN_FILE_BYTES)
    where = "stdin" if str(path) == "-" else str(path)
    ids = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        for field in re.split(r"[\s,]+", line.strip()):
            if not field:
                continue
            if not re.fullmatch(r"[+-]?[0-9]+", field):
                raise InputError(f"{where}:{lineno}: '{_clip(field)}' is not a token id")
            digits = field.lstrip("+-").lstrip("0")
            if len(digits) > MAX_ID_DIGITS:
                raise InputError(f"{where}:{lineno}: token id '{_clip(field)}' ({len(digits)} digits) is out of "
                                 "range of any vocabulary")
            ids.append(int(field))
    if not ids:
        raise InputError(f"{where}: no token ids in the file")
    return np.array(ids, dtype=np.int64)


def _clip(field: str) -> str:
    return field if len(field) <= 20 else field[:17] + "..."


def random_tokens(n: int, vocab: int, seed: int) -> np.ndarray:
    if n < 1:
        raise OptionError(f"--random {n}: need at least 1 token")
    return np.random.default_rng(seed).integers(0, vocab, size=n, dtype=np.int64)


def check_range(tokens: np.ndarray, vocab: int, source: str) -> None:
    bad = np.nonzero((tokens < 0) | (tokens >= vocab))[0]
    if bad.size:
        i = int(bad[0])
        raise InputError(f"{source}: token id {int(tokens[i])} at index {i} out of range 0..{vocab - 1}")


def tokens_from_options(model, *, token_file: str | None = None, n_random: int | None = None,
                        text: str | None = None, text_file: str | None = None, seed: int = 0) -> tuple[np.ndarray, str]:
    """The token ids one of --tokens FILE, --random N, --text STR, --text-file FILE gives, and a label naming the
    source; text goes through the model's own tokenizer (strata_cli.tokenizer). Exactly one must be given."""
    given = [name for name, value in (("--tokens", token_file), ("--random", n_random), ("--text", text),
                                      ("--text-file", text_file)) if value is not None]
    if len(given) != 1:
        raise OptionError(f"give exactly one of --tokens FILE, --random N, --text STR or --text-file FILE"
                         f"{' (got ' + ', '.join(given) + ')' if given else ''}")
    if token_file is not None:
        return read_token_file(token_file), "stdin" if str(token_file) == "-" else str(token_file)
    if n_random is not None:
        return random_tokens(n_random, model.geometry.n_vocab, seed), f"--random {n_random}"
    from .tokenizer import encode

    if text_file is not None:
        text = read_text(text_file, what="text file", limit=MAX_TOKEN_FILE_BYTES)
        source = "stdin" if str(text_file) == "-" else str(text_file)
    else:
        source = "--text"
    ids = encode(model.metadata, text, f"{model.path}")
    if not ids:
        raise InputError(f"{source}: the text gives no tokens")
    return np.array(ids, dtype=np.int64), source
