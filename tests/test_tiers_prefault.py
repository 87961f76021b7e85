"""tiers/prefault.py: which spans are brought in at load (the non-resident experts' bytes, page-rounded, in pieces)
and that each piece is advised, or touched where MADV_POPULATE_READ is refused."""

import mmap

import numpy as np

from strata_cli.tiers import prefault as pf

PAGE = 4096


class FakeInfo:
    def __init__(self, raw):
        self.raw, self.n_bytes = raw, raw.nbytes


class FakeModel:
    def __init__(self, L, E, per):
        self.arrays = {f"blk.{l}.{r}.weight": np.zeros((E, per), np.uint8) for l in range(L) for r in pf.EXPERT_ROLES}

    def info(self, name):
        return FakeInfo(self.arrays[name])


def test_spans_are_the_non_resident_experts_with_adjacent_ones_merged():
    model = FakeModel(2, 6, 100)
    table = np.array([[0, -1, -1, 1, -1, 2], [0, 1, 2, 3, 4, 5]], dtype=np.int32)
    spans = pf.expert_spans(model, table)
    want = []
    for role in pf.EXPERT_ROLES:
        base = model.arrays[f"blk.0.{role}.weight"].ctypes.data
        want += [(base + 100, 200), (base + 400, 100)]
    assert spans == want  # layer 1 is all resident: nothing of it


def test_pieces_are_page_aligned_cover_each_page_once_and_are_bounded():
    spans = [(10 * PAGE + 5, 10), (PAGE + 100, 50), (PAGE + 200, 3 * PAGE), (20 * PAGE, 0)]
    pieces = pf.page_pieces(spans, PAGE, piece=2 * PAGE)
    assert pieces == [(PAGE, 2 * PAGE), (3 * PAGE, 2 * PAGE), (10 * PAGE, PAGE)]
    assert pf.page_pieces([], PAGE) == []


def test_each_piece_is_populated_or_else_advised_and_touched():
    calls, touched = [], []

    def refuse_populate(start, nbytes, advice):
        calls.append((start, nbytes, advice))
        return advice != pf.MADV_POPULATE_READ

    pieces = [(PAGE, 2 * PAGE), (8 * PAGE, PAGE)]
    seen = []
    ways = pf.prefault(pieces, lambda d, t: seen.append((d, t)), threads=2, advise=refuse_populate,
                       toucher=lambda a, n: touched.append((a, n)))
    assert ways == {"populate": 0, "touch": 3 * PAGE}
    assert sorted(touched) == pieces
    assert sorted(calls) == sorted([(a, n, adv) for a, n in pieces for adv in (pf.MADV_POPULATE_READ,
                                                                             pf.MADV_WILLNEED)])
    assert seen[-1] == (3 * PAGE, 3 * PAGE)
    assert pf.prefault(pieces, advise=lambda *a: True, toucher=None) == {"populate": 3 * PAGE, "touch": 0}


def test_real_madvise_and_touch_on_an_anonymous_mapping():
    buf = mmap.mmap(-1, 4 * mmap.PAGESIZE)
    addr = np.frombuffer(buf, dtype=np.uint8).ctypes.data
    pf.touch(addr, 4 * mmap.PAGESIZE)
    assert pf.madvise(addr, 4 * mmap.PAGESIZE, pf.MADV_WILLNEED)
    assert pf.bring_in(addr, 4 * mmap.PAGESIZE) in ("populate", "touch")
