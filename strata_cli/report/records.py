"""One benchmark record, as llama-bench keeps one per test: raw measurements plus where they came from.

`BenchRecord` holds the raw values of one window size T (every timed sample in ms and the statistics over them,
rows/s, the expected tokens E(T), the speedup, bytes read and the bandwidth floor, capture and host time);
`Provenance` holds what makes the numbers reproducible (when, the command line, seed, depth, ctx, warm-up, which
model file byte for byte, which device, driver, library versions and commit). `BenchRecord.flat()` is the one flat
row every output format prints, so csv/json/jsonl hold the same raw numbers.
"""

from __future__ import annotations

import hashlib
import shlex
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

import numpy as np

HASH_CHUNK = 1 << 20
ARGV_KEY = "strata.argv"  # click context meta: the arguments after `strata`


@dataclass(frozen=True)
class ModelIdentity:
    """Which model file: its path, size, a sha256 over the GGUF header + metadata + tensor table (every byte before
    the first tensor's data, so a rewritten tensor list or key changes it but hashing a 22 GB file is not needed)
    and the tensor type mix ("F32:68 Q8_0:128")."""

    path: str
    size_bytes: int
    header_sha256: str
    type_mix: str

    @classmethod
    def of(cls, model) -> ModelIdentity:
        data_start = min((t.offset for t in model.tensors.values()), default=model.file_size)
        digest = hashlib.sha256()
        with open(model.path, "rb") as fh:
            left = data_start
            while left > 0:
                chunk = fh.read(min(HASH_CHUNK, left))
                if not chunk:
                    break
                digest.update(chunk)
                left -= len(chunk)
        counts: dict[str, int] = {}
        for info in model.tensors.values():
            counts[info.type_name] = counts.get(info.type_name, 0) + 1
        mix = " ".join(f"{name}:{n}" for name, n in sorted(counts.items()))
        return cls(str(model.path), int(model.file_size), digest.hexdigest(), mix)


def command_line() -> str:
    """The command as the user typed it (`strata verify-bench m.gguf -r 50`), shell-quoted."""
    import click

    ctx = click.get_current_context(silent=True)
    argv = ctx.meta.get(ARGV_KEY) if ctx is not None else None  # set by the root group (cli.LazyGroup)
    args = argv if argv is not None else sys.argv[1:]
    return "strata " + shlex.join(str(a) for a in args)


def utc_timestamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Provenance:
    """Where a set of records came from. `env` is envinfo.environment_record (versions, commit, host, device)."""

    timestamp: str
    command: str
    seed: int
    depth: int
    n_ctx: int
    warmup: int
    repetitions: int
    acceptance: float | None  # the assumed constant rate; None when measured
    acceptance_per_position: list[float] | None  # the measured conditional rate of draft 1, 2, ...; None when assumed
    acceptance_source: str  # "assumed" or the dump the acceptance was measured from
    mode: str  # numpy | graph | eager
    model: ModelIdentity
    env: dict = field(default_factory=dict)
    tokens: str = "random ids"  # what the windows read: seeded random ids, or the text (verify-bench --text-file)

    def flat(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k not in ("model", "env")}
        model = self.model
        out.update(model=model.path, model_bytes=model.size_bytes, model_sha256=model.header_sha256,
                   model_types=model.type_mix)
        out.update(self.env)
        return out


@dataclass
class BenchRecord:
    """The raw measurements of one window size T. Times in ms, bytes as integers, rates per second."""

    window: int
    samples_ms: list[float]
    host_samples_ms: list[float]
    kept: list[int]  # rows committed per timed window (the drawn n_keep)
    expected_tokens: float  # E(T) at the record's acceptance
    speedup_vs_t1: float | None = None
    ms_vs_t1: float | None = None  # t(T) / t(1): what checking T rows costs against checking one
    capture_ms: float | None = None  # GPU: capturing this T's graph
    read_bytes: int | None = None  # GPU: bytes one window reads (dense + expected distinct experts)
    dense_bytes: int | None = None
    expert_bytes: int | None = None
    copy_bytes_per_s: float | None = None  # GPU: measured device-to-device copy rate
    tiers: dict | None = None  # GPU expert tiers: shares, waits, pool time (tiers/stats.py)
    # the layer split (--gpus): per stage its device, layers, weight bytes, bytes a window reads there, its window
    # ms (median, mean) and its hand-off ms to the next stage (median) over the timed windows (engine/layer_split.py);
    # a tiered stage's `tiers` dict: its own tiers' columns (tiers/stats.py)
    stages: list[dict] | None = None
    provenance: Provenance | None = None

    @property
    def ms_mean(self) -> float:
        return float(np.mean(self.samples_ms))

    @property
    def ms_stddev(self) -> float:
        return float(np.std(self.samples_ms, ddof=1)) if len(self.samples_ms) > 1 else 0.0

    @property
    def ms_median(self) -> float:
        return float(np.median(self.samples_ms))

    @property
    def ms_p10(self) -> float:
        return float(np.percentile(self.samples_ms, 10))

    @property
    def ms_p90(self) -> float:
        return float(np.percentile(self.samples_ms, 90))

    @property
    def host_ms(self) -> float:
        """Median host share of a window (the CPU engine: the whole window)."""
        return float(np.median(self.host_samples_ms))

    @property
    def rows_per_s(self) -> float:
        return self.window / self.ms_median * 1e3

    @property
    def accepted_tok_per_s(self) -> float:
        return self.expected_tokens / self.ms_median * 1e3

    @property
    def floor_ms(self) -> float | None:
        """The time reading `read_bytes` takes at the measured copy rate: no window can be faster."""
        if self.read_bytes is None or not self.copy_bytes_per_s:
            return None
        return self.read_bytes / self.copy_bytes_per_s * 1e3

    @property
    def x_floor(self) -> float | None:
        floor = self.floor_ms
        return self.ms_median / floor if floor else None

    def stage_rows(self) -> list[dict]:
        """One flat dict per stage of the layer split: T, the stage's keys, then a tiered stage's tier columns."""
        return [{"window": self.window, **{k: v for k, v in s.items() if k != "tiers"}, **(s.get("tiers") or {})}
                for s in self.stages or []]

    def flat(self) -> dict:
        """Measurements first, then the provenance: one flat row for every output format."""
        row = {
            "window": self.window, "repetitions": len(self.samples_ms), "ms_median": self.ms_median,
            "ms_mean": self.ms_mean, "ms_stddev": self.ms_stddev, "ms_p10": self.ms_p10, "ms_p90": self.ms_p90,
            "host_ms": self.host_ms, "rows_per_s": self.rows_per_s, "expected_tokens": self.expected_tokens,
            "accepted_tok_per_s": self.accepted_tok_per_s, "speedup_vs_t1": self.speedup_vs_t1,
            "ms_vs_t1": self.ms_vs_t1, "kept_mean": float(np.mean(self.kept)) if self.kept else None,
            "capture_ms": self.capture_ms, "read_bytes": self.read_bytes, "dense_bytes": self.dense_bytes,
            "expert_bytes": self.expert_bytes, "copy_bytes_per_s": self.copy_bytes_per_s,
            "floor_ms": self.floor_ms, "x_floor": self.x_floor,
            "samples_ms": [float(x) for x in self.samples_ms],
        }
        if self.tiers is not None:
            row.update(self.tiers)
        for stage in self.stage_rows():  # flat keys: one CSV column each
            i = stage["stage"]
            row.update({f"stage{i}_{k}": v for k, v in stage.items() if k not in ("stage", "window")})
        if self.provenance is not None:
            row.update(self.provenance.flat())
        return row
