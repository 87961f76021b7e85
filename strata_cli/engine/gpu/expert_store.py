"""The PCIe share's source: the experts the copy engine may send, copied once at load into page-locked host memory.

The copy engine reads page-locked memory only. Two earlier sources lost:
- the mapped GGUF page-locked in place (cudaHostRegister of the expert tensors): the edge pages also held dense
  tensors' bytes, the registration outlived its engine (the next engine's uploads that straddled it were refused),
  and at full size the registration of ~48 GB of file pages took minutes before the first window (#17);
- a pinned staging ring that each step's PCIe experts were gathered into from the mapping, on the pool's cores,
  before their DMA: the gather cost the host more than the pool time it saved, at every share (17.9-61 GB/s of
  gather against the pool's 52: docs/BENCHMARKS.md, 2026-12-02), so the share never won.
Here the engine copies, once at load, every expert the PCIe share may send into one anonymous mapping on 2 MB pages
of its own (nothing else lives in it, so no copy ever straddles its edge) and page-locks it: cudaHostRegister ran at
12.7-14.2 GB/s on the H200 host's 2 MB pages (bench/pinned_probe.py), ~4 s for 46 GB. A step's PCIe experts are then
DMA'd straight from it (tiers/host.py): the host's cores only run the pool, which reads the mapping as before.

Which experts: a static residency's non-resident ones of each layer (a resident one never misses); an adaptive
--expert-policy's every expert (any may be evicted). The cost is host memory: their bytes stay page-locked until the
engine's close(); the load says how much.

Layout: per layer, the gate, then up, then down rows of its stored experts in expert order (each expert's bytes of a
projection contiguous, as in the file), each block 4 KiB aligned; slot[layer][e] = the expert's index or -1.
"""

from __future__ import annotations

import mmap

import numpy as np

from ...errors import InputError
from ...tiers.gather import expert_bytes_view, gather_blocks
from ...tiers.residency import expert_names

HUGE = 2 << 20
ALIGN = 4096
MADV_HUGEPAGE = 14


def _round_up(n: int, to: int) -> int:
    return -(-int(n) // to) * to


def available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class PinnedExperts:
    """The stored experts of `layers` (table: the residency [L, E], its -1 entries stored; None: every expert), copied
    from the model's mapping on the pool's team (lib, threads: tiers/pool.gather_team()) and registered with `rt`
    (the CUDA runtime: cudaHostRegister / cudaHostUnregister; the CPU tests pass a stand-in)."""

    def __init__(self, model, layers, table: np.ndarray | None, lib, threads: int, rt, check):
        g = model.geometry
        self.E, self.rt, self.check = g.n_expert, rt, check
        self.slot: dict[int, np.ndarray] = {}
        self.bytes_of: dict[int, list[int]] = {}
        self.at: dict[int, list[int]] = {}  # per layer, each projection's block offset
        blocks, used = [], 0
        for layer in layers:
            ids = np.arange(self.E) if table is None else np.flatnonzero(table[layer] < 0)
            slot = np.full(self.E, -1, np.int64)
            slot[ids] = np.arange(len(ids))
            self.slot[layer] = slot
            names = expert_names(layer)
            self.bytes_of[layer] = [int(model.info(n).n_bytes) // self.E for n in names]
            offsets = []
            for name, nbytes in zip(names, self.bytes_of[layer]):
                used = _round_up(used, ALIGN)
                offsets.append(used)
                blocks.append((used, len(ids), nbytes, expert_bytes_view(model.info(name).raw, self.E), ids))
                used += len(ids) * nbytes
            self.at[layer] = offsets
        self.nbytes = _round_up(max(used, 1), HUGE)
        free = available_bytes()
        if free is not None and self.nbytes > free:
            raise InputError(f"the PCIe share page-locks its experts in host memory: {self.nbytes / 2**30:.1f} GiB "
                             f"needed, {free / 2**30:.1f} GiB available (/proc/meminfo); use --pcie-frac 0 or a "
                             "larger --expert-cache")
        self._map = mmap.mmap(-1, self.nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        whole = np.frombuffer(self._map, np.uint8)
        off = -whole.ctypes.data % HUGE  # 2 MB aligned: huge pages from the first byte (and fewer to register)
        self.host = whole[off:off + self.nbytes]
        self.base = int(self.host.ctypes.data)
        self.registered = False
        from ...tiers.prefault import madvise

        madvise(self.base, self.nbytes, MADV_HUGEPAGE)  # where the kernel's THP mode allows it
        # every block in one gather on the pool's team (its faults, the kernel zeroing each page, spread with it)
        gather_blocks(lib, threads, [(self.host[at:at + n * nb].reshape(n, nb), src, ids)
                                     for at, n, nb, src, ids in blocks if n], size_by_bytes=False)
        check(rt.cudaHostRegister(self.base, self.nbytes, rt.cudaHostRegisterPortable), "cudaHostRegister")
        self.registered = True

    def stored_bytes(self) -> int:
        return int(sum((s >= 0).sum() * sum(self.bytes_of[layer]) for layer, s in self.slot.items()))

    def addresses(self, layer: int, experts: np.ndarray) -> list[np.ndarray]:
        """Per projection (gate, up, down) the host addresses [n] uint64 of the experts' bytes (each of
        bytes_of[layer][p] bytes). An expert the store does not hold is an error (the plan sends only misses)."""
        slots = self.slot[layer][np.asarray(experts, dtype=np.int64)]
        if (slots < 0).any():
            raise ValueError(f"layer {layer}: experts {np.asarray(experts)[slots < 0].tolist()} are not in the "
                             "page-locked store (only non-resident experts are)")
        return [np.uint64(self.base + at) + slots.astype(np.uint64) * np.uint64(nb)
                for at, nb in zip(self.at[layer], self.bytes_of[layer])]

    def view(self, layer: int, p: int) -> np.ndarray:
        """The stored experts of layer's projection p, [n, expert bytes] uint8 (for the tests)."""
        n, nb = int((self.slot[layer] >= 0).sum()), self.bytes_of[layer][p]
        at = self.at[layer][p]
        return self.host[at:at + n * nb].reshape(n, nb)

    def close(self) -> None:
        """Unregister and unmap (the engine's close(); idempotent). No address may be copied from afterwards."""
        if self.registered:
            self.check(self.rt.cudaHostUnregister(self.base), "cudaHostUnregister")
            self.registered = False
        if self._map is not None:
            self.host = None
            try:
                self._map.close()
            except BufferError:  # a view is still alive somewhere: the mapping goes with it
                pass
            self._map = None
