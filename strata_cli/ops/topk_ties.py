"""Which of several equal scores a top-k keeps, the way transformers' oracle (torch's CPU topk) keeps them.

QSA block scores are sums of relu'd dot products, so exact ties (zeros) are common, and which tied block
survives changes the logits by up to ~0.2. torch's CPU topk selects with libstdc++'s nth_element
(introselect) when k*64 > n, else partial_sort (heap select); the kept set among ties is whatever those
algorithms leave in the first k slots. This module replays them on (value, index) pairs. Unambiguous
cases (no tie straddling the k-th place) skip the replay.
"""

from __future__ import annotations

import numpy as np


def _greater(a, b) -> bool:
    return a[0] > b[0]


def _adjust_heap(q, first, hole, length, value):
    top = hole
    child = hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if _greater(q[first + child], q[first + child - 1]):
            child -= 1
        q[first + hole] = q[first + child]
        hole = child
    if length % 2 == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        q[first + hole] = q[first + child - 1]
        hole = child - 1
    parent = (hole - 1) // 2
    while hole > top and _greater(q[first + parent], value):
        q[first + hole] = q[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    q[first + hole] = value


def _heap_select(q, first, middle, last):
    length = middle - first
    if length >= 2:
        parent = (length - 2) // 2
        while True:
            _adjust_heap(q, first, parent, length, q[first + parent])
            if parent == 0:
                break
            parent -= 1
    for i in range(middle, last):
        if _greater(q[i], q[first]):
            value = q[i]
            q[i] = q[first]
            _adjust_heap(q, first, 0, length, value)


def _insertion_sort(q, first, last):
    for i in range(first + 1, last):
        val = q[i]
        if _greater(val, q[first]):
            q[first + 1:i + 1] = q[first:i]
            q[first] = val
        else:
            j = i
            while _greater(val, q[j - 1]):
                q[j] = q[j - 1]
                j -= 1
            q[j] = val


def _median_to_first(q, result, a, b, c):
    """Swap the median of q[a], q[b], q[c] into q[result]: of the pair (a, b) ordered as hi, lo, the median is lo
    when lo beats c, else c when hi beats c, else hi (the branches of std::__move_median_to_first)."""
    hi, lo = (a, b) if _greater(q[a], q[b]) else (b, a)
    if _greater(q[lo], q[c]):
        pick = lo
    elif _greater(q[hi], q[c]):
        pick = c
    else:
        pick = hi
    q[result], q[pick] = q[pick], q[result]


def _partition(q, first, last, pivot):
    while True:
        while _greater(q[first], q[pivot]):
            first += 1
        last -= 1
        while _greater(q[pivot], q[last]):
            last -= 1
        if not first < last:
            return first
        q[first], q[last] = q[last], q[first]
        first += 1


def _nth_element(q, nth):
    first, last = 0, len(q)
    depth = 2 * (int(last).bit_length() - 1)
    while last - first > 3:
        if depth == 0:
            _heap_select(q, first, nth + 1, last)
            q[first], q[nth] = q[nth], q[first]
            return
        depth -= 1
        mid = first + (last - first) // 2
        _median_to_first(q, first, first + 1, mid, last - 1)
        cut = _partition(q, first + 1, last, first)
        if cut <= nth:
            first = cut
        else:
            last = cut
    _insertion_sort(q, first, last)


def torch_topk_set(values: np.ndarray, k: int) -> np.ndarray:
    """Indices (ascending) of the k entries torch.topk(values, k) returns on the CPU."""
    values = np.asarray(values, dtype=np.float32)
    n = values.size
    if k >= n:
        return np.arange(n)
    if k <= 0:
        return np.arange(0)
    part = np.partition(values, n - k)
    kth = part[n - k]
    above = np.count_nonzero(values > kth)
    if above + np.count_nonzero(values == kth) == k:     # no tie straddles the cut
        return np.nonzero(values >= kth)[0]
    q = [(float(v), i) for i, v in enumerate(values)]
    if k * 64 <= n:
        _heap_select(q, 0, k, n)
    else:
        _nth_element(q, k - 1)
    return np.sort(np.array([i for _, i in q[:k]], dtype=np.int64))
