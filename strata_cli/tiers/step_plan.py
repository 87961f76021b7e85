"""One step's expert plan (a token group of one layer of a launched window): which entries the GPU serves from its
VRAM slots, which over PCIe from the staging, which the CPU pool computes; and the plan slot words the GPU reads.

plan_step + write_plan are the numpy reference (the one rule of tiers/plan.build_plan: the last floor(misses x
pcie_frac) distinct misses in routing order go over PCIe). StepPlanner runs the same in C (kernels/expert_pool_plan.h,
strata_plan_step) into buffers made once: the host (tiers/host.py) plans every step of every window on the
critical path between the GPU's routing and the pool's call, where numpy's dozen small calls cost 80-230 us a layer
on the H200 host (verify-bench's plan ms). Without the native library the planner runs the reference.

The plan slot (per token group, mapped int32; JM = the window's most entries, M = GEMV_MAXT):
  src [JM]              entry -> SRC_VRAM / SRC_PCIE / SRC_CPU (entries of other groups untouched)
  pg_expert [JM]        PCIe group u -> staging slot (groups in the order of their first entry)
  pg_count [JM]         entries of group u (0 past the last)
  pg_entries [JM, M]    the group's global entries, ascending
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from ..gpu.launch_util import GEMV_MAXT
from .plan import ExpertEntries, build_plan

SRC_VRAM, SRC_PCIE, SRC_CPU = 0, 1, 2
_ptr = ctypes.c_void_p


@dataclass
class StepPlan:
    src: np.ndarray        # [J] SRC_* of the group's entries
    pcie: ExpertEntries    # distinct PCIe experts (staging slot = position), their entries local to the group
    cpu: ExpertEntries     # distinct CPU experts, their entries (tok = group row, dst = group entry)


def plan_step(ids: np.ndarray, resident_row: np.ndarray, pcie_frac: float) -> StepPlan:
    """ids [n, K] (the group's routed experts) and the layer's residency row [E] -> the step's plan: the one rule of
    tiers/plan.build_plan (the last floor(misses x pcie_frac) distinct misses in routing order go over PCIe)."""
    layer_plan = build_plan(0, ids, resident_row, pcie_frac)
    src = np.full(ids.size, SRC_VRAM, dtype=np.int32)
    src[layer_plan.pcie.dst] = SRC_PCIE
    src[layer_plan.cpu.dst] = SRC_CPU
    return StepPlan(src, layer_plan.pcie, layer_plan.cpu)


def write_plan(slot: np.ndarray, plan: StepPlan, j0: int, JM: int) -> None:
    """The plan's GPU-facing words into one mapped plan slot [JM * (3 + 16)] (the group's entries start at j0)."""
    J = len(plan.src)
    slot[j0:j0 + J] = plan.src
    g_expert, g_count = slot[JM:2 * JM], slot[2 * JM:3 * JM]
    g_entries = slot[3 * JM:].reshape(JM, GEMV_MAXT)
    g_count[:J] = 0
    for q in range(plan.pcie.n_groups):
        _, rows = plan.pcie.entries(q)
        g_expert[q] = q
        g_entries[q, :len(rows)] = j0 + rows
        g_count[q] = len(rows)



class StepPlanner:
    """plan(ids, resident_row, pcie_frac, slot, j0) = plan_step + write_plan, in C where the native library loads
    (lib: tiers/native.load()'s, or None for the reference). The StepPlan it returns views the planner's buffers:
    valid until the next plan() call (the host uses a step's plan before it plans the next). counts of the last
    plan: VRAM, PCIe and CPU entries."""

    def __init__(self, lib, n_expert: int, JM: int):
        self.lib, self.E, self.JM = lib, int(n_expert), int(JM)
        J = max(self.JM, 1)
        self._cpu = [np.zeros(J, np.int32), np.zeros(J + 1, np.int32), np.zeros(J, np.int32), np.zeros(J, np.int32)]
        self._pcie = [np.zeros(J, np.int32), np.zeros(J + 1, np.int32), np.zeros(J, np.int32)]
        self._counts = np.zeros(5, np.int32)
        self._group = np.full(self.E, -1, np.int32)  # strata_plan_step's map, -1 between calls
        # the buffers' addresses once (an ndarray's .ctypes.data costs about a microsecond a call)
        self._ptrs = [a.ctypes.data for a in (*self._cpu, *self._pcie, self._counts, self._group)]
        self.counts = (0, 0, 0)

    def plan(self, ids: np.ndarray, resident_row: np.ndarray, pcie_frac: float, slot: np.ndarray,
             j0: int) -> StepPlan:
        """ids [n, K] int32 (the group's routed experts), resident_row [E] int32, slot the group's plan slot
        [JM * (3 + GEMV_MAXT)] int32 (written: src from j0, the PCIe groups' words)."""
        if self.lib is None:
            plan = plan_step(ids, resident_row, pcie_frac)
            write_plan(slot, plan, j0, self.JM)
            self.counts = tuple(int((plan.src == s).sum()) for s in (SRC_VRAM, SRC_PCIE, SRC_CPU))
            return plan
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        res = np.ascontiguousarray(resident_row, dtype=np.int32)
        n, K = ids.shape
        if res.shape != (self.E,) or slot.dtype != np.int32 or not slot.flags.c_contiguous or \
                slot.size < self.JM * (3 + GEMV_MAXT):
            raise ValueError(f"plan of {ids.shape} picks: residency row {res.shape} of {self.E} experts, slot "
                             f"{slot.shape} {slot.dtype} of {self.JM * (3 + GEMV_MAXT)} int32 words expected")
        (ce, cs, ct, cd), (pe, ps, pd), c = self._cpu, self._pcie, self._counts
        rc = self.lib.strata_plan_step(n, K, ids.ctypes.data, res.ctypes.data, self.E, float(pcie_frac), int(j0),
                                       self.JM, GEMV_MAXT, slot.ctypes.data, *self._ptrs)
        if rc == 1:
            raise ValueError(f"routed expert id outside 0..{self.E - 1} in {ids.tolist()}")
        if rc != 0:
            raise ValueError(f"plan of {n} x {K} picks at entry {j0} does not fit {self.JM} entries "
                             f"({GEMV_MAXT} a PCIe group)")
        nv, npe, nce, npg, ncg = c.tolist()
        J = n * K
        # src as plan_step returns it: a view of the slot's words just written
        src = slot[j0:j0 + J]
        pcie = ExpertEntries(pe[:npg], ps[:npg + 1], pd[:npe] // K, pd[:npe])
        cpu = ExpertEntries(ce[:ncg], cs[:ncg + 1], ct[:nce], cd[:nce])
        self.counts = (nv, npe, nce)
        return StepPlan(src, pcie, cpu)
