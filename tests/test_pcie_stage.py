"""engine/gpu/pcie_stage.py and tiers/gather.py: the PCIe share's pinned staging ring and its gather, with numpy
buffers in place of pinned memory (the DMAs from it run in the GPU tier tests)."""

import numpy as np
import pytest

from strata_cli.engine.gpu.pcie_stage import StagingRing
from strata_cli.tiers.gather import expert_bytes_view, gather_rows
from strata_cli.tiers.doorbell import StepRange
from strata_cli.tiers.step_plan import plan_step


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


def _native():
    from strata_cli.tiers import native

    lib = native.load()
    if lib is None:
        pytest.skip("no C compiler: the native gather is not built")
    return lib


# (lib kind, threads): numpy's take without the library, the native gather on 1 and 3 threads (more threads than
# chunks in the small pieces: every chunk still copied once), and the plain-C build
GATHER_WAYS = [("numpy", 1), ("native", 1), ("native", 3), ("scalar", 2)]


def _lib(kind):
    from strata_cli.tiers import native

    if kind == "numpy":
        return None
    _native()
    return native.load() if kind == "native" else native.load_variant(("STRATA_NO_SIMD=1",), isa="scalar")


@pytest.mark.parametrize("kind,threads", GATHER_WAYS)
def test_gather_fills_the_front_of_the_groups_buffers_in_plan_order(kind, threads):
    rng = np.random.default_rng(0)
    # odd expert sizes (unaligned rows and tails) and one above a 64 KiB chunk, so pieces split over chunks
    src = [rng.integers(0, 256, (9, n), dtype=np.uint8) for n in (40, 40_001, 70_000 + 3)]
    ring = StagingRing(2, [5 * 70_003] * 3, FakePinned, lib=_lib(kind), threads=threads)
    experts = np.array([7, 0, 3, 8], dtype=np.intp)
    for grp in range(2):
        staged = ring.gather(grp, src, experts)
        for p in range(3):
            ptr, nbytes = staged[p]
            buf = ring.buffers[grp][p]
            assert ptr == buf.host_ptr and nbytes == 4 * src[p].shape[1]
            np.testing.assert_array_equal(buf.host[:nbytes].reshape(4, -1), src[p][experts])
            assert (buf.host[nbytes:] == 0xEE).all()  # past the step's experts: untouched
    assert [n for _, n in ring.gather(0, src, experts[:0])] == [0, 0, 0]  # no PCIe expert: nothing copied
    FakePinned.freed = 0
    ring.close()
    ring.close()
    assert FakePinned.freed == 6  # every buffer freed once, however often close() runs


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_native_gather_copies_every_byte_at_any_alignment(threads):
    """strata_gather: every destination and source alignment, sizes around 128 bytes and the 64 KiB chunk, a
    zero-byte piece among them."""
    lib = _native()
    rng = np.random.default_rng(3)
    pool = rng.integers(0, 256, 300_000, dtype=np.uint8)
    sizes = [0, 1, 31, 127, 128, 129, 160, 1000, 65_536, 65_537, 131_071, 70_000]
    offsets = [(i * 7) % 64 for i in range(len(sizes))]
    out = np.zeros(sum(sizes) + 128 * len(sizes), np.uint8)
    src_p, dst_p, want, at = [], [], [], 0
    for n, off in zip(sizes, offsets):
        s0 = (off * 3 + 5) % 97
        src_p.append(pool.ctypes.data + s0)
        dst_p.append(out.ctypes.data + at + off)
        want.append((at + off, pool[s0:s0 + n]))
        at += off + n + 64
    args = [np.array(v, dtype=t) for v, t in ((src_p, np.uint64), (dst_p, np.uint64), (sizes, np.int64))]
    assert lib.strata_gather(threads, len(sizes), *(a.ctypes.data for a in args)) == 0
    mask = np.ones(out.size, bool)
    for o, piece in want:
        np.testing.assert_array_equal(out[o:o + piece.size], piece)
        mask[o:o + piece.size] = False
    assert not out[mask].any()  # nothing written outside the pieces
    bad = np.array([-1], np.int64)
    assert lib.strata_gather(1, 1, args[0].ctypes.data, args[1].ctypes.data, bad.ctypes.data) == 1


def test_gather_refuses_rows_that_do_not_match():
    lib = _native()
    src = [np.zeros((4, 16), np.uint8)] * 3
    with pytest.raises(ValueError, match="out of range"):
        gather_rows(lib, 1, [np.zeros((1, 16), np.uint8)] * 3, src, np.array([4]))
    with pytest.raises(ValueError, match="rows must match"):
        gather_rows(lib, 1, [np.zeros((1, 8), np.uint8)] * 3, src, np.array([1]))


def test_tier_host_gathers_then_copies_each_projection_between_two_events(monkeypatch):
    """TierHost._copy_pcie with the driver faked: the step's experts, gathered into the group's staging (on the
    serving thread, before the pool), land in the group's device slots in plan order,
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
    t = types.SimpleNamespace(ring_stage=StagingRing(2, [Q * 40] * 3, FakePinned), G=2,
                              steps=StepRange(0, 1),
                              expert_src=[src], copy_stream=types.SimpleNamespace(ptr=0), buf=slots,
                              words=types.SimpleNamespace(device=np.zeros(8, np.uint32)))
    host = tier_host.TierHost.__new__(tier_host.TierHost)
    host.t, host.stats, host._events, host._timed_copies = t, {"gather_ms": 0.0}, [], []
    ids = np.array([[4, 1], [1, 5]])
    plan = plan_step(ids, np.full(E, -1, np.int32), 1.0)
    staged = t.ring_stage.gather(1, src, plan.pcie.experts.astype(np.intp))
    host._copy_pcie(0, 1, staged, want=7)
    experts = plan.pcie.experts.tolist()
    assert sorted(experts) == [1, 4, 5]
    for p in range(3):
        n = src[p].shape[1]
        np.testing.assert_array_equal(device[f"tier_stage.1.{p}"][:3 * n].reshape(3, n), src[p][experts])
        assert not device[f"tier_stage.0.{p}"].any()  # the other group's slots are untouched
    assert log == [("event",), ("copy", 72), ("copy", 72), ("copy", 120), ("event",), ("flagB", 7)]
    assert len(host._events) == 2 and host._copy_ms() == 1.5 and host._timed_copies == []
    t.ring_stage.close()


def test_gather_team_is_sized_by_the_bytes(monkeypatch):
    """A gather takes ceil(bytes / GATHER_BYTES_PER_THREAD) threads of the team offered, at least 1, at most the
    team; gather_rows hands that count to strata_gather (size_by_bytes=False: the count given)."""
    from strata_cli.tiers import gather as g

    per = g.GATHER_BYTES_PER_THREAD
    assert [g.gather_threads(16, n) for n in (0, 1, per, per + 1, 4 * per, 100 * per)] == [1, 1, 1, 2, 4, 16]
    assert g.gather_threads(3, 100 * per) == 3
    seen = []

    class Lib:
        def strata_gather(self, threads, n, src, dst, nbytes):
            seen.append(threads)
            return 0

    srcs = [np.zeros((8, per), np.uint8) for _ in range(3)]
    outs = [np.zeros((2, per), np.uint8) for _ in range(3)]
    g.gather_rows(Lib(), 16, outs, srcs, np.array([1, 5]))  # 6 x per bytes
    g.gather_rows(Lib(), 16, outs, srcs, np.array([1, 5]), size_by_bytes=False)
    assert seen == [6, 16]
