// topk_replay.cuh: the single-thread replay of torch's CPU topk selection (libstdc++ nth_element / partial_sort
// heap select) on (key, index) pairs, ported from strata_cli/ops/topk_ties.py function by function. It decides
// which of several equal scores survive when a tie straddles the k-th place; the order the algorithms leave in
// the first k slots is all that matters, so every comparison and move follows the Python exactly.
//
// Keys are order-preserving uint32 images of the float scores (see order_key in qsa_select.cu): "greater" is an
// unsigned compare, exact for denormals and with -0 == +0, whatever -ftz does to float compares.
// Self-contained (no CUDA headers) so tests can also build it for the host with __device__ defined away.
#pragma once

struct TkPair {
    unsigned key;
    int idx;
};

// The pair array q[0..n) as two parallel arrays in global scratch.
struct TkPairs {
    unsigned* key;
    int* idx;
    __device__ TkPair get(int i) const { return TkPair{key[i], idx[i]}; }
    __device__ void put(int i, TkPair v) const { key[i] = v.key; idx[i] = v.idx; }
    __device__ void swap(int a, int b) const {
        const TkPair t = get(a);
        put(a, get(b));
        put(b, t);
    }
    __device__ bool greater(int a, int b) const { return key[a] > key[b]; }
};

// Indices below are non-negative wherever Python's floor division and C's truncation could differ, except
// (hole - 1) / 2 at hole 0, which is never used: the loop condition hole > top fails first.
__device__ void tk_adjust_heap(const TkPairs& q, int first, int hole, int length, TkPair value) {
    const int top = hole;
    int child = hole;
    while (child < (length - 1) / 2) {
        child = 2 * (child + 1);
        if (q.greater(first + child, first + child - 1)) child -= 1;
        q.put(first + hole, q.get(first + child));
        hole = child;
    }
    if (length % 2 == 0 && child == (length - 2) / 2) {
        child = 2 * (child + 1);
        q.put(first + hole, q.get(first + child - 1));
        hole = child - 1;
    }
    int parent = (hole - 1) / 2;
    while (hole > top && q.key[first + parent] > value.key) {
        q.put(first + hole, q.get(first + parent));
        hole = parent;
        parent = (hole - 1) / 2;
    }
    q.put(first + hole, value);
}

__device__ void tk_heap_select(const TkPairs& q, int first, int middle, int last) {
    const int length = middle - first;
    if (length >= 2) {
        for (int parent = (length - 2) / 2;; --parent) {
            tk_adjust_heap(q, first, parent, length, q.get(first + parent));
            if (parent == 0) break;
        }
    }
    for (int i = middle; i < last; ++i) {
        if (q.greater(i, first)) {
            const TkPair value = q.get(i);
            q.put(i, q.get(first));
            tk_adjust_heap(q, first, 0, length, value);
        }
    }
}

__device__ void tk_insertion_sort(const TkPairs& q, int first, int last) {
    for (int i = first + 1; i < last; ++i) {
        const TkPair val = q.get(i);
        if (val.key > q.key[first]) {
            for (int j = i; j > first; --j) q.put(j, q.get(j - 1));
            q.put(first, val);
        } else {
            int j = i;
            while (val.key > q.key[j - 1]) {
                q.put(j, q.get(j - 1));
                j -= 1;
            }
            q.put(j, val);
        }
    }
}

__device__ void tk_median_to_first(const TkPairs& q, int result, int a, int b, int c) {
    int pick;
    if (q.greater(a, b)) {
        if (q.greater(b, c)) pick = b;
        else if (q.greater(a, c)) pick = c;
        else pick = a;
    } else if (q.greater(a, c)) {
        pick = a;
    } else if (q.greater(b, c)) {
        pick = c;
    } else {
        pick = b;
    }
    q.swap(result, pick);
}

__device__ int tk_partition(const TkPairs& q, int first, int last, int pivot) {
    while (true) {
        while (q.greater(first, pivot)) first += 1;
        last -= 1;
        while (q.greater(pivot, last)) last -= 1;
        if (!(first < last)) return first;
        q.swap(first, last);
        first += 1;
    }
}

__device__ void tk_nth_element(const TkPairs& q, int n, int nth) {
    int first = 0, last = n;
    int bits = 0;  // Python's int.bit_length(n)
    for (unsigned x = (unsigned)n; x; x >>= 1) bits += 1;
    int depth = 2 * (bits - 1);
    while (last - first > 3) {
        if (depth == 0) {
            tk_heap_select(q, first, nth + 1, last);
            q.swap(first, nth);
            return;
        }
        depth -= 1;
        const int mid = first + (last - first) / 2;
        tk_median_to_first(q, first, first + 1, mid, last - 1);
        const int cut = tk_partition(q, first + 1, last, first);
        if (cut <= nth) first = cut;
        else last = cut;
    }
    tk_insertion_sort(q, first, last);
}

// After this, q[0..k) holds the pairs torch.topk(values, k) keeps (0 < k < n): heap select when k*64 <= n,
// else introselect for the k-th place, exactly as torch_topk_set in topk_ties.py.
__device__ void tk_replay(const TkPairs& q, int n, int k) {
    if ((long long)k * 64 <= n) tk_heap_select(q, 0, k, n);
    else tk_nth_element(q, n, k - 1);
}
