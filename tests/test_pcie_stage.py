"""engine/gpu/pcie_stage.py: the PCIe share's pinned staging ring, with numpy buffers in place of pinned memory
(the DMAs from it run in the GPU tier tests)."""

import numpy as np
import pytest

from strata_cli.engine.gpu import pcie_stage
from strata_cli.engine.gpu.pcie_stage import StagingRing, expert_bytes_view, gather_chunks
from strata_cli.tiers.doorbell import StepRange


class FakePinned:
    freed = 0

    def __init__(self, nbytes):
        self.host = np.full(nbytes, 0xEE, dtype=np.uint8)
        self.host_ptr = self.host.ctypes.data

    def free(self):
        FakePinned.freed += 1


def test_expert_bytes_view_is_the_tensors_bytes_per_expert_without_a_copy():
    raw = np.arange(3 * 4 * 5, dtype=np.float32).reshape(3, 4, 5)
    view = expert_bytes_view(raw, 3)
    assert view.shape == (3, 80) and view.dtype == np.uint8 and np.shares_memory(view, raw)
    np.testing.assert_array_equal(view[2].view(np.float32), raw[2].reshape(-1))


def test_chunks_cover_the_range_once_and_none_is_empty():
    for n, parts in [(1, 4), (7, 3), (8, 4), (3, 8), (10, 1)]:
        chunks = gather_chunks(n, parts)
        assert [i for a, b in chunks for i in range(a, b)] == list(range(n))
        assert len(chunks) == min(n, parts) and all(b > a for a, b in chunks)


@pytest.mark.parametrize("threads,split_bytes", [(1, 4 << 20), (3, 1), (4, 4 << 20)])
def test_gather_fills_the_front_of_the_groups_buffer_in_plan_order(monkeypatch, threads, split_bytes):
    monkeypatch.setattr(pcie_stage, "GATHER_SPLIT_BYTES", split_bytes)
    rng = np.random.default_rng(0)
    src = [rng.integers(0, 256, (9, n), dtype=np.uint8) for n in (40, 40, 64)]
    ring = StagingRing(2, [5 * 64] * 3, FakePinned, threads=threads)
    experts = np.array([7, 0, 3, 8], dtype=np.intp)
    for grp in range(2):
        for p in range(3):
            ptr, nbytes = ring.gather(grp, p, src[p], experts)
            buf = ring.buffers[grp][p]
            assert ptr == buf.host_ptr and nbytes == 4 * src[p].shape[1]
            np.testing.assert_array_equal(buf.host[:nbytes].reshape(4, -1), src[p][experts])
            assert (buf.host[nbytes:] == 0xEE).all()  # past the step's experts: untouched
    FakePinned.freed = 0
    ring.close()
    ring.close()
    assert FakePinned.freed == 6  # every buffer freed once, however often close() runs


def test_tier_host_gathers_then_copies_each_projection_between_two_events(monkeypatch):
    """TierHost._copy_pcie with the driver faked: the step's experts land in the group's device slots in plan order,
    one DMA per projection between the step's event pair, flagB after them; _copy_ms sums the pairs' times."""
    import ctypes
    import types

    from strata_cli.tiers import host as tier_host
    from strata_cli.gpu import launch_tiers

    log = []

    class FakeRt:
        cudaMemcpyKind = types.SimpleNamespace(cudaMemcpyHostToDevice="h2d")

        def cudaMemcpyAsync(self, dst, src, n, kind, stream):
            ctypes.memmove(dst, src, n)
            log.append(("copy", n))
            return (0,)

        def cudaEventCreate(self):
            return (0, object())

        def cudaEventRecord(self, event, stream):
            log.append(("event",))
            return (0,)

        def cudaEventElapsedTime(self, a, b):
            return (0, 1.5)

    monkeypatch.setattr(tier_host, "cudart", lambda: FakeRt())
    monkeypatch.setattr(launch_tiers, "write_word", lambda word, value, stream: log.append(("flagB", value)))
    rng = np.random.default_rng(1)
    E, Q = 6, 4
    src = [rng.integers(0, 256, (E, n), dtype=np.uint8) for n in (24, 24, 40)]
    device = {f"tier_stage.{g}.{p}": np.zeros(Q * 40, np.uint8) for g in range(2) for p in range(3)}
    slots = {k: types.SimpleNamespace(data=types.SimpleNamespace(ptr=v.ctypes.data)) for k, v in device.items()}
    t = types.SimpleNamespace(ring_stage=StagingRing(2, [Q * 40] * 3, FakePinned, threads=2), G=2,
                              steps=StepRange(0, 1),
                              expert_src=[src], copy_stream=types.SimpleNamespace(ptr=0), buf=slots,
                              words=types.SimpleNamespace(device=np.zeros(8, np.uint32)))
    host = tier_host.TierHost.__new__(tier_host.TierHost)
    host.t, host.stats, host._events, host._timed_copies = t, {"gather_ms": 0.0}, [], []
    ids = np.array([[4, 1], [1, 5]])
    plan = tier_host.plan_step(ids, np.full(E, -1, np.int32), 1.0)
    host._copy_pcie(0, 1, plan, want=7)
    experts = plan.pcie.experts.tolist()
    assert sorted(experts) == [1, 4, 5]
    for p in range(3):
        n = src[p].shape[1]
        np.testing.assert_array_equal(device[f"tier_stage.1.{p}"][:3 * n].reshape(3, n), src[p][experts])
        assert not device[f"tier_stage.0.{p}"].any()  # the other group's slots are untouched
    assert log == [("event",), ("copy", 72), ("copy", 72), ("copy", 120), ("event",), ("flagB", 7)]
    assert len(host._events) == 2 and host._copy_ms() == 1.5 and host._timed_copies == []
    t.ring_stage.close()
