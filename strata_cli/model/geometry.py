"""Model geometry of a qwen4exp GGUF, read from its metadata (never from constants in code)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import ModelFileError

ARCH = "qwen4exp"


class Metadata:
    """Typed access to GGUF key/values with one-line errors that name the file and key."""

    def __init__(self, values: dict, path: str):
        self.values = values
        self.path = path

    def has(self, key: str) -> bool:
        return key in self.values

    def get(self, key: str, default=None):
        return self.values.get(key, default)

    def req(self, key: str):
        if key not in self.values:
            raise ModelFileError(f"{self.path}: missing metadata key '{key}'")
        return self.values[key]

    def req_int(self, key: str, minimum: int = 1) -> int:
        value = self.req(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ModelFileError(f"{self.path}: metadata '{key}' = {value!r} (expected an integer >= {minimum})")
        return int(value)

    def req_float(self, key: str, *, positive: bool = False) -> float:
        """A finite number (NaN and +-inf make every logit NaN downstream); positive=True also refuses <= 0."""
        value = self.req(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ModelFileError(f"{self.path}: metadata '{key}' = {_short(value)} (expected a number)")
        if not math.isfinite(value):
            raise self.bad(key, value, "must be a finite number")
        if positive and not value > 0:
            raise self.bad(key, value, "must be > 0")
        return float(value)

    def opt_int(self, key: str, default=None) -> int | None:
        """An optional integer key (e.g. an EOS id): `default` when absent, an error when not an integer."""
        value = self.values.get(key, default)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ModelFileError(f"{self.path}: metadata '{key}' = {_short(value)} (expected an integer)")
        return value

    def req_list(self, key: str, length: int | None = None, kind: type | tuple = object) -> list:
        value = self.req(key)
        if not isinstance(value, list) or (length is not None and len(value) != length):
            want = f"an array of {length}" if length is not None else "an array"
            raise ModelFileError(f"{self.path}: metadata '{key}' = {_short(value)} (expected {want})")
        for i, item in enumerate(value):
            if not isinstance(item, kind) or (kind is int and isinstance(item, bool)):
                noun = "an integer" if kind is int else "a boolean or integer"
                raise self.bad(key, value, f"element {i} = {item!r} is not {noun}")
        return value

    def req_int_list(self, key: str, length: int | None = None) -> list[int]:
        return [int(v) for v in self.req_list(key, length, int)]

    def bad(self, key: str, value, why: str) -> ModelFileError:
        return ModelFileError(f"{self.path}: metadata '{key}' = {_short(value)}: {why}")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."



def float32_text(value: float) -> str:
    """A float32 metadata value as people write it: the shortest decimal that reads back as the same float32
    (1e-06, not 9.999999974752427e-07)."""
    import numpy as np

    return str(np.float32(value))

@dataclass(frozen=True)
class PLEGeometry:
    """Hashed n-gram (per-layer embedding) block at one layer."""

    layer: int  # 0-based layer index
    ngram_size: int
    heads_per_ngram: int
    head_dim: int  # row width of the n-gram table
    conv_kernel: int
    eos_token_id: int
    multipliers: tuple[int, ...]  # one per n-gram position
    head_vocab_sizes: tuple[int, ...]
    head_offsets: tuple[int, ...]

    @property
    def n_heads(self) -> int:
        return (self.ngram_size - 1) * self.heads_per_ngram

    @property
    def embed_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def dilation(self) -> int:
        return self.ngram_size

    @property
    def history(self) -> int:
        """Rows of normalized gated values the dilated conv looks back on."""
        return (self.conv_kernel - 1) * self.dilation

    def hash_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(multipliers, head vocab sizes, head offsets) as the int64 arrays the n-gram hash takes (the uint64
        multipliers wrap to int64, as torch's int64 products do)."""
        return (np.array(self.multipliers, dtype=np.uint64).astype(np.int64),
                np.array(self.head_vocab_sizes, dtype=np.int64), np.array(self.head_offsets, dtype=np.int64))


