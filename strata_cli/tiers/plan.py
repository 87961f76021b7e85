"""The per-(layer, group) expert plan and its int32 plan block.

An *entry* is one routed pick: token row t, pick j (0..k-1), expert ids[t, j]; its output row in `parts` / `ymiss`
is dst = t·k + j. A *group* is the entries sharing one expert, in routing order (row-major over ids), groups ordered
by their expert's first pick. Entries of VRAM-resident experts go to the GPU's grouped kernel; of the distinct
misses, the LAST ⌊nmiss·pcie_frac⌋ in routing order are copied over PCIe into staging slots, the rest are computed
once per expert by the CPU pool. The GPU engine's host (tiers/host.py) writes its own plan words.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EMPTY_I32 = np.zeros(0, dtype=np.int32)


@dataclass
class ExpertEntries:
    """Entries grouped by expert: group i is expert experts[i], its entries start[i]:start[i+1] of tok/dst."""

    experts: np.ndarray  # int32 [G]
    start: np.ndarray    # int32 [G+1]
    tok: np.ndarray      # int32 [N] token row (window row)
    dst: np.ndarray      # int32 [N] output row tok·k + j

    @classmethod
    def empty(cls) -> "ExpertEntries":
        return cls(EMPTY_I32, np.zeros(1, dtype=np.int32), EMPTY_I32, EMPTY_I32)

    @property
    def n_groups(self) -> int:
        return len(self.experts)

    @property
    def n_entries(self) -> int:
        return len(self.tok)

    def entries(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = int(self.start[i]), int(self.start[i + 1])
        return self.tok[lo:hi], self.dst[lo:hi]


@dataclass
class LayerPlan:
    layer: int
    vram: ExpertEntries
    vram_slots: np.ndarray  # int32 [Gv] cache slot of each VRAM group
    pcie: ExpertEntries
    cpu: ExpertEntries

    @property
    def n_gpu_entries(self) -> int:
        return self.vram.n_entries + self.pcie.n_entries

    @property
    def n_misses(self) -> int:
        return self.pcie.n_groups + self.cpu.n_groups


def _group(experts_in_order: np.ndarray, entry_expert: np.ndarray, entry_tok: np.ndarray,
           entry_dst: np.ndarray) -> ExpertEntries:
    """Entries (already in routing order) of the given experts, grouped in the order of `experts_in_order`."""
    if len(experts_in_order) == 0:
        return ExpertEntries.empty()
    rank = np.full(int(max(experts_in_order.max(), entry_expert.max())) + 1, -1, dtype=np.int64)
    rank[experts_in_order] = np.arange(len(experts_in_order))
    r = rank[entry_expert]
    keep = np.nonzero(r >= 0)[0]
    order = keep[np.argsort(r[keep], kind="stable")]
    sizes = np.bincount(r[keep], minlength=len(experts_in_order))
    start = np.zeros(len(experts_in_order) + 1, dtype=np.int32)
    np.cumsum(sizes, out=start[1:])
    return ExpertEntries(experts_in_order.astype(np.int32), start, entry_tok[order].astype(np.int32),
                         entry_dst[order].astype(np.int32))


def n_pcie(n_miss: int, pcie_frac: float, pcie_slots: int | None = None) -> int:
    """⌊nmiss·pcie_frac⌋ (the tiny epsilon keeps 0.29·100 at 29), at most the staging slots."""
    n = int(np.floor(n_miss * float(pcie_frac) + 1e-9))
    n = max(0, min(n, n_miss))
    return n if pcie_slots is None else min(n, int(pcie_slots))


def build_plan(layer: int, ids: np.ndarray, table_row: np.ndarray, pcie_frac: float = 0.0, row0: int = 0,
               pcie_slots: int | None = None) -> LayerPlan:
    """ids [n, k]: the routed experts of window rows row0..row0+n-1; table_row [E]: slot or -1 (residency row)."""
    ids = np.asarray(ids)
    n, k = ids.shape
    flat = ids.reshape(-1).astype(np.int64)
    tok = (row0 + np.arange(n, dtype=np.int64)).repeat(k)
    dst = tok * k + np.tile(np.arange(k, dtype=np.int64), n)
    _, first = np.unique(flat, return_index=True)
    distinct = flat[np.sort(first)]                      # experts in routing order of their first pick
    slot = np.asarray(table_row)[distinct]
    hits, misses = distinct[slot >= 0], distinct[slot < 0]
    n_dma = n_pcie(len(misses), pcie_frac, pcie_slots)
    cpu_experts, pcie_experts = misses[: len(misses) - n_dma], misses[len(misses) - n_dma:]
    vram = _group(hits, flat, tok, dst)
    return LayerPlan(layer=layer, vram=vram, vram_slots=np.asarray(table_row)[hits].astype(np.int32),
                     pcie=_group(pcie_experts, flat, tok, dst), cpu=_group(cpu_experts, flat, tok, dst))
