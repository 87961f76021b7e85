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


def test_a_populated_file_mapping_is_checked_mapped_and_cached(tmp_path):
    """The line's checks on a real file mapping: after prefault its pages are in the page cache (mincore) and in
    this process's page tables (RssFile grew by about the mapped bytes; a few pages of slack for other mappings)."""
    n = 64 * mmap.PAGESIZE
    path = tmp_path / "experts.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8).tobytes())
    mapped = np.memmap(path, mode="r")
    pieces = pf.page_pieces([(mapped.ctypes.data, n)], piece=16 * mmap.PAGESIZE)
    assert len(pieces) == 4
    rss0 = pf.rss_file_bytes()
    ways = pf.prefault(pieces, threads=2)
    assert sum(ways.values()) == n
    assert pf.resident_bytes(pieces) == n
    if rss0 is not None:
        assert pf.rss_file_bytes() - rss0 >= n - 8 * mmap.PAGESIZE


def test_the_summary_line_says_how_and_what_was_checked():
    gib = 2 ** 30
    line = pf.summary(int(45.7 * gib), 0.031, {"populate": int(45.7 * gib), "touch": 0}, int(45.7 * gib),
                      int(45.7 * gib))
    assert line == ("expert pages in: 45.70 GiB in 0.03 s (MADV_POPULATE_READ; RssFile +45.70 GiB, 100.0% in the "
                    "page cache)")
    line = pf.summary(gib, 2.0, {"populate": 0, "touch": gib}, None, gib // 2)
    assert line == ("expert pages in: 1.00 GiB in 2.00 s (touch pass on 1.00 GiB (no MADV_POPULATE_READ); 50.0% in "
                    "the page cache)")
    assert pf.summary(gib, 1.0, {"populate": gib, "touch": 0}, None, None).endswith("(MADV_POPULATE_READ)")


def test_resident_bytes_refuses_an_unmapped_range():
    buf = mmap.mmap(-1, 2 * mmap.PAGESIZE)
    addr = np.frombuffer(buf, dtype=np.uint8).ctypes.data
    pf.touch(addr, 2 * mmap.PAGESIZE)
    assert pf.resident_bytes([(addr, 2 * mmap.PAGESIZE)]) == 2 * mmap.PAGESIZE
    del addr
    buf.close()
    assert pf.resident_bytes([(0, mmap.PAGESIZE)]) is None  # page 0 is never mapped: ENOMEM