@dataclass(frozen=True)
class Geometry:
    path: str
    n_layers: int
    n_ctx: int
    n_embd: int
    n_vocab: int
    eps: float
    layer_is_attn: tuple[bool, ...]
    # gated full attention (QSA)
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    rope_base: float
    idx_heads: int
    idx_dim: int
    idx_budget: int
    compress_ratios: tuple[int, ...]
    # Gated DeltaNet
    conv_kernel: int
    ssm_dk: int
    ssm_nk: int
    ssm_nv: int
    ssm_dv: int
    # hyper-connections
    hc: int
    hc_lowrank: int
    # MoE
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int
    eos_token_id: int | None
    ple: PLEGeometry | None
    warnings: tuple[str, ...] = field(default=())

    # ---- derived sizes
    @property
    def hc_dim(self) -> int:
        return self.hc * self.n_embd

    @property
    def conv_dim(self) -> int:
        return 2 * self.ssm_nk * self.ssm_dk + self.ssm_nv * self.ssm_dv

    @property
    def ssm_inner(self) -> int:
        return self.ssm_nv * self.ssm_dv

    @property
    def attn_layers(self) -> list[int]:
        return [i for i, a in enumerate(self.layer_is_attn) if a]

    @property
    def gdn_layers(self) -> list[int]:
        return [i for i, a in enumerate(self.layer_is_attn) if not a]

    def summary(self) -> dict:
        out = {
            "layers": self.n_layers,
            "context": self.n_ctx,
            "hidden": self.n_embd,
            "vocab": self.n_vocab,
            "layout": "".join("A" if a else "G" for a in self.layer_is_attn),
            "attention": f"{self.n_head} q / {self.n_head_kv} kv heads x {self.head_dim}, rope {self.n_rot} dims "
            f"base {self.rope_base:g}",
            "qsa": f"indexer {self.idx_heads} heads x {self.idx_dim}, budget {self.idx_budget} tokens, "
            f"compress ratios {sorted(set(self.compress_ratios[i] for i in self.attn_layers)) or '-'}",
            "gdn": f"{self.ssm_nk} k heads x {self.ssm_dk}, {self.ssm_nv} v heads x {self.ssm_dv}, "
            f"conv {self.conv_kernel}",
            "hyper_connections": f"{self.hc} streams, rank {self.hc_lowrank}",
            "moe": f"{self.n_expert} experts, top-{self.n_expert_used}, ff {self.n_ff_exp}, shared ff "
            f"{self.n_ff_shexp}",
            "eps": float32_text(self.eps),
            "eos": self.eos_token_id,
        }
        if self.ple is not None:
            p = self.ple
            out["ple"] = (f"layer {p.layer}, {p.ngram_size}-grams x {p.heads_per_ngram} heads x {p.head_dim}, "
                          f"conv {p.conv_kernel} dilation {p.dilation}, eos {p.eos_token_id}")
        else:
            out["ple"] = "none"
        return out


def _layer_kinds(md: Metadata, n_layers: int) -> tuple[bool, ...]:
    key_rec = f"{ARCH}.attention.recurrent_layers"
    key_int = f"{ARCH}.full_attention_interval"
    # the recurrent_layers array is read first: its length checks block_count before anything is sized by it
    rec = md.req_list(key_rec, n_layers, (bool, int)) if md.has(key_rec) else None
    from_interval = None
    if md.has(key_int):
        interval = md.req_int(key_int)
        from_interval = tuple((i + 1) % interval == 0 for i in range(n_layers))
    if rec is not None:
        kinds = tuple(not bool(r) for r in rec)
        if from_interval is not None and kinds != from_interval:
            raise md.bad(key_rec, rec, f"disagrees with {key_int} = {md.get(key_int)}")
        return kinds
    if from_interval is None:
        raise ModelFileError(f"{md.path}: missing metadata key '{key_int}' (and no '{key_rec}')")
    return from_interval


