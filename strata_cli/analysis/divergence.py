"""How far one model's next-token distributions are from a base model's, as `llama-perplexity --kl-divergence`
reports it, over the same token sequence.

Per position p (the distribution after tokens[0..p], target tokens[p+1]), with base log-probs b and other log-probs o:
    KLD(p)  = sum_v exp(b_v) (b_v - o_v)                          (nats; the base is the reference)
    Δp(p)   = exp(o_target) - exp(b_target)                       (probability of the target, other minus base)
    nll(p)  = -b_target (base), -o_target (other);  PPL = exp(mean nll)
    top-1   = argmax b == argmax o
Aggregates: mean KLD ± its standard error (std / sqrt(n - 1) with the population std), KLD percentiles (numpy's
linear interpolation), PPL of each, their ratio and ln(PPL_other / PPL_base) = mean(nll_o - nll_b) ± the standard
error of that difference, top-1 agreement ± sqrt(f (1 - f) / (n - 1)), Δp mean ± error, RMS Δp, Δp percentiles.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import InputError
from ..ops.basic import log_softmax64

KLD_PERCENTILES = (50.0, 90.0, 99.0, 99.9)
DP_PERCENTILES = (1.0, 5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0)


@dataclass
class PositionArrays:
    """Per-position values of one comparison; `kld` is None where full distributions were not available."""

    pos: np.ndarray
    target: np.ndarray
    lp_base: np.ndarray  # log p_base(target)
    lp_other: np.ndarray
    top_base: np.ndarray
    top_other: np.ndarray
    kld: np.ndarray | None

    def rows(self) -> list[dict]:
        out = []
        for i in range(len(self.pos)):
            row = {"pos": int(self.pos[i]), "target": int(self.target[i]), "lp_base": float(self.lp_base[i]),
                   "lp_other": float(self.lp_other[i]),
                   "dp": float(np.exp(self.lp_other[i]) - np.exp(self.lp_base[i])),
                   "top_base": int(self.top_base[i]), "top_other": int(self.top_other[i]),
                   "top1_agree": bool(self.top_base[i] == self.top_other[i])}
            if self.kld is not None:
                row["kld"] = float(self.kld[i])
            out.append(row)
        return out


def position_arrays(logits_base: np.ndarray, logits_other: np.ndarray, positions: np.ndarray,
                    targets: np.ndarray) -> PositionArrays:
    """Per-position statistics from raw logits [n, V] of both models (log-softmax in float64)."""
    if logits_base.shape != logits_other.shape:
        raise InputError(f"the models' logits differ in shape: {logits_base.shape} vs {logits_other.shape} "
                         "(different vocabularies cannot be compared)")
    b, o = log_softmax64(logits_base), log_softmax64(logits_other)
    rows = np.arange(len(targets))
    kld = np.sum(np.exp(b) * (b - o), axis=-1)
    return PositionArrays(np.asarray(positions), np.asarray(targets), b[rows, targets], o[rows, targets],
                          np.argmax(b, axis=-1), np.argmax(o, axis=-1), np.maximum(kld, 0.0))


def concat(parts: list[PositionArrays]) -> PositionArrays:
    def cat(name):
        values = [getattr(p, name) for p in parts]
        return None if any(v is None for v in values) else np.concatenate(values)

    return PositionArrays(*(cat(name) for name in ("pos", "target", "lp_base", "lp_other", "top_base", "top_other",
                                                   "kld")))


def _sem(x: np.ndarray) -> float:
    n = len(x)
    return float(np.std(x) / math.sqrt(n - 1)) if n > 1 else float("nan")


def _pct_key(q: float) -> str:
    return ("p" + f"{q:g}".replace(".", "_")) if q != 50.0 else "median"


@dataclass(frozen=True)
class DivergenceStats:
    """The aggregates over n positions. KLD fields are None when the inputs had no full distributions."""

    n: int
    ppl_base: float
    ppl_other: float
    ppl_ratio: float
    ln_ppl_ratio: float
    ln_ppl_ratio_err: float
    top1_agreement: float
    top1_agreement_err: float
    dp_mean: float
    dp_mean_err: float
    dp_rms: float
    dp_percentiles: dict
    dp_min: float
    dp_max: float
    kld_mean: float | None = None
    kld_mean_err: float | None = None
    kld_percentiles: dict | None = None
    kld_max: float | None = None

    @classmethod
    def of(cls, a: PositionArrays) -> DivergenceStats:
        n = len(a.pos)
        if n == 0:
            raise InputError("no positions to compare")
        nll_b, nll_o = -a.lp_base, -a.lp_other
        diff = nll_o - nll_b
        dp = np.exp(a.lp_other) - np.exp(a.lp_base)
        agree = (a.top_base == a.top_other).astype(np.float64)
        f = float(agree.mean())
        kld = {}
        if a.kld is not None:
            kld = dict(kld_mean=float(a.kld.mean()), kld_mean_err=_sem(a.kld),
                       kld_percentiles={_pct_key(q): float(np.percentile(a.kld, q)) for q in KLD_PERCENTILES},
                       kld_max=float(a.kld.max()))
        ppl_b, ppl_o = math.exp(float(nll_b.mean())), math.exp(float(nll_o.mean()))
        return cls(n=n, ppl_base=ppl_b, ppl_other=ppl_o, ppl_ratio=ppl_o / ppl_b,
                   ln_ppl_ratio=float(diff.mean()), ln_ppl_ratio_err=_sem(diff), top1_agreement=f,
                   top1_agreement_err=math.sqrt(f * (1 - f) / (n - 1)) if n > 1 else float("nan"),
                   dp_mean=float(dp.mean()), dp_mean_err=_sem(dp), dp_rms=float(np.sqrt(np.mean(dp * dp))),
                   dp_percentiles={_pct_key(q): float(np.percentile(dp, q)) for q in DP_PERCENTILES},
                   dp_min=float(dp.min()), dp_max=float(dp.max()), **kld)

    def flat(self) -> dict:
        """One flat row of raw numbers (percentiles as kld_p99, dp_median, ...)."""
        out = {}
        for key, value in asdict(self).items():
            if isinstance(value, dict):
                prefix = key.split("_")[0]
                out.update({f"{prefix}_{k}": v for k, v in value.items()})
            elif key.endswith("_percentiles"):
                continue  # None: no full distributions
            else:
                out[key] = value
        return out

    def table_rows(self) -> list[dict]:
        """(metric, value) rows for reading, llama-perplexity style."""
        rows = []
        if self.kld_mean is not None:
            rows.append(("mean KLD", f"{self.kld_mean:.6f} ± {self.kld_mean_err:.6f}"))
            rows += [(f"KLD {k.replace('p', '').replace('_', '.')}%" if k != "median" else "KLD median", f"{v:.6f}")
                     for k, v in self.kld_percentiles.items()]
            rows.append(("KLD max", f"{self.kld_max:.6f}"))
        rows += [("PPL base", f"{self.ppl_base:.4f}"), ("PPL other", f"{self.ppl_other:.4f}"),
                 ("PPL ratio other/base", f"{self.ppl_ratio:.6f}"),
                 ("ln(PPL ratio)", f"{self.ln_ppl_ratio:.6f} ± {self.ln_ppl_ratio_err:.6f}"),
                 ("same top-1", f"{100 * self.top1_agreement:.3f} ± {100 * self.top1_agreement_err:.3f} %"),
                 ("mean Δp", f"{100 * self.dp_mean:.4f} ± {100 * self.dp_mean_err:.4f} %"),
                 ("RMS Δp", f"{100 * self.dp_rms:.4f} %"), ("Δp min", f"{100 * self.dp_min:.4f} %")]
        rows += [(f"Δp {k.replace('p', '').replace('_', '.')}%" if k != "median" else "Δp median",
                  f"{100 * v:.4f} %") for k, v in self.dp_percentiles.items()]
        rows.append(("Δp max", f"{100 * self.dp_max:.4f} %"))
        return [{"metric": m, "value": v} for m, v in rows]


def compare_engines(base, other, tokens: np.ndarray, window: int, progress=None) -> PositionArrays:
    """Run both engines over `tokens` in lockstep, window by window (no [N, V] array of either model is kept), and
    return the per-position values of `other` against `base`."""
    from .logprobs import window_logits

    parts = []
    for (pos, lb, targets), (pos_o, lo, _) in zip(window_logits(base, tokens, window, progress),
                                                 window_logits(other, tokens, window)):
        assert np.array_equal(pos, pos_o)  # same tokens, same window: same positions
        parts.append(position_arrays(lb, lo, pos, targets))
    return concat(parts)
