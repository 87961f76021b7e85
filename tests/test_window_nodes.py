"""The graph nodes of the window per layer, without a GPU (tests/window_launches.py: the real recorder and
launchers over host arrays, each kernel launch and device copy listed): what `strata graph-nodes` shows on the
device (tests/test_gpu_window_nodes.py holds the two equal). Issue 18's target is at most 12 nodes per layer.

Run with -s to see the per-layer lists."""

from __future__ import annotations

import numpy as np
import pytest
from random_models import random_preset, write_random
from window_launches import host_engine, window_launches

from strata_cli.model.gguf_file import open_model

# Per layer on the Q8_0 fixture (GDN layers 0-2, 4-6; QSA layers 3 and 7 with the indexer; the PLE at layer 1).
# Before issue 18's fusions
# (43184b0): T = 1 [23, 29, 23, 34, 23, 23, 23, 34] (224 in the window), T = 8 [21, 28, 21, 32, 21, 21, 21, 32] (209).
# Each HC read 3 nodes (hyper.cu hc_write_norm, one GEMV of down + inject, hc_up_mix) instead of 5 at T <= 3 and 4
# from T = 4, every block's write in the next read, one path at every T (d5addfe: 19 a GDN layer, 30 a QSA layer);
# the routed experts' combine computed by that write (00acfd6: 18, 29; no moe_combine node); the router's GEMV in
# its top-k launch (moe.cu router_gemv_topk, an F32 router; 4e4d556: 17, 28); a GDN layer's qkv and z projections
# one GEMV (their weights stacked, gdn_mix reading the rows [qkv | z]; 97b3d32: 16, 28); a QSA layer's k, v, q and
# indexer q one GEMV (the consumers reading views of its rows; 2d90738: 25); the indexer's tail back at its
# snapshot in its append kernel (no copy node; b91d893: 16, 24); the shared expert one more entry of the routed
# experts' launches (its weights appended to theirs, its gate its weight in the combine; 35b700f: 13, 20, 21);
# a QSA layer's k/v into the cache and its q and indexer-q norm-ropes one launch (qsa.cu qsa_prep: 18); the PLE's
# key and value one GEMV (their weights stacked) and the previous layer's write in its gate kernel (ple.cu
# ple_gate; no hc_write node: 18); the routed experts' gate and up one launch (gemv_q8r.cu gemv_q8r_gateup_t<NT>:
# 12, 17, 17); the indexer's key in the QSA stack, its append a block of qsa_prep's launch (15); the PLE's conv
# step the pending write of the layer's first read (hyper.cu hc_write_norm, no ple_conv_out node: 16); the n-gram
# rows hashed and gathered in one launch (ple.cu ple_gather, a Q8_0 table: 15); a QSA layer's block scores and
# cell selection one launch (qsa_select.cu qsa_score_select, the row's last block selecting: 14); a QSA layer's
# whole mixer after its GEMV one launch (qsa.cu qsa_mix: the norm-ropes, cache rows and window's pooled keys done by
# the blocks that need them, the row's attention blocks waiting on its selecting block: 12); the PLE's n-gram
# gather and key/value GEMV in the window's inputs (they read the tokens only: 4 -> 6 input nodes) and its gate,
# norms and conv step with the previous layer's write and the read's norm one launch (ple.cu ple_mix_norm in place
# of ple_gate + hc_write_norm: 12 the PLE layer, 109 in the window):
NODES_PER_LAYER = {1: [12, 12, 12, 12, 12, 12, 12, 12], 8: [12, 12, 12, 12, 12, 12, 12, 12]}
WINDOW_NODES = {1: 109, 8: 109}
# the inputs section: the tokens' and positions' copies, the PLE's gather and its key/value GEMV, the embedding
# gather and its broadcast to the streams; the head: the output read, the head GEMV, the argmax and the ids' copy
INPUT_NODES, HEAD_NODES = 6, 7
# The float fixtures' (F32 / BF16 experts, no repack) layers are the Q8_0 file's since the float experts' gate and
# up are one launch too (gemv.cu gemv_gateup_<type>_t<NT>; they were two: 13, 16 / 15 a layer).
FLOAT_FILES = ("model-f32.gguf", "model-bf16.gguf")


@pytest.fixture
def engine(monkeypatch, fixture_dir):
    model = open_model(fixture_dir / "model-q8_0.gguf")
    g = model.geometry
    assert [g.layer_is_attn[layer] for layer in range(g.n_layers)] == [False] * 3 + [True] + [False] * 3 + [True]
    assert g.ple.layer == 1 and all(g.compress_ratios[layer] for layer in g.attn_layers)
    return host_engine(monkeypatch, model)


