"""kernels/embed.cu (launch_embed.gather_rows) against strata_cli/ops/embed.py on every supported table type, and
the window-start kernels of hyper.cu and sampling.cu that the engine tests reach only through whole windows:
broadcast_streams and sample_rows (skipped without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

import gpu_seq as G
from strata_cli.model import quants
from strata_cli.ops import embed, hyper, sampling

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("ggml_type,row_len", [(quants.F32, 24), (quants.F16, 24), (quants.BF16, 24),
                                               (quants.Q8_0, 64)])
def test_gather_rows_bit_exact(ggml_type, row_len):
    from strata_cli.gpu import launch_embed

    cp = G.cupy()
    rng = np.random.default_rng(ggml_type)
    table = G.f32(rng, 50, row_len)
    table[3, :4] = [1e-6, -3e-8, 6e-5, 0.0]  # f16 subnormals
    raw = quants.quantize(table, ggml_type)
    rows = rng.integers(0, 50, (7, 5)).astype(np.int64)
    rows[0, 0] = 3
    want = quants.dequantize(raw[rows.reshape(-1)], ggml_type).reshape(7, -1)
    np.testing.assert_array_equal(embed.gather_rows(rows, raw, ggml_type, row_len), want)  # the reference itself
    got = launch_embed.gather_rows(cp.asarray(rows), cp.asarray(raw), ggml_type, row_len,
                                   out=G.nan_out((7, 5 * row_len)))
    G.exact(got, want, f"{quants.TYPE_NAMES[ggml_type]} rows")


@pytest.mark.parametrize("T,C,D", [(1, 4, 40), (7, 3, 33), (16, 4, 257)])
def test_broadcast_streams_copies_every_stream(T, C, D):
    from strata_cli.gpu import launch_hyper

    cp = G.cupy()
    emb = G.f32(np.random.default_rng(T + C + D), T, D)
    got = launch_hyper.broadcast_streams(cp.asarray(emb), C, out=G.nan_out((T, C, D)))
    G.exact(got, hyper.broadcast_streams(emb, C), "R")


@pytest.mark.parametrize("T,V", [(1, 7), (5, 300), (16, 4099)])
def test_sample_rows_draws_the_numpy_numbers(T, V):
    from strata_cli.gpu import launch_sampling

    cp = G.cupy()
    rng = np.random.default_rng(T * V)
    logits = G.f32(rng, T, V, scale=3.0)
    positions = (1000 + rng.permutation(T) * 3).astype(np.int32)  # absolute positions key the draws
    for temperature, seed in [(0.7, 1), (1.5, 2**40 + 3)]:
        got = launch_sampling.sample_rows(cp.asarray(logits), cp.asarray(positions), temperature, seed,
                                          out=G.nan_out((T,), np.int32))
        G.exact(got, sampling.sample_rows(logits, positions, temperature, seed), f"T={temperature} seed={seed}")
    with pytest.raises(ValueError, match=r"^temperature"):
        launch_sampling.sample_rows(cp.asarray(logits), cp.asarray(positions), 0.0, 1)
