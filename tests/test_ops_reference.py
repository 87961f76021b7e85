"""Reference ops against transformers' own building blocks (the oracle), on odd shapes."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
qwen = pytest.importorskip("transformers.models.qwen4_exp.modeling_qwen4_exp")

from strata_cli.ops import gdn, hyper, moe, ple  # noqa: E402
from strata_cli.ops.topk_ties import torch_topk_set  # noqa: E402


def test_topk_tie_order_matches_torch_cpu():
    rng = np.random.default_rng(3)
    for trial in range(1500):
        n = int(rng.integers(1, 300))
        k = int(rng.integers(1, n + 1))
        v = np.where(rng.random(n) < rng.random(), 0.0, rng.random(n)).astype(np.float32)
        if trial % 4 == 0:
            v = np.round(v * 3).astype(np.float32)
        expect = np.sort(torch.from_numpy(v).topk(k, dim=0).indices.numpy())
        np.testing.assert_array_equal(torch_topk_set(v, k), expect, err_msg=f"n={n} k={k}")


@pytest.mark.parametrize("nk,ratio,dk,dv,T", [(1, 3, 8, 12, 5), (3, 2, 24, 40, 7), (2, 1, 16, 16, 1)])
def test_gdn_recurrence_matches_transformers(nk, ratio, dk, dv, T):
    """Our value head h (tiled order) reads key head h % nk; transformers' grouped head m*ratio+j reads m."""
    rng = np.random.default_rng(nk * 100 + T)
    nv = nk * ratio
    q = rng.standard_normal((T, nk, dk)).astype(np.float32)
    k = rng.standard_normal((T, nk, dk)).astype(np.float32)
    v = rng.standard_normal((T, nv, dv)).astype(np.float32)
    g = -rng.random((T, nv)).astype(np.float32)
    beta = rng.random((T, nv)).astype(np.float32)
    s0 = rng.standard_normal((nv, dk, dv)).astype(np.float32) * 0.1
    grouped = np.array([(h % nk) * ratio + h // nk for h in range(nv)])  # our head h == their head grouped[h]
    inv = np.argsort(grouped)
    qn, kn, _ = gdn.gdn_split(np.concatenate([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], axis=1),
                              nk, dk, nv, dv)
    o, s = gdn.gdn_recurrence(s0, qn, kn, v, g, beta)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))[None]  # noqa: E731
    o_ref, s_ref = qwen.torch_recurrent_gated_delta_rule(
        t(q), t(k), t(v[:, inv]), t(g[:, inv]), t(beta[:, inv]), initial_state=t(s0[inv]),
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    np.testing.assert_allclose(o, o_ref[0].numpy()[:, grouped], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(s, s_ref[0].numpy()[grouped], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hc,D,L,T", [(2, 24, 5, 3), (4, 40, 16, 1), (3, 17, 7, 6)])
def test_hc_read_matches_gated_residual(hc, D, L, T):
    from transformers import Qwen4ExpTextConfig

    cfg = Qwen4ExpTextConfig(hidden_size=D, hc_count=hc, hc_lowrank=L, num_hidden_layers=1, vocab_size=8,
                             num_experts=2, num_experts_per_tok=1)
    torch.manual_seed(T)
    mod = qwen.Qwen4ExpTextGatedResidual(cfg).eval()
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    R = np.random.default_rng(T).standard_normal((T, hc, D)).astype(np.float32)
    with torch.no_grad():
        mixed_ref, _, inj_ref = mod(torch.from_numpy(R.reshape(T, -1)))
    w = {n: p.detach().numpy() for n, p in mod.named_parameters()}
    mixed, inj = hyper.hc_read(R, 1 + w["hc_norm.weight"], w["input_mix_weight_down.weight"],
                               w["input_mix_weight_up.weight"], w["block_inject_weight.weight"], 1e-6)
    np.testing.assert_allclose(mixed, mixed_ref.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(inj, inj_ref.numpy(), rtol=1e-5, atol=1e-6)


class _Fixed(torch.nn.Module):
    """Stands in for a block: returns a given output whatever it is fed."""

    def __init__(self, out):
        super().__init__()
        self.out = out

    def forward(self, hidden_states, *args, **kwargs):
        return self.out


@pytest.mark.parametrize("hc,D,L,T", [(2, 24, 5, 3), (4, 40, 16, 1), (3, 17, 7, 6)])
def test_hc_write_matches_the_decoder_layer(hc, D, L, T):
    """A transformers decoder layer whose mixer and MoE return fixed outputs: its result is the two hyper-connection
    writes (streams + output * inject gate), which hc_read/hc_write must reproduce."""
    from transformers import Qwen4ExpTextConfig

    cfg = Qwen4ExpTextConfig(hidden_size=D, hc_count=hc, hc_lowrank=L, num_hidden_layers=1, vocab_size=8,
                             num_experts=2, num_experts_per_tok=1, layer_types=["linear_attention"], ple_layer_ids=[])
    torch.manual_seed(T + hc)
    layer = qwen.Qwen4ExpTextDecoderLayer(cfg, 0).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    rng = np.random.default_rng(D)
    R = rng.standard_normal((T, hc, D)).astype(np.float32)
    out_mixer, out_moe = (rng.standard_normal((T, D)).astype(np.float32) for _ in range(2))
    layer.linear_attn = _Fixed(torch.from_numpy(out_mixer)[None])
    layer.mlp = _Fixed(torch.from_numpy(out_moe)[None])
    with torch.no_grad():
        want = layer(torch.from_numpy(R.reshape(1, T, -1)), position_embeddings=None)[0].numpy()
    w = {n: p.detach().numpy() for n, p in layer.named_parameters()}

    def half(prefix, R_in, block_out):
        _, inj = hyper.hc_read(R_in, 1 + w[f"{prefix}.hc_norm.weight"], w[f"{prefix}.input_mix_weight_down.weight"],
                               w[f"{prefix}.input_mix_weight_up.weight"], w[f"{prefix}.block_inject_weight.weight"],
                               1e-6)
        return hyper.hc_write(R_in, block_out, inj)

    got = half("mlp_hyper_connection", half("attn_hyper_connection", R, out_mixer), out_moe)
    np.testing.assert_allclose(got.reshape(T, -1), want, rtol=1e-5, atol=1e-5)


def _router(E: int, k: int, D: int, seed: int):
    from transformers import Qwen4ExpTextConfig

    cfg = Qwen4ExpTextConfig(hidden_size=D, num_experts=E, num_experts_per_tok=k, num_hidden_layers=1, vocab_size=8,
                             norm_topk_prob=True)
    router = qwen.Qwen4ExpTextTopKRouter(cfg)
    with torch.no_grad():
        router.weight.copy_(torch.from_numpy(np.random.default_rng(seed).standard_normal((E, D)).astype(np.float32)))
    return router


@pytest.mark.parametrize("E,k,T", [(8, 2, 5), (61, 4, 3), (16, 16, 2), (7, 1, 4), (512, 10, 3)])
def test_router_matches_transformers(E, k, T):
    """Ids in descending probability and the renormalised weights, against Qwen4ExpTextTopKRouter."""
    router = _router(E, k, 12, E + k)
    x = torch.from_numpy(np.random.default_rng(T).standard_normal((T, 12)).astype(np.float32))
    with torch.no_grad():
        logits, scores, ids_ref = router(x)
    ids, w = moe.router_topk(logits.numpy(), k)
    np.testing.assert_array_equal(ids, ids_ref.numpy())
    np.testing.assert_allclose(w, scores.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("E,k", [(8, 2), (12, 3), (61, 4), (512, 10)])
def test_router_ties_go_to_the_lower_id_with_transformers_weights(E, k):
    """Exact ties straddling the k-th place. torch's CPU topk keeps whichever tied expert its introselect leaves in
    front (no id order); ties go to the lower id here. Either way the kept probabilities and
    so the weights are transformers' own; the kept ids are the lowest of the tied ones."""
    rng = np.random.default_rng(E * k)
    for trial in range(20):
        logits = rng.standard_normal(E).astype(np.float32)
        order = np.argsort(-logits, kind="stable")
        n_tied = 2 + trial % 3
        tied = order[k - 1:k - 1 + n_tied] if k - 1 + n_tied <= E else order[k - 1:]
        logits[tied] = logits[order[k - 1]]
        ids, w = moe.router_topk(logits[None], k)
        with torch.no_grad():
            values, _ = torch.topk(torch.softmax(torch.from_numpy(logits), -1), k)
        ref_w = (values / values.sum()).numpy()
        np.testing.assert_allclose(np.sort(w[0]), np.sort(ref_w), rtol=1e-6, atol=1e-7)
        kept_tied = sorted(set(ids[0].tolist()) & set(tied.tolist()))
        assert kept_tied == sorted(tied.tolist())[:len(kept_tied)], (trial, kept_tied, sorted(tied.tolist()))
        assert len(kept_tied) == k - (len(set(ids[0].tolist()) - set(tied.tolist())))
        untied_kept = set(order[:k - 1].tolist()) - set(tied.tolist())
        assert untied_kept <= set(ids[0].tolist())


@pytest.mark.parametrize("ngram,hpn,eos", [(3, 2, 7), (2, 3, 0), (4, 1, 30)])
def test_ngram_rows_match_transformers_hash(ngram, hpn, eos):
    """Row ids of the n-gram table, read back through an embedding whose row r holds the value r."""
    from transformers import Qwen4ExpTextConfig

    heads = (ngram - 1) * hpn
    vocab = 50
    cfg = Qwen4ExpTextConfig(hidden_size=heads, vocab_size=vocab, ngram_size=ngram, heads_per_ngram=hpn,
                             ngram_vocab_size_base=97, eos_token_id=eos, num_hidden_layers=2,
                             layer_types=["linear_attention"] * 2, ple_layer_ids=[1], ple_embed_dim=heads,
                             num_experts=2, num_experts_per_tok=1)
    emb = qwen.Qwen4ExpTextNGramEmbedding(cfg, heads, layer_idx=0, ple_layer_index=0)
    with torch.no_grad():
        emb.ngram_embedding.weight.copy_(torch.arange(emb.ngram_embedding.weight.shape[0],
                                                      dtype=torch.float32)[:, None])
    rng = np.random.default_rng(ngram)
    tokens = rng.integers(0, vocab, 40)
    tokens[[5, 6, 20]] = eos
    with torch.no_grad():
        expect = emb(torch.from_numpy(tokens)[None], None)[0].numpy().astype(np.int64)
    mult = emb.layer_multipliers.numpy()
    sizes, offsets = emb.ngram_heads_vocab_sizes.numpy(), emb.ngram_heads_offsets.numpy()
    prev = np.full(ngram - 1, eos, dtype=np.int64)
    for i, tok in enumerate(tokens):
        ctx = ple.ngram_context(int(tok), prev[::-1], eos)
        np.testing.assert_array_equal(ple.ngram_rows(ctx, mult, hpn, sizes, offsets), expect[i], err_msg=str(i))
        prev = np.concatenate([prev[1:], [tok]])