def _ple(md: Metadata, n_layers: int, layer_is_attn, vocab: int, fallback_eos,
         has_ple_tensors: bool) -> PLEGeometry | None:
    key_layers = f"{ARCH}.ple.layers"
    layers = md.req_int_list(key_layers) if md.has(key_layers) else []
    if not layers:
        if has_ple_tensors:  # dropping the block would silently compute a different model
            raise ModelFileError(f"{md.path}: the file has PLE tensors (blk.*.ple_*) but metadata '{key_layers}' is "
                                 f"{'missing' if not md.has(key_layers) else 'empty'}: cannot tell which layer "
                                 "they belong to")
        return None
    if len(layers) != 1:
        raise md.bad(key_layers, layers, "strata supports exactly one PLE layer (one n-gram table)")
    layer = int(layers[0])
    if not 0 <= layer < n_layers:
        raise md.bad(key_layers, layers, f"layer out of range 0..{n_layers - 1}")
    if layer_is_attn[layer]:
        raise md.bad(key_layers, layers, "PLE must sit on a Gated DeltaNet (recurrent) layer")
    ngram = md.req_int(f"{ARCH}.ple.ngram_size", 2)
    hpn = md.req_int(f"{ARCH}.ple.heads_per_ngram")
    n_heads = (ngram - 1) * hpn
    mult = md.req_int_list(f"{ARCH}.ple.layer_multipliers", ngram)
    for i, m in enumerate(mult):
        if not 0 < m < 1 << 63:
            raise md.bad(f"{ARCH}.ple.layer_multipliers", mult, f"multiplier {i} = {m} is not in 1..2^63-1")
    sizes = md.req_int_list(f"{ARCH}.ple.head_vocab_sizes", n_heads)
    offsets = md.req_int_list(f"{ARCH}.ple.head_offsets", n_heads)
    running = 0
    for i, (size, off) in enumerate(zip(sizes, offsets)):
        if int(size) <= 0:
            raise md.bad(f"{ARCH}.ple.head_vocab_sizes", sizes, f"head {i} has size {size}: every head needs >= 1 row")
        if int(off) != running:
            raise md.bad(f"{ARCH}.ple.head_offsets", offsets,
                         f"head {i} offset {off} != running sum {running} of head_vocab_sizes")
        running += int(size)
    eos = md.opt_int(f"{ARCH}.ple.eos_token_id", fallback_eos)
    if eos is None:
        raise ModelFileError(f"{md.path}: missing metadata key '{ARCH}.ple.eos_token_id' (PLE needs the EOS id)")
    if not 0 <= int(eos) < vocab:
        raise md.bad(f"{ARCH}.ple.eos_token_id", eos, f"outside the vocabulary 0..{vocab - 1}")
    return PLEGeometry(
        layer=layer, ngram_size=ngram, heads_per_ngram=hpn,
        head_dim=md.req_int(f"{ARCH}.embedding_length_per_layer_input"),
        conv_kernel=md.req_int(f"{ARCH}.ple.conv_kernel"),
        eos_token_id=int(eos), multipliers=tuple(int(m) for m in mult),
        head_vocab_sizes=tuple(int(s) for s in sizes), head_offsets=tuple(int(o) for o in offsets),
    )