@pytest.mark.parametrize("T", sorted(NODES_PER_LAYER))
def test_nodes_per_layer(monkeypatch, engine, T):
    launches = window_launches(monkeypatch, engine, T)
    print(f"\nT = {T}: {launches.total} nodes; per layer {launches.per_layer()}")
    for layer, nodes in enumerate(launches.layers):
        print(f"  layer {layer} ({len(nodes)}): {' '.join(nodes)}")
    print(f"  inputs: {' '.join(launches.inputs)}\n  head: {' '.join(launches.head)}")
    assert launches.per_layer() == NODES_PER_LAYER[T]
    assert launches.total == WINDOW_NODES[T]
    assert (len(launches.inputs), len(launches.head)) == (INPUT_NODES, HEAD_NODES)
    assert launches.inputs[2] == "ple_gather" and launches.layers[engine.g.ple.layer][0] == "ple_mix_norm"


@pytest.mark.parametrize("name", FLOAT_FILES)
def test_float_experts_nodes_per_layer(monkeypatch, fixture_dir, name):
    launches = window_launches(monkeypatch, host_engine(monkeypatch, open_model(fixture_dir / name)), 8)
    print(f"\n{name}: per layer {launches.per_layer()}\n  layer 0: {' '.join(launches.layers[0])}")
    assert launches.per_layer() == NODES_PER_LAYER[8]
    assert any(n.startswith("gemv_gateup_") for n in launches.kinds())


@pytest.mark.parametrize("T", [1, 8])
def test_a_block_type_ple_table_is_hashed_then_gathered_in_the_inputs(monkeypatch, fixture_c_dir, T):
    """llama-quantize's Q4_K_M file (its n-gram table Q5_0: a block type, gathered by gemv_quant.cu qgather_rows after
    ple_ngram_rows): the PLE's hash, gather and key/value GEMV are the inputs' (7 nodes), the PLE layer has as many
    nodes as a GDN layer, ple_mix_norm in place of the first read's hc_write_norm (the recipe's types differ by
    layer, so the GEMV kernels may too)."""
    from strata_cli.gpu.launch_ple import GATHER_TYPES
    from strata_cli.model.names import PLE_TABLE

    model = open_model(fixture_c_dir / "model-q4_k_m.gguf")
    g = model.geometry
    assert model.info(PLE_TABLE).ggml_type not in GATHER_TYPES and not g.layer_is_attn[g.ple.layer]
    launches = window_launches(monkeypatch, host_engine(monkeypatch, model, n_ctx=128), T)
    print(f"\nT = {T}: inputs {' '.join(launches.inputs)}; per layer {launches.per_layer()}")
    assert launches.inputs[:4] == ["memcpy", "memcpy", "ple_ngram_rows", "qgather_rows"] and len(launches.inputs) == 7
    ple_layer = launches.layers[g.ple.layer]
    gdn = next(nodes for layer, nodes in enumerate(launches.layers) if layer != g.ple.layer and layer in g.gdn_layers)
    assert ple_layer[0] == "ple_mix_norm" and len(ple_layer) == len(gdn) and gdn[0] == "hc_write_norm"
    assert "ple_mix_norm" not in gdn and sum(n.startswith("ple_") for n in ple_layer) == 1


def test_listing_sees_the_window_size(monkeypatch, engine):
    """The kernels' row buckets follow T (gemv_*_t<NT>), the whole window is listed (inputs, layers, head), and a
    window larger than the engine's buffers is refused by the launchers' checks, as on the device."""
    one, eight = (window_launches(monkeypatch, engine, T) for T in (1, 8))
    assert any(n.endswith("_t1") for n in one.kinds()) and not any(n.endswith("_t8") for n in one.kinds())
    assert any(n.endswith("_t8") for n in eight.kinds()) and not any(n.endswith("_t1") for n in eight.kinds())
    assert one.inputs[:2] == ["memcpy", "memcpy"] and one.head[-3:] == ["argmax_partial", "argmax_rows", "memcpy"]
    assert one.inputs[3] == "gemv_q8r_t1" and eight.inputs[3] == "gemv_q8r_tc_t8"  # the PLE's key/value GEMV
    with pytest.raises(ValueError):
        window_launches(monkeypatch, engine, 17)


