"""Expert profiles: how often the router picked each (layer, expert) pair, and the ranked order the VRAM cache fills
in (hottest first). Two file formats, chosen by extension on write and by content on read:

* YAML (`profiles/*.yaml`): the model it was measured on, tokens seen, counts [L, E], the ranked order, slots.
* The seed's binary "STRP" v1 (little-endian): "STRP" | u32 version=1 | u32 n_layers | u32 n_expert |
  u32 slots | u32 n_ranked | n_ranked x (u16 layer, u16 expert) | n_layers x n_expert x i32 (each pair's rank,
  -1 = unranked). It has no counts: a profile read from it has counts None.

Every malformed file is one InputError naming the file and the problem; writes are atomic (strata_cli/sysio/files.py: temp file + rename).
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError

FORMAT = "strata-expert-profile"
VERSION = 1
STRP_MAGIC = b"STRP"
STRP_VERSION = 1
STRP_HEADER = struct.Struct("<4sIIIII")  # magic, version, n_layers, n_expert, slots, n_ranked
BINARY_SUFFIXES = (".bin", ".strp")
YAML_SUFFIXES = (".yaml", ".yml")


def geometry_fingerprint(g) -> str:
    """What a profile's counts depend on: layers, experts, top-k and the expert shapes (not the weights)."""
    key = f"qwen4exp|{g.n_layers}|{g.n_expert}|{g.n_expert_used}|{g.n_embd}|{g.n_ff_exp}"
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def rank_by_counts(counts: np.ndarray) -> np.ndarray:
    """All pairs, descending count; ties by lower layer, then lower expert. -> int32 [L*E, 2]."""
    n_layers, n_expert = counts.shape
    flat = np.argsort(-counts.reshape(-1), kind="stable")
    return np.stack([flat // n_expert, flat % n_expert], axis=1).astype(np.int32)


@dataclass
class ExpertProfile:
    n_layers: int
    n_expert: int
    ranked: np.ndarray               # int32 [n_ranked, 2] (layer, expert), hottest first, no pair twice
    slots: int                       # the cache size the profile suggests (pairs)
    counts: np.ndarray | None = None  # int64 [L, E] router picks; None for a STRP file
    tokens_seen: int = 0
    arch: str = "qwen4exp"
    n_expert_used: int | None = None
    fingerprint: str | None = None   # geometry_fingerprint of the model it was measured on (YAML only)
    model_file: str | None = None    # that model's file name (YAML only)

    @classmethod
    def from_counts(cls, counts: np.ndarray, geometry, model_file: str | None, tokens_seen: int,
                    slots: int | None = None) -> "ExpertProfile":
        counts = np.asarray(counts, dtype=np.int64)
        if slots is None:  # every pair the run routed to
            slots = int(np.count_nonzero(counts))
        return cls(n_layers=geometry.n_layers, n_expert=geometry.n_expert, ranked=rank_by_counts(counts),
                   slots=int(slots), counts=counts, tokens_seen=int(tokens_seen),
                   n_expert_used=geometry.n_expert_used, fingerprint=geometry_fingerprint(geometry),
                   model_file=os.path.basename(model_file) if model_file else None)

    @property
    def n_pairs(self) -> int:
        return self.n_layers * self.n_expert

    def order(self) -> np.ndarray:
        """Every pair in cache-fill order: the ranked ones, then the rest by count (or layer, expert). [L*E, 2]"""
        if len(self.ranked) == self.n_pairs:
            return self.ranked
        seen = np.zeros((self.n_layers, self.n_expert), dtype=bool)
        seen[self.ranked[:, 0], self.ranked[:, 1]] = True
        base = self.counts if self.counts is not None else np.zeros(seen.shape, dtype=np.int64)
        rest = rank_by_counts(np.where(seen, -1, base))[: self.n_pairs - len(self.ranked)]
        return np.concatenate([self.ranked, rest]).astype(np.int32)

    def resident_mask(self, n_slots: int) -> np.ndarray:
        """bool [L, E]: the first n_slots pairs of order()."""
        mask = np.zeros((self.n_layers, self.n_expert), dtype=bool)
        top = self.order()[: max(0, min(n_slots, self.n_pairs))]
        mask[top[:, 0], top[:, 1]] = True
        return mask

    def hit_rate(self, counts: np.ndarray, n_slots: int) -> float | None:
        """Share of the routings in `counts` [L, E] that land on the first n_slots pairs; None without routings."""
        total = int(counts.sum())
        return None if total == 0 else float(counts[self.resident_mask(n_slots)].sum()) / total

    def coverage(self, n_slots: int) -> float | None:
        """Share of the profile's own counted routings the first n_slots pairs serve (None for a STRP file)."""
        return None if self.counts is None else self.hit_rate(self.counts, n_slots)

    def check_model(self, geometry, path) -> None:
        """InputError when the profile was measured on another geometry than `geometry`."""
        mine = f"{self.n_layers} layers x {self.n_expert} experts"
        theirs = f"{geometry.n_layers} layers x {geometry.n_expert} experts"
        if (self.n_layers, self.n_expert) != (geometry.n_layers, geometry.n_expert):
            raise InputError(f"{path}: profile of another geometry ({mine}; the model {geometry.path} has {theirs})")
        if self.fingerprint is not None and self.fingerprint != geometry_fingerprint(geometry):
            raise InputError(f"{path}: profile of another geometry (fingerprint {self.fingerprint}, "
                             f"{geometry.path} has {geometry_fingerprint(geometry)}: top-k or expert shapes differ)")


# ---- checks shared by both readers
def _check_pairs(path, ranked: np.ndarray, n_layers: int, n_expert: int) -> None:
    bad_l = np.nonzero((ranked[:, 0] < 0) | (ranked[:, 0] >= n_layers))[0]
    if bad_l.size:
        i = int(bad_l[0])
        raise InputError(f"{path}: ranked entry {i} has layer {int(ranked[i, 0])} out of range 0..{n_layers - 1}")
    bad_e = np.nonzero((ranked[:, 1] < 0) | (ranked[:, 1] >= n_expert))[0]
    if bad_e.size:
        i = int(bad_e[0])
        raise InputError(f"{path}: ranked entry {i} has expert {int(ranked[i, 1])} out of range 0..{n_expert - 1}")
    flat = ranked[:, 0].astype(np.int64) * n_expert + ranked[:, 1]
    uniq, first = np.unique(flat, return_index=True)
    if len(uniq) != len(flat):
        dup = np.setdiff1d(np.arange(len(flat)), first)[0]
        raise InputError(f"{path}: ranked entry {int(dup)} repeats pair (layer {int(ranked[dup, 0])}, expert "
                         f"{int(ranked[dup, 1])})")


def _check_slots(path, slots, n_pairs: int) -> int:
    if isinstance(slots, bool) or not isinstance(slots, int) or not 0 <= slots <= n_pairs:
        raise InputError(f"{path}: slots = {slots!r} (expected an integer 0..{n_pairs})")
    return slots


# ---- STRP v1
def _read_strp(path, data: bytes) -> ExpertProfile:
    if len(data) < STRP_HEADER.size:
        raise InputError(f"{path}: truncated STRP profile ({len(data)} bytes, the header alone is {STRP_HEADER.size})")
    magic, version, n_layers, n_expert, slots, n_ranked = STRP_HEADER.unpack_from(data)
    if version != STRP_VERSION:
        raise InputError(f"{path}: STRP profile version {version} (strata reads version {STRP_VERSION})")
    if not (1 <= n_layers <= 0xFFFF and 1 <= n_expert <= 0xFFFF):
        raise InputError(f"{path}: STRP header has {n_layers} layers x {n_expert} experts (expected 1..65535 each)")
    n_pairs = n_layers * n_expert
    if n_ranked > n_pairs:
        raise InputError(f"{path}: STRP header ranks {n_ranked} pairs but {n_layers} x {n_expert} has {n_pairs}")
    want = STRP_HEADER.size + 4 * n_ranked + 4 * n_pairs
    if len(data) != want:
        what = "truncated" if len(data) < want else "trailing bytes after the table in"
        raise InputError(f"{path}: {what} STRP profile ({len(data)} bytes, header says {want})")
    off = STRP_HEADER.size
    ranked = np.frombuffer(data, dtype="<u2", count=2 * n_ranked, offset=off).reshape(-1, 2).astype(np.int32)
    table = np.frombuffer(data, dtype="<i4", count=n_pairs, offset=off + 4 * n_ranked).reshape(n_layers, n_expert)
    _check_pairs(path, ranked, n_layers, n_expert)
    _check_slots(path, int(slots), n_pairs)
    ranks = np.full((n_layers, n_expert), -1, dtype=np.int64)
    ranks[ranked[:, 0], ranked[:, 1]] = np.arange(n_ranked)
    counts = None
    if not np.array_equal(table, ranks):
        # the original tool's header comment calls the table a frequency table: accept counts too
        neg = np.argwhere(table < 0)
        if neg.size:
            layer, expert = (int(v) for v in neg[0])
            raise InputError(f"{path}: table entry (layer {layer}, expert {expert}) = {int(table[layer, expert])} is "
                             f"neither that pair's rank ({int(ranks[layer, expert])}) nor a count")
        counts = table.astype(np.int64)
        _check_counts_agree(path, ranked, counts)
    return ExpertProfile(n_layers=n_layers, n_expert=n_expert, ranked=ranked, slots=int(slots), counts=counts)


def _check_counts_agree(path, ranked: np.ndarray, counts: np.ndarray) -> None:
    """A table of counts must agree with the ranked pairs: hottest first (ties in any order), and no unranked pair
    hotter than a ranked one; else the file contradicts itself and neither order can be trusted."""
    ranked_counts = counts[ranked[:, 0], ranked[:, 1]]
    rises = np.flatnonzero(np.diff(ranked_counts) > 0)
    if rises.size:
        i = int(rises[0])
        raise InputError(f"{path}: the table contradicts the ranked pairs: ranked entry {i} (layer {ranked[i, 0]}, "
                         f"expert {ranked[i, 1]}) has count {ranked_counts[i]}, entry {i + 1} has "
                         f"{ranked_counts[i + 1]}")
    unranked = np.ones(counts.shape, dtype=bool)
    unranked[ranked[:, 0], ranked[:, 1]] = False
    if ranked_counts.size and unranked.any() and counts[unranked].max() > ranked_counts[-1]:
        layer, expert = (int(v) for v in np.argwhere(unranked & (counts > ranked_counts[-1]))[0])
        raise InputError(f"{path}: the table contradicts the ranked pairs: unranked pair (layer {layer}, expert "
                         f"{expert}) has count {int(counts[layer, expert])}, more than ranked entry "
                         f"{len(ranked_counts) - 1} ({int(ranked_counts[-1])})")


def _strp_bytes(p: ExpertProfile) -> bytes:
    if p.n_layers > 0xFFFF or p.n_expert > 0xFFFF:
        raise InputError(f"STRP stores layers and experts as u16: {p.n_layers} x {p.n_expert} does not fit")
    ranks = np.full((p.n_layers, p.n_expert), -1, dtype="<i4")
    ranks[p.ranked[:, 0], p.ranked[:, 1]] = np.arange(len(p.ranked))
    head = STRP_HEADER.pack(STRP_MAGIC, STRP_VERSION, p.n_layers, p.n_expert, p.slots, len(p.ranked))
    return head + p.ranked.astype("<u2").tobytes() + ranks.tobytes()


# ---- YAML
def _yaml_text(p: ExpertProfile) -> str:
    lines = [f"# strata expert profile: router picks per (layer, expert) over {p.tokens_seen} tokens",
             f"format: {FORMAT}", f"version: {VERSION}", "model:",
             f"  file: {_quote(p.model_file)}", f"  arch: {p.arch}", f"  layers: {p.n_layers}",
             f"  experts: {p.n_expert}",
             f"  experts_used: {'null' if p.n_expert_used is None else p.n_expert_used}",
             f"  geometry: {_quote(p.fingerprint)}",
             f"tokens_seen: {p.tokens_seen}", f"slots: {p.slots}"]
    if p.counts is None:
        lines.append("counts: null")
    else:
        lines.append("counts:  # one row per layer: picks of expert 0..E-1")
        lines += ["- [" + ", ".join(str(int(c)) for c in row) + "]" for row in p.counts]
    lines.append("ranked:  # (layer, expert), hottest first")
    lines += [f"- [{int(layer)}, {int(expert)}]" for layer, expert in p.ranked]
    return "\n".join(lines) + "\n"


def _quote(value) -> str:
    return "null" if value is None else "'" + str(value).replace("'", "''") + "'"


def _read_yaml(path, data: bytes) -> ExpertProfile:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        doc = yaml.load(data, Loader=loader)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise InputError(f"{path}: not a valid YAML profile{at} ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(f"{path}: not an expert profile (no 'format: {FORMAT}'; a binary profile starts with STRP)")
    if doc.get("version") != VERSION:
        raise InputError(f"{path}: profile version {doc.get('version')!r} (strata reads version {VERSION})")
    model = doc.get("model")
    if not isinstance(model, dict):
        raise InputError(f"{path}: missing 'model' section")
    n_layers = _pos_int(path, model, "layers", "model.layers")
    n_expert = _pos_int(path, model, "experts", "model.experts")
    n_pairs = n_layers * n_expert
    tokens_seen = doc.get("tokens_seen", 0)
    if isinstance(tokens_seen, bool) or not isinstance(tokens_seen, int) or tokens_seen < 0:
        raise InputError(f"{path}: tokens_seen = {tokens_seen!r} (expected an integer >= 0)")
    counts = doc.get("counts")
    if counts is not None:
        counts = _int_array(path, "counts", counts)
        if counts.shape != (n_layers, n_expert):
            raise InputError(f"{path}: counts has shape {list(counts.shape)}, expected [{n_layers}, {n_expert}] "
                             "(one row of expert counts per layer)")
        if (counts < 0).any():
            layer, expert = (int(v) for v in np.argwhere(counts < 0)[0])
            raise InputError(f"{path}: counts[{layer}][{expert}] = {int(counts[layer, expert])} is negative")
    ranked = doc.get("ranked")
    if ranked is None:
        if counts is None:
            raise InputError(f"{path}: neither 'counts' nor 'ranked' given")
        ranked = rank_by_counts(counts)
    else:
        ranked = _int_array(path, "ranked", ranked) if len(ranked) else np.zeros((0, 2), dtype=np.int64)
        if ranked.ndim != 2 or ranked.shape[1] != 2:
            raise InputError(f"{path}: ranked must be a list of [layer, expert] pairs")
        if len(ranked) > n_pairs:
            raise InputError(f"{path}: ranked lists {len(ranked)} pairs, the model has {n_pairs}")
        ranked = ranked.astype(np.int32)
    _check_pairs(path, ranked, n_layers, n_expert)
    used = model.get("experts_used")
    return ExpertProfile(
        n_layers=n_layers, n_expert=n_expert, ranked=ranked,
        slots=_check_slots(path, doc.get("slots", len(ranked)), n_pairs), counts=counts, tokens_seen=tokens_seen,
        arch=str(model.get("arch", "qwen4exp")), n_expert_used=int(used) if isinstance(used, int) else None,
        fingerprint=None if model.get("geometry") is None else str(model["geometry"]),
        model_file=None if model.get("file") is None else str(model["file"]))


def _pos_int(path, section: dict, key: str, label: str) -> int:
    value = section.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{path}: {label} = {value!r} (expected an integer >= 1)")
    return value


def _int_array(path, label: str, value) -> np.ndarray:
    try:
        arr = np.array(value, dtype=object)
        if arr.dtype == object and arr.ndim != 2:
            raise ValueError("ragged")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in arr.reshape(-1)):
            raise ValueError("not integers")
        return arr.astype(np.int64)
    except (ValueError, TypeError, OverflowError):
        raise InputError(f"{path}: {label} must be rows of integers of equal length") from None


# ---- files
def load_profile(path) -> ExpertProfile:
    from ..sysio.files import is_stdio, read_bytes

    data = read_bytes(path, what="expert profile")
    path = Path("stdin") if is_stdio(path) else Path(path)  # what the messages call it
    if data[:4] == STRP_MAGIC:
        return _read_strp(path, data)
    if path.suffix.lower() in BINARY_SUFFIXES:
        raise InputError(f"{path}: bad magic {data[:4]!r} (a binary profile starts with {STRP_MAGIC!r})")
    return _read_yaml(path, data)


def check_profile_path(path, force: bool = True) -> Path:
    """Refuse an output path before any work: unknown extension, missing or unwritable directory, an existing file
    without force. `-` is stdout (YAML)."""
    from ..sysio.files import check_output_path, is_stdio

    if is_stdio(path):
        return Path("-")
    path = Path(path)
    if path.suffix.lower() not in BINARY_SUFFIXES + YAML_SUFFIXES:
        raise InputError(f"{path}: unknown profile extension '{path.suffix}' (use .yaml or .bin)")
    return check_output_path(path, what="expert profile", force=force)


def save_profile(profile: ExpertProfile, path) -> None:
    """Write as STRP (.bin/.strp) or YAML (.yaml/.yml), atomically (sysio/files.py: temp file + rename); `-`: YAML on
    stdout."""
    from ..sysio.files import is_stdio, output_stream

    if is_stdio(path):
        payload = _yaml_text(profile).encode()
    else:
        path = check_profile_path(path)
        payload = _strp_bytes(profile) if path.suffix.lower() in BINARY_SUFFIXES else _yaml_text(profile).encode()
    with output_stream(path, what="expert profile", binary=True) as fh:  # `-`: stdout
        fh.write(payload)


def slot_counts(n_pairs: int, extra: list[int] | tuple[int, ...] = ()) -> list[int]:
    """The slot counts a report shows by default: 10/25/50/75/100 % of the pairs, plus `extra` (e.g. the profile's)."""
    picks = {int(round(n_pairs * f)) for f in (0.1, 0.25, 0.5, 0.75, 1.0)} | {int(e) for e in extra}
    return sorted(p for p in picks if 0 <= p <= n_pairs)