def geometry_from_metadata(md: Metadata, n_vocab: int, has_indexer_tensors: bool, *,
                           has_ple_tensors: bool = False) -> Geometry:
    arch = md.req("general.architecture")
    if arch != ARCH:
        raise ModelFileError(f"{md.path}: architecture '{arch}' is not supported (strata runs '{ARCH}')")
    p = ARCH + "."
    n_layers = md.req_int(p + "block_count")
    layer_is_attn = _layer_kinds(md, n_layers)
    n_embd = md.req_int(p + "embedding_length")
    n_head = md.req_int(p + "attention.head_count")
    n_head_kv = md.req_int(p + "attention.head_count_kv")
    if n_head % n_head_kv:
        raise md.bad(p + "attention.head_count_kv", n_head_kv, f"does not divide head_count {n_head}")
    head_dim = md.req_int(p + "attention.key_length")
    v_len = md.req_int(p + "attention.value_length")
    if v_len != head_dim:
        raise md.bad(p + "attention.value_length", v_len, f"must equal attention.key_length {head_dim}")
    n_rot = md.req_int(p + "rope.dimension_count")
    if n_rot % 2 or n_rot > head_dim:
        raise md.bad(p + "rope.dimension_count", n_rot, f"must be even and <= key_length {head_dim}")
    eps = md.req_float(p + "attention.layer_norm_rms_epsilon", positive=True)

    has_attn = any(layer_is_attn)
    ratios = tuple(md.req_int_list(p + "attention.compress_ratios", n_layers)) if (
        has_attn or md.has(p + "attention.compress_ratios")) else (0,) * n_layers
    warnings = []
    idx_heads = idx_dim = idx_budget = 0
    if has_attn:
        idx_heads = md.req_int(p + "attention.indexer.head_count")
        idx_dim = md.req_int(p + "attention.indexer.key_length")
        idx_budget = md.req_int(p + "attention.indexer.top_k")
        if n_rot > idx_dim:
            raise md.bad(p + "rope.dimension_count", n_rot, f"rotary dims must fit the indexer key ({idx_dim})")
    for layer, ratio in enumerate(ratios):
        if ratio < 0 or (ratio and not layer_is_attn[layer]):
            raise md.bad(p + "attention.compress_ratios", list(ratios),
                         f"layer {layer}: ratio {ratio} on a {'negative' if ratio < 0 else 'recurrent'} entry")
        if ratio and idx_budget % ratio:
            raise md.bad(p + "attention.indexer.top_k", idx_budget, f"not a multiple of compress ratio {ratio}")
    if has_attn and has_indexer_tensors and not any(ratios):
        warnings.append("attention.compress_ratios is all zero although the file has indexer tensors: QSA "
                        "selection is off and attention is dense (a known converter pitfall)")

    conv_kernel = md.req_int(p + "ssm.conv_kernel", 2)
    nk = md.req_int(p + "ssm.group_count")
    nv = md.req_int(p + "ssm.time_step_rank")
    if nv % nk:
        raise md.bad(p + "ssm.time_step_rank", nv, f"not a multiple of ssm.group_count {nk}")
    inner = md.req_int(p + "ssm.inner_size")
    if inner % nv:
        raise md.bad(p + "ssm.inner_size", inner, f"not a multiple of ssm.time_step_rank {nv}")

    n_expert = md.req_int(p + "expert_count")
    n_used = md.req_int(p + "expert_used_count")
    if n_used > n_expert:
        raise md.bad(p + "expert_used_count", n_used, f"exceeds expert_count {n_expert}")
    eos = md.opt_int("tokenizer.ggml.eos_token_id")
    if eos is not None and not 0 <= eos < n_vocab:  # -1 would silently read the last token's logprob
        raise md.bad("tokenizer.ggml.eos_token_id", eos, f"outside the vocabulary 0..{n_vocab - 1}")
    n_ctx = md.req_int(p + "context_length")
    return Geometry(
        path=md.path, n_layers=n_layers, n_ctx=n_ctx, n_embd=n_embd, n_vocab=n_vocab, eps=eps,
        layer_is_attn=layer_is_attn, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, n_rot=n_rot,
        rope_base=md.req_float(p + "rope.freq_base", positive=True) if has_attn else 1e4,
        idx_heads=idx_heads, idx_dim=idx_dim, idx_budget=idx_budget, compress_ratios=ratios,
        conv_kernel=conv_kernel, ssm_dk=md.req_int(p + "ssm.state_size"), ssm_nk=nk, ssm_nv=nv,
        ssm_dv=inner // nv, hc=md.req_int(p + "hyper_connection.count", 2),
        hc_lowrank=md.req_int(p + "hyper_connection.low_rank"), n_expert=n_expert, n_expert_used=n_used,
        n_ff_exp=md.req_int(p + "expert_feed_forward_length"),
        n_ff_shexp=md.req_int(p + "expert_shared_feed_forward_length"),
        eos_token_id=int(eos) if eos is not None else None,
        ple=_ple(md, n_layers, layer_is_attn, n_vocab, eos, has_ple_tensors), warnings=tuple(warnings),
    )
