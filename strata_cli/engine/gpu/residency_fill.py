"""The GPU side of an adaptive expert cache (--expert-policy lru|lfu; tiers/cache_policy.SlotFiller decides): the
admitted experts are gathered from the memory-mapped file into a pinned staging buffer of --expert-max-copy bytes
(one batch at a time: a batch starts only once the last one's copies finished) and copied by the copy engine on a
side stream into their VRAM slots while the next window runs (the file itself is never page-locked: issue 17); the slot table the window graph reads (the device array `tier_table`,
read by tier_group at run time, so no graph is recaptured) is uploaded on the engine's stream from a pinned copy.

The resident arrays of an adaptive cache hold the file's raw blocks (no Q8_0_R32 repacking), so a copy is one DMA
per projection.
"""

from __future__ import annotations

import numpy as np

from ...errors import StrataError
from ...gpu.runtime import MappedBuffer, check, cudart, cupy
from ...tiers.residency import expert_names


class DeviceSlots:
    """SlotFiller's device for one ExpertTiers (after bind: its arena holds tier_table)."""

    def __init__(self, tiers):
        from ...gpu.graphs import new_stream

        self.t = tiers
        self.stream = new_stream()
        self.event = cupy().cuda.Event(disable_timing=True)
        self.pending = False
        self.table_pinned = MappedBuffer(tiers.table_host.shape, np.int32)
        # [layer][projection] over the engine's layers: the file's bytes of that projection, one row per expert
        self.src = {layer: [np.asarray(tiers.model.info(n).raw).reshape(-1).view(np.uint8).reshape(tiers.E, -1)
                            for n in expert_names(layer)] for layer in tiers.steps.layers}
        for layer, (arrays, n_slots) in tiers.resident.items():
            for p, (arr, _) in enumerate(arrays):
                if arr.nbytes // int(arr.shape[0]) != self.src[layer][p].shape[1]:
                    raise StrataError(f"layer {layer}: a VRAM slot of {arr.nbytes // int(arr.shape[0])} bytes does "
                                      f"not hold one expert of the file ({self.src[layer][p].shape[1]} bytes)")
        self.staging = MappedBuffer((max(int(tiers.cfg.max_copy), 1),), np.uint8)  # one batch's bytes, pinned
        self.used = 0  # staging bytes the batch being issued holds

    def done(self) -> bool:
        finished = not self.pending or self.event.done
        if finished:
            self.used = 0  # no copy still reads the staging buffer: the next batch starts at its front
        return finished

    def upload_table(self, table: np.ndarray) -> None:
        """Through the pinned copy: the last upload finished (the window after it was served to the end)."""
        rt = cudart()
        self.table_pinned.host[:] = table
        dev = self.t.buf["tier_table"]
        check(rt.cudaMemcpyAsync(dev.data.ptr, self.table_pinned.host.ctypes.data, dev.nbytes,
                                 rt.cudaMemcpyKind.cudaMemcpyHostToDevice, self.t.engine.stream.ptr),
              "cudaMemcpyAsync of the slot table")

    def copy_expert(self, layer: int, expert: int, slot: int) -> None:
        rt = cudart()
        arrays, _ = self.t.resident[layer]
        for p, (arr, _) in enumerate(arrays):
            row = self.src[layer][p][expert]
            nbytes = row.nbytes
            if self.used + nbytes > self.staging.nbytes:  # the policy keeps a batch within --expert-max-copy
                raise StrataError(f"--expert-policy: a batch past the {self.staging.nbytes}-byte staging buffer")
            self.staging.host[self.used:self.used + nbytes] = row
            check(rt.cudaMemcpyAsync(arr.data.ptr + slot * nbytes, self.staging.host_ptr + self.used, nbytes,
                                     rt.cudaMemcpyKind.cudaMemcpyHostToDevice, self.stream.ptr),
                  f"cudaMemcpyAsync of expert {expert} of layer {layer}")
            self.used += nbytes

    def issued(self) -> None:
        self.event.record(self.stream)
        self.pending = True

    def free(self) -> None:
        """Free the staging buffer and the slot table's pinned copy once no copy still reads them (idempotent)."""
        self.stream.synchronize()
        self.staging.free()
        self.table_pinned.free()


def make_filler(tiers):
    """The SlotFiller of an adaptive --expert-policy over tiers' slot table (updated in place: the host plans from
    the same table)."""
    from ...tiers.cache_policy import ResidencyPolicy, SlotFiller

    per_pair = [sum(b) for b in tiers.expert_bytes]
    policy = ResidencyPolicy(tiers.cfg.policy, tiers.table_host, per_pair, tiers.cfg.max_copy)
    return SlotFiller(policy, DeviceSlots(tiers))
