"""PLE n-gram hash constants, derived the way transformers' Qwen4-Exp derives them.

The multipliers and per-head table sizes are not learned: transformers rebuilds them from the config
(vocab size, n-gram vocab base, hash seed), and the converter copies them into `qwen4exp.ple.*`.
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # splitmix64 increment
MIX_1 = 0xBF58476D1CE4E5B9
MIX_2 = 0x94D049BB133111EB
LAYER_SEED_STRIDE = 10007  # seed offset per PLE layer index


def splitmix64(value: int) -> int:
    """One splitmix64 finalisation step on a 64-bit value."""
    z = (value + GOLDEN_GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * MIX_1) & MASK64
    z = ((z ^ (z >> 27)) * MIX_2) & MASK64
    return z ^ (z >> 31)


def layer_multipliers(vocab_size: int, ngram_size: int, ple_index: int, seed: int) -> list[int]:
    """Odd multipliers, bounded so token_id * multiplier stays below 2**63 for every token."""
    bound = max(1, ((1 << 63) - 1) // max(vocab_size, 1) // 2)
    base = seed + LAYER_SEED_STRIDE * ple_index
    return [2 * (splitmix64((base + GOLDEN_GAMMA * (i + 1)) & MASK64) % bound) + 1 for i in range(ngram_size)]


# Miller-Rabin with these bases is exact for every n < 3.3e24 (Sorenson & Webster), far past any table size
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
_MR_EXACT_BELOW = 3_317_044_064_679_887_385_961_981


def _is_prime(n: int) -> bool:
    """Exact primality, in microseconds even for 64-bit n (trial division of 1e18 would take hours)."""
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    if n >= _MR_EXACT_BELOW:
        raise ValueError(f"{n}: too large for the exact primality test")
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def head_vocab_sizes(base: int, n_heads: int, ple_index: int = 0) -> list[int]:
    """Head h of PLE layer k gets the (k * n_heads + h + 1)-th prime >= base (primes after base - 1)."""
    sizes, candidate, skip = [], base - 1, ple_index * n_heads
    while len(sizes) < n_heads:
        candidate += 1
        if _is_prime(candidate):
            if skip:
                skip -= 1
            else:
                sizes.append(candidate)
    return sizes


def head_offsets(sizes: list[int]) -> list[int]:
    offsets, running = [], 0
    for size in sizes:
        offsets.append(running)
        running += size
    return offsets


def padded_rows(sizes: list[int], multiple: int = 128) -> int:
    """Rows of the stored table: transformers pads the n-gram vocabulary up to a multiple of 128."""
    total = sum(sizes)
    return -(-total // multiple) * multiple