def test_stacked_weights_are_their_matrices_row_for_row(engine):
    """DeviceWeights' stacks (a GDN layer's qkv + z, a QSA layer's k, v, q + indexer q and k, the PLE's key +
    value, each HC read's down + inject, the routed experts + the shared expert) hold the file's matrices in order,
    value for value, after the Q8_0 repack."""
    from strata_cli.engine.gpu.weights import KVQ, PLE_KV, QKVZ, STACKS
    from strata_cli.model import packed
    from strata_cli.ops.gemv import dequant_rows

    model, w, g = engine.w.model, engine.w, engine.g

    def matrix(name):
        info = model.info(name)
        return dequant_rows(info.raw, info.ggml_type, info.shape[0])

    for layer in range(g.n_layers):
        stacks = [QKVZ if layer in g.gdn_layers else KVQ] + ([PLE_KV] if layer == g.ple.layer else [])
        for stack in stacks:
            raw, ggml_type, rows = w.stack(layer, stack)
            assert ggml_type == packed.Q8_0_R32
            roles = [r for r in STACKS[stack] if f"blk.{layer}.{r}" in model.specs]
            assert len(roles) == len(STACKS[stack]) - 2 * (stack == KVQ and not g.compress_ratios[layer])
            want = np.concatenate([matrix(f"blk.{layer}.{r}") for r in roles])
            n_in = model.info(f"blk.{layer}.{roles[0]}").shape[0]
            np.testing.assert_array_equal(dequant_rows(raw, ggml_type, n_in), want)
            assert rows == want.shape[0]
        assert layer == g.ple.layer or w.stack(layer, PLE_KV) is None
        for read in ("hc_attn", "hc_ffn"):
            hc = w.hc(f"blk.{layer}.{read}")
            prefix = f"blk.{layer}.{read}"
            W = dequant_rows(hc.dn_raw, hc.dn_type, g.hc * g.n_embd)
            np.testing.assert_array_equal(W[:hc.L], matrix(prefix + "_down.weight"))
            np.testing.assert_array_equal(W[hc.L:hc.L + hc.n_inj], matrix(prefix + "_inject.weight"))
            assert not W[hc.L + hc.n_inj:].any() and W.shape[0] % 32 == 0
        # the shared expert appended to the routed experts as expert E (its launches are theirs)
        assert w.shared_expert_id(layer) == g.n_expert
        for p in ("gate", "up", "down"):
            raw, ggml_type = w.raw(f"blk.{layer}.ffn_{p}_exps.weight")
            routed, shared = (model.info(f"blk.{layer}.ffn_{p}_{s}.weight") for s in ("exps", "shexp"))
            n_in = routed.shape[0]
            want = np.concatenate([dequant_rows(routed.raw, routed.ggml_type, n_in),
                                   dequant_rows(shared.raw, shared.ggml_type, n_in)])
            np.testing.assert_array_equal(dequant_rows(raw, ggml_type, n_in), want)
    head = w.hc("output_hc")
    assert head.n_inj == 0


@pytest.mark.parametrize("T,shared", [(1, ["gemv_q8r_gateup_dense_t1", "gemv_q8r_t1"]),
                                      (2, ["gemv_q8r_gateup_dense_t2", "gemv_q8r_t2"]),
                                      (8, ["gemv_q8r_tc_t8", "gemv_q8r_tc_t8", "gemv_q8r_tc_t8"])])
def test_own_shared_expert_gate_up_is_one_node_on_cuda_cores(monkeypatch, tmp_path, T, shared):
    """A Q8_0 shared expert of its own width (not one more routed expert): its gate and up one launch where the
    window's dense GEMVs run on CUDA cores (gemv_q8r.cu gemv_q8r_gateup_dense_t<NT>, T <= 2), then down; on the
    tensor-core path (T >= 4) up, gate and down (the router's launch computes its scalar gate at every T)."""
    model = write_random(tmp_path, random_preset(np.random.default_rng(13), shared_expert_intermediate_size=64,
                                                 moe_intermediate_size=32), seed=13, ggml_type="Q8_0")
    engine = host_engine(monkeypatch, model, n_ctx=128)
    assert all(engine.w.shared_expert_id(layer) is None for layer in range(engine.g.n_layers))
    launches = window_launches(monkeypatch, engine, T)
    for nodes in launches.layers:
        router = nodes.index("router_gemv_topk")
        assert nodes[router + 1:router + 1 + len(shared)] == shared, nodes
