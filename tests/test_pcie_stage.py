"""engine/gpu/pcie_stage.py: the PCIe share's pinned staging ring, with numpy buffers in place of pinned memory
(the DMAs from it run in the GPU tier tests)."""

import numpy as np
import pytest

from strata_cli.engine.gpu import pcie_stage
from strata_cli.engine.gpu.pcie_stage import StagingRing, expert_bytes_view, gather_chunks


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
