"""tiers/stats.WindowHistory, the tier host's record of the windows it served: in the order served, the last
HISTORY_PER_T of each window size (a long run's host memory stays flat), read by verify-bench's means per T
(tier_means, with a verify-bench record of each size)."""

from __future__ import annotations

from strata_cli.tiers.stats import HISTORY_PER_T, WindowHistory


def _rows(history):
    return [(h["T"], h["i"]) for h in history]


def test_windows_in_the_order_served_across_sizes():
    history = WindowHistory()
    assert not history and len(history) == 0
    served = [(T, i) for i, T in enumerate([1, 4, 4, 1, 8, 4])]
    for T, i in served:
        history.append({"T": T, "i": i})
    assert _rows(history) == served and len(history) == 6 and history
    assert (history[-1]["T"], history[-1]["i"]) == (4, 5) and history[0]["i"] == 0 and history[-2]["i"] == 4
    history.clear()
    assert not history and list(history) == []


def test_each_size_keeps_its_last_windows_only():
    history = WindowHistory(per_t=3)
    for i in range(10):
        history.append({"T": 1, "i": i})
    history.append({"T": 8, "i": 10})
    for i in range(11, 13):
        history.append({"T": 1, "i": i})
    assert _rows(history) == [(1, 9), (8, 10), (1, 11), (1, 12)]
    assert len(history) == 4 and history[-1]["i"] == 12
    assert [h["i"] for h in history if h["T"] == 8] == [10]  # a bound per T: T = 8 is not pushed out


def test_the_default_bound_holds_a_long_run():
    history = WindowHistory()
    for i in range(HISTORY_PER_T + 500):
        history.append({"T": 4, "i": i})
    assert len(history) == HISTORY_PER_T and history[-1]["i"] == HISTORY_PER_T + 499
    assert next(iter(history))["i"] == 500


def test_tier_means_read_the_kept_windows_of_one_size():
    from types import SimpleNamespace

    import numpy as np

    from strata_cli.tiers.config import TierConfig
    from strata_cli.tiers.stats import tier_means

    history = WindowHistory(per_t=2)
    for i, (T, pool_ms) in enumerate([(4, 100.0), (1, 7.0), (4, 2.0), (4, 4.0)]):  # the first T = 4 pushed out
        history.append({"T": T, "pool_ms": pool_ms, "i": i})
    tiers = SimpleNamespace(cfg=TierConfig(cache="0"), stage_table=lambda: np.array([[-1]]))
    host = SimpleNamespace(history=history)
    assert tier_means(tiers, host, 4, 10, 10.0, None)["pool_ms"] == 3.0
    assert tier_means(tiers, host, 1, 10, 10.0, None)["pool_ms"] == 7.0 and tier_means(tiers, host, 8, 5, 1.0, None) is None
