"""A synthetic byte-level BPE vocabulary for make-model, so `--text` works on generated models.

Ids 0..255 are the 256 byte tokens in GPT-2's byte-to-unicode spelling (the printable bytes first, as
transformers' byte-level trainer lists them); then merged tokens up to the EOS id, each one an earlier token plus
one letter ("Ġ t", "t h", then "Ġt h", ...: a valid merge list, rank = order); EOS and every id after it are
control tokens (`<|endoftext|>`, then `<|tok_N|>`), matched whole in text. A vocabulary too small for the 256
bytes keeps placeholder tokens and no merges: `--text` then says the model has no tokenizer.
"""

from __future__ import annotations

from itertools import islice

N_BYTES = 256
LETTERS = "etaoinshrdlcumwfgypbvkjxqz"  # English letter frequency order: the first merges look like real ones
SPACE = "Ġ"  # byte 0x20 in the byte-to-unicode spelling


def byte_tokens() -> list[str]:
    """GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 upward."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    spelling = {b: chr(b) for b in printable}
    extra = 0
    for b in range(N_BYTES):
        if b not in spelling:
            spelling[b] = chr(N_BYTES + extra)
            extra += 1
    return [spelling[b] for b in printable] + [spelling[b] for b in range(N_BYTES) if b not in printable]


def _merges():
    """(left, right) pairs, each left an earlier token: level by level, every token of the last level + a letter."""
    level = [SPACE] + list(LETTERS)
    while True:
        grown = []
        for left in level:
            for letter in LETTERS:
                yield left, letter
                grown.append(left + letter)
        level = grown


def synthetic_vocab(vocab_size: int, eos_id: int, eos_name: str) -> tuple[list[str], list[bool], list[str]]:
    """(tokens, is_control per token, merges as 'left right') for a vocabulary of `vocab_size` with EOS at eos_id."""
    if eos_id < N_BYTES:
        tokens = [f"<|tok_{i}|>" for i in range(vocab_size)]
        tokens[eos_id] = eos_name
        return tokens, [i == eos_id for i in range(vocab_size)], []
    pairs = list(islice(_merges(), eos_id - N_BYTES))
    tokens = byte_tokens() + [left + right for left, right in pairs]
    tokens += [eos_name] + [f"<|tok_{i}|>" for i in range(eos_id + 1, vocab_size)]
    control = [i >= eos_id for i in range(vocab_size)]
    return tokens, control, [f"{left} {right}" for left, right in pairs]
