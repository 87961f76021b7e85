"""How fast the host answers a doorbell: ring -> the server's wait returns -> its answer is seen, in microseconds.

    python3 bench/doorbell_bench.py [--rings 2000]

Two threads share two 32-bit words as the GPU and the host do (plain memory here, mapped pinned memory on the GPU).
The "GPU" thread stores ring k into `seq` and waits for `flag` >= k; the server thread waits for `seq` >= k
(tiers/doorbell.py wait_word: a pause-spin in C without the GIL, 2 ms slices) and raises `flag` to k. The round
trip (store -> answer seen) is timed on the ringing thread with perf_counter_ns; a real ring adds the PCIe write
and the GPU's own wait (2-13 us).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np

from strata_cli.tiers import native
from strata_cli.tiers.doorbell import wait_word


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rings", type=int, default=2000)
    args = ap.parse_args()
    words = np.zeros(32, dtype=np.uint32)  # seq and flag on different cache lines, as in the staging
    seq, flag = words[0:1], words[16:17]
    backend = "C spin (no GIL)" if native.load() is not None else "numpy + sleep(20 us)"

    def server():
        for k in range(1, args.rings + 1):
            while wait_word(seq, k, 0.002) < k:
                pass
            flag[0] = k  # a plain store, as the engine's host raises its flags

    thread = threading.Thread(target=server, daemon=True)
    thread.start()
    rtt = []
    for k in range(1, args.rings + 1):
        t0 = time.perf_counter_ns()
        seq[0] = k
        while wait_word(flag, k, 0.002) < k:
            pass
        rtt.append((time.perf_counter_ns() - t0) / 1e3)
    thread.join()
    rtt = rtt[len(rtt) // 10:]  # warm-up
    q = np.percentile(rtt, [50, 90, 99])
    print(f"doorbell round trip ({backend}, {len(rtt)} rings): median {q[0]:.1f} us, p90 {q[1]:.1f} us, "
          f"p99 {q[2]:.1f} us, mean {statistics.fmean(rtt):.1f} us")


if __name__ == "__main__":
    main()
