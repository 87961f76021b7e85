"""Text -> token ids through the GGUF's own tokenizer (`tokenizer.ggml.*`), built with the `tokenizers` library.

Supported: `tokenizer.ggml.model = "gpt2"` (byte-level BPE: tokens + merges) with the pre-tokenizer regexes of
`tokenizer.ggml.pre` in PRE_TOKENIZER_REGEX. Tokens of type CONTROL (3) or USER_DEFINED (4) are added tokens:
matched whole in the text before BPE, as transformers does with the tokenizer.json the GGUF was converted from.
No BOS is prepended (qwen-family models have none).
"""

from __future__ import annotations

from ..errors import InputError

TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4

# tokenizer.ggml.pre -> the split regex of the HF pre-tokenizer it names (as llama.cpp's llama-vocab.cpp has them)
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZER_REGEX = {"qwen2": _QWEN2, "qwen35": _QWEN35}


def _list(md: dict, key: str, source: str) -> list:
    value = md.get(key)
    if not isinstance(value, list) or not value:
        raise InputError(f"{source}: no tokenizer in the model ({key} missing): --text needs the model's "
                         "tokenizer; give token ids with --tokens FILE")
    return value


def build_tokenizer(md: dict, source: str):
    """A `tokenizers.Tokenizer` equivalent to the one the GGUF was converted from."""
    kind = md.get("tokenizer.ggml.model")
    if kind is None:
        raise InputError(f"{source}: no tokenizer in the model (tokenizer.ggml.model missing): --text needs the "
                         "model's tokenizer; give token ids with --tokens FILE")
    if kind != "gpt2":
        raise InputError(f"{source}: tokenizer.ggml.model = {kind!r}: strata tokenizes only byte-level BPE ('gpt2')")
    pre = md.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZER_REGEX:
        raise InputError(f"{source}: tokenizer.ggml.pre = {pre!r} is not one strata knows "
                         f"({', '.join(PRE_TOKENIZER_REGEX)})")
    tokens = _list(md, "tokenizer.ggml.tokens", source)
    merges = _list(md, "tokenizer.ggml.merges", source)
    types = md.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise InputError(f"{source}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")

    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    pairs = []
    for i, merge in enumerate(merges):
        left, sep, right = str(merge).partition(" ")
        if not sep:
            raise InputError(f"{source}: tokenizer.ggml.merges[{i}] = {merge!r} is not 'left right'")
        pairs.append((left, right))
    vocab = {str(tok): i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise InputError(f"{source}: tokenizer.ggml.tokens holds duplicate tokens")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, byte_fallback=False, ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_REGEX[pre]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    added = [AddedToken(str(tokens[i]), special=types[i] == TOKEN_CONTROL, normalized=False)
             for i in range(len(tokens)) if types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)]
    if added:
        tok.add_tokens(added)
    return tok


def encode(md: dict, text: str, source: str) -> list[int]:
    """Token ids of `text` (no BOS, no EOS added)."""
    if not text:
        raise InputError(f"{source}: the text is empty")
    ids = build_tokenizer(md, source).encode(text, add_special_tokens=False).ids
    return [int(i) for i in ids]
