"""The GPU side of an adaptive expert cache (--expert-policy lru|lfu; tiers/cache_policy.SlotFiller decides): a
batch of admitted experts is gathered from the memory-mapped file into a pinned staging buffer of --expert-max-copy
bytes on the pool's OpenMP team (tiers/fill_batch.py: one strata_gather call) and copied by the copy engine on a side
stream into their VRAM slots, one DMA per run of consecutive slots (the file itself is never page-locked: issue 17).
The tier host copies a batch after the window's last step was served (tiers/host.py TierHost.serve), where it waits
for the GPU's tail anyway: the copies of a boundary never sit before the window's launch (issue 20: a one-thread
numpy copy there cost ~110 ms a window at 535 MB). One batch at a time: the next is planned only once the last one's
copies finished, so the staging buffer is free whenever a batch is gathered into it. The slot table the window graph
reads (the device array `tier_table`, read by tier_group at run time, so no graph is recaptured) is uploaded on the
engine's stream from a pinned copy.

With a PCIe share the engine already holds every expert page-locked (engine/gpu/expert_store.py: an adaptive
policy's store is all of them), so a batch is DMA'd straight from there, one copy an expert and projection, and
nothing is gathered: on the full-size file at 3b06801 the gather cost the host 9.6-12.6 ms a window of the pool's
cores (docs/BENCHMARKS.md, 2026-12-03), where a 278 MB batch's ~270 driver calls should take ~1-2 ms (not yet
measured). The staging buffer is made only
for a batch without a store (no share, or one that rebalance_share dropped).

The resident arrays of an adaptive cache hold the file's raw blocks (no Q8_0_R32 repacking), so a slot's bytes are
the file's row of that expert: the store's bytes of it too.
"""

from __future__ import annotations

import numpy as np

from ...errors import StrataError
from ...gpu.runtime import MappedBuffer, check, cudart, cupy
from ...tiers.fill_batch import stage_batch
from ...tiers.gather import expert_bytes_view
from ...tiers.residency import expert_names


class DeviceSlots:
    """SlotFiller's device for one ExpertTiers (after bind: its arena holds tier_table)."""

    def __init__(self, tiers):
        from ...gpu.graphs import new_stream
        from ...tiers.pool import gather_team

        self.t = tiers
        self.stream = new_stream()
        self.event = cupy().cuda.Event(disable_timing=True)
        self.pending = False
        self.table_pinned = MappedBuffer(tiers.table_host.shape, np.int32)
        # [layer][projection] over the engine's layers: the file's bytes of that projection, one row per expert
        self.src = {layer: [expert_bytes_view(tiers.model.info(n).raw, tiers.E) for n in expert_names(layer)]
                    for layer in tiers.steps.layers}
        for layer, (arrays, n_slots) in tiers.resident.items():
            for p, (arr, _) in enumerate(arrays):
                if arr.nbytes // int(arr.shape[0]) != self.src[layer][p].shape[1]:
                    raise StrataError(f"layer {layer}: a VRAM slot of {arr.nbytes // int(arr.shape[0])} bytes does "
                                      f"not hold one expert of the file ({self.src[layer][p].shape[1]} bytes)")
        self.staging = None  # one batch's bytes, pinned: made by the first batch that has no store to copy from
        # gathered on the pool's team (the tier host calls copy_batch on the thread that runs the pool)
        self.lib, self.threads = gather_team()

    def done(self) -> bool:
        return not self.pending or self.event.done

    def upload_table(self, table: np.ndarray) -> None:
        """Through the pinned copy: the last upload finished (the window after it was served to the end)."""
        rt = cudart()
        self.table_pinned.host[:] = table
        dev = self.t.buf["tier_table"]
        check(rt.cudaMemcpyAsync(dev.data.ptr, self.table_pinned.host.ctypes.data, dev.nbytes,
                                 rt.cudaMemcpyKind.cudaMemcpyHostToDevice, self.t.engine.stream.ptr),
              "cudaMemcpyAsync of the slot table")

    def copy_batch(self, copies) -> None:
        """The batch's DMAs issued on the side stream, then the event the next done() asks: from the page-locked
        store where the engine has one (one DMA an expert and projection), else gathered into the staging buffer
        first (one strata_gather call; one DMA per run of consecutive slots)."""
        if not self.done():  # SlotFiller plans a batch only once the last one's copies finished
            raise StrataError("--expert-policy: a batch gathered while the last one's copies still read the staging")
        rt = cudart()
        kind = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        store = self.t.store
        if store is not None:
            by_layer: dict[int, list] = {}
            for c in copies:
                by_layer.setdefault(int(c.layer), []).append(c)
            for layer, batch in by_layer.items():  # one address lookup a layer
                for p, srcs in enumerate(store.addresses(layer, np.array([c.expert for c in batch]))):
                    arr, _ = self.t.resident[layer][0][p]
                    row = store.bytes_of[layer][p]
                    for c, src in zip(batch, srcs):
                        check(rt.cudaMemcpyAsync(arr.data.ptr + int(c.slot) * row, int(src), row, kind,
                                                 self.stream.ptr),
                              f"cudaMemcpyAsync of layer {layer}'s expert {int(c.expert)} into slot {int(c.slot)}")
            self.event.record(self.stream)
            self.pending = True
            return
        if self.staging is None:
            self.staging = MappedBuffer((max(int(self.t.cfg.max_copy), 1),), np.uint8)
        for run in stage_batch(copies, self.src, self.staging.host, self.lib, self.threads):
            arr, _ = self.t.resident[run.layer][0][run.p]
            check(rt.cudaMemcpyAsync(arr.data.ptr + run.slot * run.row_bytes, self.staging.host_ptr + run.offset,
                                     run.nbytes, kind, self.stream.ptr),
                  f"cudaMemcpyAsync of layer {run.layer}'s slots {run.slot}..{run.slot + run.count - 1}")
        self.event.record(self.stream)
        self.pending = True

    def free(self) -> None:
        """Free the staging buffer and the slot table's pinned copy once no copy still reads them (idempotent)."""
        self.stream.synchronize()
        if self.staging is not None:
            self.staging.free()
        self.table_pinned.free()


def make_filler(tiers):
    """The SlotFiller of an adaptive --expert-policy over tiers' slot table (updated in place: the host plans from
    the same table)."""
    from ...tiers.cache_policy import ResidencyPolicy, SlotFiller

    per_pair = [sum(b) for b in tiers.expert_bytes]
    policy = ResidencyPolicy(tiers.cfg.policy, tiers.table_host, per_pair, tiers.cfg.max_copy)
    return SlotFiller(policy, DeviceSlots(tiers))
