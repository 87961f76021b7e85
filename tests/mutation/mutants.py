"""Canonical one-line bugs the CPU suite must catch (tests/mutation/run.py applies each to a copy of the tree).

Each mutant names the file, the exact text it replaces (found exactly once) and the tests that should fail; the
subsets keep a run of the whole list to a quarter of an hour on two cores. A mutant that passes its tests is a
behaviour no test pins.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str          # the bug, in words
    path: str          # repository-relative
    old: str
    new: str
    tests: tuple[str, ...]


MATH = ("tests/test_ops_reference.py", "tests/test_hf_random.py")
CONTRACT = ("tests/test_window_contract.py",)

MUTANTS = [
    Mutant("gdn-decay-order", "GDN decays the state after the delta write instead of before",
           "strata_cli/ops/gdn.py",
           "        S *= np.exp(g[t])[:, None, None]\n        mem = np.einsum(\"hij,hi->hj\", S, kt)\n"
           "        delta = (v[t] - mem) * beta[t][:, None]\n        S += kt[:, :, None] * delta[:, None, :]\n",
           "        mem = np.einsum(\"hij,hi->hj\", S, kt)\n        delta = (v[t] - mem) * beta[t][:, None]\n"
           "        S += kt[:, :, None] * delta[:, None, :]\n        S *= np.exp(g[t])[:, None, None]\n",
           MATH),
    Mutant("qsa-tail-cells", "QSA drops the first cell after the last completed block",
           "strata_cli/ops/qsa.py", "np.arange(n_blocks * ratio, n_cells)])", "np.arange(n_blocks * ratio + 1, n_cells)])",
           CONTRACT + MATH),
    Mutant("qsa-last-cell-block", "a block completed at the query's own cell is not scored",
           "strata_cli/ops/qsa.py", "    n_blocks = n_cells // ratio\n", "    n_blocks = (n_cells - 1) // ratio\n",
           CONTRACT + MATH),
    Mutant("qsa-pool-rope", "pooled block keys rotated at the block's last cell instead of its first",
           "strata_cli/ops/qsa.py", "rope_tables(np.array([block * ratio])", "rope_tables(np.array([pos])", MATH),
    Mutant("router-renorm", "router weights not renormalised over the top-k",
           "strata_cli/ops/moe.py", "(w / w.sum(axis=1, keepdims=True)).astype(np.float32)", "w.astype(np.float32)",
           MATH),
    Mutant("router-ties", "router ties go to the higher expert id",
           "strata_cli/ops/moe.py", "    ids = np.argsort(-p, axis=1, kind=\"stable\")[:, :k]\n",
           "    ids = (p.shape[1] - 1 - np.argsort(-p[:, ::-1], axis=1, kind=\"stable\"))[:, :k]\n",
           ("tests/test_ops_reference.py",)),
    Mutant("hc-inject-scale", "hyper-connection write gates lose their factor 2",
           "strata_cli/ops/hyper.py", "inj = 2.0 * sigmoid(", "inj = 1.0 * sigmoid(", MATH),
    Mutant("hc-mix-scale", "hyper-connection low-rank mixer not divided by the stream count",
           "strata_cli/ops/hyper.py", "silu(linear(xn, w_down) / np.float32(C))", "silu(linear(xn, w_down))", MATH),
    Mutant("hc-write-streams", "hyper-connection write gates applied to the wrong streams",
           "strata_cli/ops/hyper.py", "inj[:, :, None]).astype", "inj[:, ::-1, None]).astype", MATH),
    Mutant("ple-eos-cut", "PLE n-gram context not cut at an EOS",
           "strata_cli/ops/ple.py", "cut = cut or int(t) == eos", "cut = False", MATH),
    Mutant("commit-gdn-rows", "commit replays every row of the window into the GDN state, not the n_keep kept",
           "strata_cli/engine/reference.py",
           "r.q[:n_keep], r.k[:n_keep],\n" + " " * 60 + "r.v[:n_keep], r.g[:n_keep], r.beta[:n_keep])",
           "r.q, r.k,\n" + " " * 60 + "r.v, r.g, r.beta)", CONTRACT),
    Mutant("commit-conv-rows", "commit keeps the conv rows after the whole window, not after n_keep rows",
           "strata_cli/engine/reference.py", "r.conv_seq[n_keep:n_keep + g.conv_kernel - 1]",
           "r.conv_seq[-(g.conv_kernel - 1):]", CONTRACT),
    Mutant("commit-indexer-rows", "commit re-appends every indexer key of the window, not the n_keep kept",
           "strata_cli/engine/reference.py", "raw[:n_keep], positions,", "raw, rec.pos0 + np.arange(rec.T),", CONTRACT),
    Mutant("commit-ple-history", "commit keeps the PLE history after the whole window",
           "strata_cli/engine/reference.py", "rec.ple_seq[n_keep:n_keep + g.ple.history]",
           "rec.ple_seq[-g.ple.history:]", CONTRACT),
    Mutant("commit-ple-prev", "commit shifts every window token into the n-gram predecessors",
           "strata_cli/engine/reference.py", "rec.tokens[:n_keep]])", "rec.tokens])", CONTRACT),
    Mutant("dropped-window", "a run writes the committed indexer tail in place (the issue-8 bug)",
           "strata_cli/ops/qsa.py", "indexer_append(ix.tail.copy(),", "indexer_append(ix.tail,", CONTRACT),
    Mutant("context-bound", "a window that exactly fills the context is refused",
           "strata_cli/engine/state.py", "if n_past + tokens.size > n_ctx:", "if n_past + tokens.size >= n_ctx:",
           CONTRACT + ("tests/test_bench_math.py",)),
    Mutant("sampler-key", "sampling keyed by the row in the window instead of the absolute position",
           "strata_cli/ops/sampling.py", "gumbel(seed, int(pos), logits.shape[1])", "gumbel(seed, t, logits.shape[1])",
           ("tests/test_sampling.py",)),
    Mutant("philox-rounds", "Philox with 7 rounds instead of 10",
           "strata_cli/ops/sampling.py", "    for _ in range(10):\n", "    for _ in range(7):\n",
           ("tests/test_sampling.py",)),
    Mutant("expected-tokens", "E(T) sums A^j up to j = T (A^(T+1) in the closed form)",
           "strata_cli/analysis/speculation.py", "        for j in range(1, window):\n", "        for j in range(1, window + 1):\n",
           ("tests/test_bench_math.py",)),
    Mutant("n-keep-draw", "the drawn n_keep counts accepted drafts without the verified token",
           "strata_cli/analysis/speculation.py", "        keep = 1\n", "        keep = 0 if window > 1 else 1\n",
           ("tests/test_bench_math.py",)),
    Mutant("speedup", "speedup inverted: t(T) / t(1) instead of t(1) / t(T)",
           "strata_cli/analysis/window_timing.py", "rec.expected_tokens * base / rec.ms_median",
           "rec.expected_tokens * rec.ms_median / base", ("tests/test_bench_math.py",)),
    Mutant("accepted-tok-s", "accepted tokens/s counts every fed row",
           "strata_cli/report/records.py", "return self.expected_tokens / self.ms_median * 1e3",
           "return self.window / self.ms_median * 1e3", ("tests/test_bench_math.py",)),
    Mutant("bench-reprefill", "the bench prefills again one window before the context is full",
           "strata_cli/analysis/window_timing.py", "if engine.n_past + window > engine.n_ctx:",
           "if engine.n_past + window >= engine.n_ctx:", ("tests/test_bench_math.py",)),
    Mutant("draft-noise-keep", "the draft-noise loop also keeps the row of the replaced draft",
           "strata_cli/analysis/logprobs.py", "                n_keep = j\n", "                n_keep = j + 1\n",
           ("tests/test_bench_math.py",)),
]
