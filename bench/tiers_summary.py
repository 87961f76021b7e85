"""The summary table of bench/tiers_fn8.sh: one row per (run, cache, T) from the verify-bench CSVs in a folder,
with issue 10's target for --expert-cache 0.

    python3 bench/tiers_summary.py FOLDER

target(T) = max(llama.cpp -ot exps=CPU / 2, 1.3 x floor); floor = the window's distinct routed-expert bytes off VRAM
(pcie_mb + cpu_mb) / (73 GB/s host read + 55 GB/s PCIe) + the all-resident window (RESIDENT_MS: verify-bench
--expert-cache all on the same file, f420ad6, H200). Rows of caches other than 0 show the target column empty.
"""

from __future__ import annotations

import csv
import pathlib
import sys

LLAMA_MS = {1: 11.5, 2: 19.2, 4: 29.9, 8: 53.8}
RESIDENT_MS = {1: 2.458, 2: 2.851, 4: 3.999, 8: 7.262}
FLOOR_GBS = 73.0 + 55.0
COLUMNS = ["run", "cache", "pcie", "split", "T", "ms", "target", "ok", "vram", "pcie_sh", "cpu_sh", "waitB", "waitF",
           "ring", "pool_ms", "pool_GB/s", "off_MB"]


def num(row: dict, key: str) -> float:
    try:
        return float(row.get(key) or "nan")
    except ValueError:
        return float("nan")


def rows_of(path: pathlib.Path):
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row.get("window", "").isdigit():
                yield row


def summary(folder: pathlib.Path) -> list[list[str]]:
    out = []
    for path in sorted(folder.glob("*.csv")):
        if path.stem == "profile":
            continue
        for row in rows_of(path):
            T = int(row["window"])
            ms = num(row, "ms_median")
            off_mb = num(row, "pcie_mb") + num(row, "cpu_mb")
            target = ""
            ok = ""
            if row.get("expert_cache") == "0" and T in LLAMA_MS and off_mb == off_mb:
                t = max(LLAMA_MS[T] / 2, 1.3 * (off_mb / FLOOR_GBS + RESIDENT_MS[T]))
                target, ok = f"{t:.2f}", "yes" if ms <= t else "no"
            out.append([path.stem, row.get("expert_cache", ""), row.get("pcie_frac", ""), row.get("split", ""),
                        str(T), f"{ms:.3f}", target, ok] +
                       [f"{num(row, k):.2f}" for k in ("vram_share", "pcie_share", "cpu_share")] +
                       [f"{num(row, k):.3f}" for k in ("wait_b_ms", "wait_flag_ms", "host_ring_ms", "pool_ms")] +
                       [f"{num(row, 'pool_gb_s'):.1f}", f"{off_mb:.0f}"])
    return out


def main() -> None:
    rows = summary(pathlib.Path(sys.argv[1]))
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(COLUMNS)]
    print("# summary (ms per window, median; target = issue 10 for --expert-cache 0)")
    for line in [COLUMNS] + rows:
        print("  ".join(v.rjust(w) for v, w in zip(line, widths)))


if __name__ == "__main__":
    main()
