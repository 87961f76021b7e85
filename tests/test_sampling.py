"""Temperature sampling: Philox4x32-10 against the published known answers, Gumbel-max keyed by absolute
position, and draws that do not depend on how windows cut the sequence (numpy engine; the GPU engine's draws are
checked against these in test_gpu_engine.py)."""

from __future__ import annotations

import numpy as np
import pytest
from random_models import random_preset, write_random
from spec_windows import draws_whole_and_cut

from strata_cli.engine.reference import ReferenceEngine
from strata_cli.ops.sampling import gumbel, philox4x32, philox4x32_10, sample_rows

# Random123's kat_vectors for philox4x32 with 10 rounds: counter words c0..c3, key words k0 k1, then the four output
# words. Source: the kat_vectors file of the Random123 distribution (D. E. Shaw Research), as reproduced in
# github.com/DEShawResearch/fs123, core123/ut/ut_philox.cpp (test_kat_philox4x32, philox<4, uint32_t, 10>).
KAT_PHILOX4X32_10 = [
    ("00000000 00000000 00000000 00000000", "00000000 00000000", "6627e8d5 e169c58d bc57ac4c 9b00dbd8"),
    ("ffffffff ffffffff ffffffff ffffffff", "ffffffff ffffffff", "408f276d 41c83b0e a20bc7c6 6d5451fd"),
    ("243f6a88 85a308d3 13198a2e 03707344", "a4093822 299f31d0", "d16cfe09 94fdcceb 5001e420 24126ea1"),
]


def _words(text: str) -> list[int]:
    return [int(w, 16) for w in text.split()]


@pytest.mark.parametrize("counter, key, want", KAT_PHILOX4X32_10)
def test_philox4x32_10_known_answers(counter, key, want):
    k0, k1 = _words(key)
    got = philox4x32_10(*_words(counter), key=k0 | (k1 << 32))
    assert [int(w) for w in got] == _words(want)


def test_first_word_and_vectorised_counters():
    """philox4x32 is word 0 with counters (c0, c1, 0, 0); the vectorised draw equals one draw per counter."""
    c0 = np.array([0, 1, 7, 0xFFFFFFFF], dtype=np.uint32)
    c1 = np.array([0, 9, 3, 0x12345678], dtype=np.uint32)
    key = (5 << 32) | 11
    got = philox4x32(c0, c1, key)
    for i in range(len(c0)):
        assert int(got[i]) == int(philox4x32_10(int(c0[i]), int(c1[i]), 0, 0, key)[0])
    assert int(philox4x32(np.zeros(1, np.uint32), np.zeros(1, np.uint32), 0)[0]) == 0x6627E8D5


def test_gumbel_is_keyed_by_token_position_and_seed():
    """gumbel(seed, pos, V)[v] = -log(-log((philox(v, pos; seed) + 1/2) / 2^32))."""
    V, pos, seed = 37, 1234, (3 << 40) + 17
    bits = np.array([int(philox4x32_10(v, pos, 0, 0, seed)[0]) for v in range(V)], dtype=np.float64)
    np.testing.assert_array_equal(gumbel(seed, pos, V), -np.log(-np.log((bits + 0.5) / 2 ** 32)))
    assert not np.array_equal(gumbel(seed, pos, V), gumbel(seed, pos + 1, V))
    assert not np.array_equal(gumbel(seed, pos, V), gumbel(seed + 1, pos, V))


def test_sample_rows_is_gumbel_max_at_each_absolute_position():
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((5, 50)).astype(np.float32)
    positions = np.array([40, 41, 42, 43, 44])
    got = sample_rows(logits, positions, 0.8, 99)
    for t, pos in enumerate(positions):
        assert got[t] == np.argmax(logits[t].astype(np.float64) / 0.8 + gumbel(99, int(pos), 50))
    np.testing.assert_array_equal(sample_rows(logits, positions, 0.0, 99), logits.argmax(1))
    # the same row at another position draws other noise (hot enough that the noise decides)
    hot = [sample_rows(logits[:1], np.array([p]), 50.0, 99)[0] for p in range(40, 60)]
    assert len(set(hot)) > 1


@pytest.fixture(scope="module")
def engine_and_tokens(tmp_path_factory):
    rng = np.random.default_rng(70)
    model = write_random(tmp_path_factory.mktemp("sampling"), random_preset(rng), 70)
    return ReferenceEngine(model, n_ctx=64), rng.integers(0, model.geometry.n_vocab, 24)


@pytest.mark.parametrize("temperature, seed", [(0.7, 1), (1.5, 2 ** 40 + 3), (0.0, 5)])
def test_engine_draws_do_not_depend_on_the_window_cut(engine_and_tokens, temperature, seed):
    """Rows 6..17 sampled from one window or from three windows of other sizes: the same ids, each row's draw
    keyed by its absolute position (a draw keyed by the row in the window would differ)."""
    engine, tokens = engine_and_tokens
    engine.reset()
    engine.run(tokens[:6], 0)
    engine.commit(6)
    _, one, parts = draws_whole_and_cut(engine, tokens, temperature, seed)
    np.testing.assert_array_equal(parts, one)
