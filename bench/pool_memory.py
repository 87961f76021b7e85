"""Memory for bench/pool_bench.py: where the synthetic experts live (the page kind is one of the things measured),
what the host's caches and huge pages are, and how busy the rest of the host is.

Page kinds of an Arena (one region holding every expert of a type):
  anon  numpy's own allocation (numpy >= 1.21 asks for transparent huge pages on large arrays: 2 MB pages where the
        kernel's THP mode is "madvise" or "always")
  huge  an anonymous private mapping with MADV_HUGEPAGE before the first touch (2 MB pages where THP is not "never")
  4k    the same with MADV_NOHUGEPAGE: 4 KB pages, one TLB entry per 4 KB of weights
  file  a file in --file-dir written, synced and mapped read-only, the way the engine maps the GGUF (np.memmap mode
        "r"): page-cache pages, 4 KB unless the kernel maps large folios of that file system
"""

from __future__ import annotations

import mmap
import os
import re
import tempfile

import numpy as np

from strata_cli.tiers import prefault

PAGES = ("anon", "huge", "4k", "file")
MADV_HUGEPAGE, MADV_NOHUGEPAGE = 14, 15
HUGE = 2 << 20
ALIGN = 4096  # tensors start on a page (the GGUF aligns to 32 bytes; a page keeps the kinds comparable)


def l3_bytes() -> int:
    """The last-level cache of cpu0 in bytes (sysfs, else sysconf), 0 if neither says."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(base)):
            path = os.path.join(base, index)
            if open(os.path.join(path, "level")).read().strip() == "3":
                size = open(os.path.join(path, "size")).read().strip()
                unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
                return int(size.rstrip("KMG")) * unit
    except (OSError, ValueError):
        pass
    try:
        return max(int(os.sysconf("SC_LEVEL3_CACHE_SIZE")), 0)
    except (ValueError, OSError):
        return 0


def thp_modes() -> dict[str, str]:
    """The kernel's transparent huge page settings ("enabled", "defrag", "shmem_enabled": the bracketed choice)."""
    out = {}
    for name in ("enabled", "defrag", "shmem_enabled"):
        try:
            text = open(f"/sys/kernel/mm/transparent_hugepage/{name}").read()
            found = re.search(r"\[(\S+)\]", text)
            out[name] = found.group(1) if found else text.strip()
        except OSError:
            out[name] = "?"
    return out


def page_stats(lo: int, hi: int) -> dict[str, int]:
    """kB of Rss, AnonHugePages, FilePmdMapped and ShmemPmdMapped over the mappings (/proc/self/smaps) that
    overlap [lo, hi)."""
    fields = {"Rss": 0, "AnonHugePages": 0, "FilePmdMapped": 0, "ShmemPmdMapped": 0}
    take = False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
                if head:
                    a, b = int(head.group(1), 16), int(head.group(2), 16)
                    take = a < hi and b > lo
                elif take:
                    key, _, rest = line.partition(":")
                    if key in fields:
                        fields[key] += int(rest.split()[0])
    except OSError:
        pass
    return fields


def fs_type(path: str) -> str:
    """The file system of path (/proc/mounts, longest mount point that holds it)."""
    path, best, kind = os.path.realpath(path), "", "?"
    try:
        for line in open("/proc/mounts"):
            parts = line.split()
            if len(parts) > 2 and (path == parts[1] or path.startswith(parts[1].rstrip("/") + "/")) \
                    and len(parts[1]) >= len(best):
                best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


class HostLoad:
    """CPU time the rest of the host spent between two marks, in cores (from /proc/stat, minus this process's own),
    and the steal time in it (a virtual machine's CPUs taken by the hypervisor for others)."""

    def __init__(self):
        self.hz = os.sysconf("SC_CLK_TCK")

    def mark(self) -> tuple[float, float, float]:
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
            busy, steal = (sum(v) - v[3] - v[4]) / self.hz, v[7] / self.hz
        except (OSError, ValueError, IndexError):
            busy = steal = float("nan")
        t = os.times()
        return busy, t.user + t.system, steal

    @staticmethod
    def foreign_cores(start, end, wall: float) -> float:
        return max(0.0, (end[0] - start[0]) - (end[1] - start[1])) / wall if wall > 0 else float("nan")

    @staticmethod
    def steal_cores(start, end, wall: float) -> float:
        return (end[2] - start[2]) / wall if wall > 0 else float("nan")


class Arena:
    """One region of `nbytes` for tensors placed at page-aligned offsets (place), filled through writable views
    (view before seal), then sealed: the file kind is synced and mapped again read-only; every kind's pages are
    brought in (no first-touch faults in a timed call)."""

    def __init__(self, nbytes: int, pages: str, file_dir: str | None = None):
        if pages not in PAGES:
            raise ValueError(f"pages {pages!r}: one of {', '.join(PAGES)}")
        self.pages, self.nbytes, self.used, self.path, self._map = pages, nbytes, 0, None, None
        if pages == "anon":
            self.base = np.empty(nbytes, np.uint8)
        elif pages in ("huge", "4k"):
            self._map = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE)
            whole = np.frombuffer(self._map, np.uint8)
            off = -whole.ctypes.data % HUGE  # 2 MB aligned, so that a huge page can back the first bytes
            self.base = whole[off:off + nbytes]
            span = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
            prefault.madvise(self.base.ctypes.data, span, MADV_HUGEPAGE if pages == "huge" else MADV_NOHUGEPAGE)
        else:
            fd, self.path = tempfile.mkstemp(dir=file_dir, prefix="pool_bench-", suffix=".experts")
            os.ftruncate(fd, nbytes)
            os.close(fd)
            self.base = np.memmap(self.path, np.uint8, mode="r+", shape=(nbytes,))

    def place(self, nbytes: int) -> int:
        """The offset of the next tensor of nbytes."""
        at = -(-self.used // ALIGN) * ALIGN
        if at + nbytes > self.nbytes:
            raise ValueError(f"arena of {self.nbytes} bytes: no room for {nbytes} more at {at}")
        self.used = at + nbytes
        return at

    def view(self, offset: int, shape: tuple, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        n = int(np.prod(shape)) * dtype.itemsize
        return self.base[offset:offset + n].view(dtype).reshape(shape)

    def seal(self) -> None:
        if self.pages == "file":
            self.base.flush()  # msync: no dirty pages left to write back while the pool is timed
            del self.base
            self.base = np.memmap(self.path, np.uint8, mode="r", shape=(self.nbytes,))
        for start, n in prefault.page_pieces([(self.base.ctypes.data, self.nbytes)]):
            prefault.bring_in(start, n)

    def huge_fraction(self) -> tuple[float, dict]:
        """The share of the arena's resident bytes on 2 MB pages (anonymous or file), and the raw kB."""
        lo = self.base.ctypes.data
        st = page_stats(lo, lo + self.nbytes)
        huge = st["AnonHugePages"] + st["FilePmdMapped"] + st["ShmemPmdMapped"]
        return (huge / st["Rss"] if st["Rss"] else 0.0), st

    def close(self) -> None:
        self.base = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still alive somewhere: the mapping goes with it
                pass
        if self.path:
            os.unlink(self.path)
            self.path = None
