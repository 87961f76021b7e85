"""Bring the memory-mapped pages of the non-resident experts in at load, so that no window pays their first-touch
faults (#17: 540 ms at T = 1 on the full-size file before the pages were in, 65-75 ms after).

madvise(MADV_POPULATE_READ) (Linux 5.14+) faults a range in without copying it; where the kernel refuses it,
MADV_WILLNEED starts the reads and a touch pass (one byte per page) waits for them. The spans are cut into pieces that
a few threads advise at once (ctypes releases the GIL), with a bar on a terminal and the time on stderr.

The line says what was checked, not only what was asked: the growth of the process's file-backed resident set
(RssFile in /proc/self/status: the pages now mapped in its page tables) and the share of the pieces' pages in the page
cache afterwards (mincore). Both matter: a populate of pages already cached takes milliseconds (on the device's
kernel, 6.18 with ext4's large folios, 2 GiB in 1.3 ms here: a fault maps a whole folio, not one 4 KB page), which
is why 45.70 GiB "in 0.0 s" was true; a page not cached is a read from disk at the next touch, and one not mapped a
minor fault.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .residency import EXPERT_ROLES

MADV_WILLNEED = 3
MADV_POPULATE_READ = 22
PIECE_BYTES = 256 << 20
THREADS = 8


def expert_spans(model, table: np.ndarray, layers: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    """(address, nbytes) of the non-resident experts' bytes in the mapping (table [L, E] < 0) of layers [lo, hi)
    (a stage of the layer split: the other stages' experts are theirs to bring in; None: every layer), adjacent
    experts of a tensor merged into one span."""
    spans = []
    lo, hi = (0, table.shape[0]) if layers is None else layers
    for layer in range(lo, hi):
        miss = table[layer] < 0
        if not miss.any():
            continue
        # runs of consecutive missing experts: [start, stop)
        edges = np.flatnonzero(np.diff(np.concatenate([[0], miss.astype(np.int8), [0]])))
        runs = edges.reshape(-1, 2)
        for role in EXPERT_ROLES:
            info = model.info(f"blk.{layer}.{role}.weight")
            per = info.n_bytes // table.shape[1]
            base = info.raw.ctypes.data
            spans += [(base + int(a) * per, int(b - a) * per) for a, b in runs]
    return spans


def page_pieces(spans, page: int = mmap.PAGESIZE, piece: int = PIECE_BYTES) -> list[tuple[int, int]]:
    """Spans -> page-aligned (start, nbytes) pieces of at most `piece` bytes covering them once (spans that share or
    touch a page merge first; madvise takes whole pages)."""
    merged: list[list[int]] = []
    for addr, nbytes in sorted((int(a), int(n)) for a, n in spans if n > 0):
        lo, hi = addr // page * page, -(-(addr + nbytes) // page) * page
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    piece = max(page, piece // page * page)
    return [(a, min(piece, hi - a)) for lo, hi in merged for a in range(lo, hi, piece)]


def madvise(start: int, nbytes: int, advice: int) -> bool:
    """libc madvise; True when the kernel took it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(nbytes), advice) == 0


def touch(start: int, nbytes: int, page: int = mmap.PAGESIZE) -> None:
    """Read one byte per page of [start, start + nbytes) (each read faults its page in)."""
    pages = (ctypes.c_uint8 * nbytes).from_address(start)
    int(np.frombuffer(pages, dtype=np.uint8)[::page].sum())


def bring_in(start: int, nbytes: int, advise=madvise, toucher=touch) -> str:
    """One piece: 'populate' when MADV_POPULATE_READ did it, else 'touch' (WILLNEED, then the touch pass)."""
    if advise(start, nbytes, MADV_POPULATE_READ):
        return "populate"
    advise(start, nbytes, MADV_WILLNEED)
    toucher(start, nbytes)
    return "touch"


def prefault(pieces, progress=None, threads: int = THREADS, advise=madvise, toucher=touch) -> dict[str, int]:
    """Bring every piece in on `threads` threads; progress(done bytes, total bytes) after each. Returns the bytes
    per way ('populate' / 'touch')."""
    total = sum(n for _, n in pieces)
    done, ways = 0, {"populate": 0, "touch": 0}
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="strata-prefault") as pool:
        jobs = [(n, pool.submit(bring_in, a, n, advise, toucher)) for a, n in pieces]
        for n, job in jobs:
            ways[job.result()] += n
            done += n
            if progress is not None:
                progress(done, total)
    return ways


def resident_bytes(pieces, page: int = mmap.PAGESIZE) -> int | None:
    """Bytes of the page-aligned pieces whose pages are in the page cache now (mincore); None where the call is
    refused (not Linux, a piece not mapped)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "mincore"):
        return None
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    total = 0
    for start, nbytes in pieces:
        vec = np.zeros(-(-nbytes // page), dtype=np.uint8)
        if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(nbytes), ctypes.c_void_p(vec.ctypes.data)) != 0:
            return None
        total += int(np.count_nonzero(vec & 1)) * page
    return min(total, sum(n for _, n in pieces))


def rss_file_bytes(status: str = "/proc/self/status") -> int | None:
    """The process's file-backed resident set (RssFile, bytes); None where /proc does not say."""
    try:
        with open(status) as f:
            for line in f:
                if line.startswith("RssFile:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def summary(total: int, seconds: float, ways: dict[str, int], mapped: int | None, cached: int | None) -> str:
    """The one stderr line of a prefault: bytes, time, how, and what was checked afterwards."""
    gib = 2 ** 30
    how = "MADV_POPULATE_READ" if not ways["touch"] else \
        f"touch pass on {ways['touch'] / gib:.2f} GiB (no MADV_POPULATE_READ)"
    checks = []
    if mapped is not None:
        checks.append(f"RssFile +{mapped / gib:.2f} GiB")
    if cached is not None:
        checks.append(f"{100 * cached / max(total, 1):.1f}% in the page cache")
    return (f"expert pages in: {total / gib:.2f} GiB in {seconds:.2f} s ({how}"
            f"{'; ' + ', '.join(checks) if checks else ''})")


def prefault_experts(model, table: np.ndarray, layers: tuple[int, int] | None = None) -> None:
    """The engine's load step when a CPU or PCIe share exists: the non-resident experts' pages of its layers in, a
    bar on a terminal, one line with the time on stderr."""
    from ..report.present import err_console
    from ..report.progress import byte_progress

    pieces = page_pieces(expert_spans(model, table, layers))
    total = sum(n for _, n in pieces)
    if not total:
        return
    rss0 = rss_file_bytes()
    t0 = time.perf_counter()
    with byte_progress(f"bringing in {total / 2**30:.2f} GiB of non-resident expert pages") as progress:
        ways = prefault(pieces, progress, threads=min(THREADS, os.cpu_count() or 1))
    seconds = time.perf_counter() - t0
    rss1 = rss_file_bytes()
    mapped = rss1 - rss0 if rss0 is not None and rss1 is not None else None
    cached = resident_bytes(pieces)
    err_console().print(summary(total, seconds, ways, mapped, cached), style="dim", highlight=False, soft_wrap=True)
    if cached is not None and cached < 0.99 * total:
        from ..report.present import warn

        warn(f"only {100 * cached / total:.1f}% of the non-resident experts' pages stayed in the page cache (host "
             "memory short?): windows will read the rest from disk")
