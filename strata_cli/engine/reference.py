"""The numpy reference verify engine: a window of T tokens through every layer, float32.

run(tokens, pos0) feeds tokens at positions pos0..pos0+T-1 and returns T rows of logits and greedy ids;
commit(n_keep) advances the sequence to exactly the first n_keep of those rows (see engine/state.py).
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import InputError
from ..model.gguf_file import GGUFModel
from ..ops import basic, gdn, hyper, moe, ple, qsa, sampling
from ..sysio.memory import available_memory
from .contract import Capabilities, WindowResult, WindowTimer
from .state import (GDNRecord, SequenceState, WindowRecord, check_memory, check_n_keep, check_window, resolve_ctx,
                    state_bytes)
from .weights import Weights, resident_bytes

class ReferenceEngine:
    """The numpy engine of the contract (engine/contract.py): no graphs, no eager mode, host-clock timing."""

    device = "cpu"
    capabilities = Capabilities(graphs=False, eager=False)
    tiers = tier_note = None  # every expert in host memory: no tiers to choose

    def __init__(self, model: GGUFModel, n_ctx: int | None = None, max_t: int | None = None,
                 layers: tuple[int, int] | None = None):
        """layers [a, b): a stage of the layer split (engine/layer_split.py) holding those layers' state only; it
        starts from the previous stage's residual stack (a > 0) and hands its own on (b < n_layers)."""
        self.model = model
        self.g = model.geometry
        self.layers = (0, self.g.n_layers) if layers is None else tuple(layers)
        self.w = Weights(model)
        self.n_ctx = resolve_ctx(self.g, n_ctx)
        available = available_memory()
        check_memory("the sequence state (KV cache, indexer keys, recurrent states)", state_bytes(self.g, self.n_ctx),
                     self.n_ctx, available)
        weights = resident_bytes(model)
        if available is not None and weights > available:
            raise InputError(f"{model.path}: the numpy engine keeps float64 copies of the weights it uses: "
                             f"{weights / 2**30:.2f} GiB, the host has {available / 2**30:.2f} GiB available "
                             "(use --device gpu, or a smaller model)")
        self.max_t = max_t
        self.capture_ms: dict[int, float] = {}  # no graphs: nothing is captured
        self.route_hook = None  # route_hook(layer, ids [T, k]) sees every router pick (strata make-profile)
        self.reset()

    def close(self) -> None:
        """The contract's release (engine/contract.py): drops the float64 weight copies and the sequence state."""
        self.w = self.state = self._pending = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def reset(self) -> None:
        self.state = SequenceState.fresh(self.g, self.n_ctx, self.layers)
        self._pending: WindowRecord | None = None

    @property
    def n_past(self) -> int:
        return self.state.n_past

    # ---- the verify contract
    def run(self, tokens, pos0: int | None = None) -> WindowResult:
        # NaN/Inf are reported once, by _watch, naming the first stage: not as numpy warnings on stderr
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return self._run(tokens, pos0)

    def _run(self, tokens, pos0: int | None) -> WindowResult:
        tokens = check_window(tokens, pos0, self.n_past, self.g.n_vocab, self.n_ctx, self.max_t)
        return self.stage_run(tokens)

    def stage_run(self, tokens: np.ndarray, hand_in: np.ndarray | None = None):
        """The window through this engine's layers [a, b) (tokens checked by the caller): from the embedding
        (a == 0) or the previous stage's residual stack hand_in [T, C, D]; returns the stack [T, C, D] for the next
        stage when b < n_layers, else the WindowResult. self._nonfinite: the first stage here that went NaN/Inf."""
        self.model.check_unchanged()  # tensors are read lazily from the mapping: a truncated file would SIGBUS
        self._pending = None  # an uncommitted window is dropped: it wrote no committed state (state.py)
        rec = WindowRecord(pos0=self.n_past, tokens=tokens)
        positions = self.n_past + np.arange(len(tokens))
        self._nonfinite = None
        a, b = self.layers
        if a == 0:
            R = np.repeat(self.w.embed_rows(tokens)[:, None, :], self.g.hc, axis=1)     # [T, C, D]
            self._watch("token_embd (the embedding rows)", R)
        else:
            R = hand_in
        for layer in range(a, b):
            R = self._layer(layer, R, tokens, positions, rec)
        self._pending = rec
        if b < self.g.n_layers:
            return R
        mixed, _ = hyper.hc_read(R, *self.w.hc("output_hc", inject=False), self.g.eps)
        self._watch("output_hc (the final hyper-connection read)", mixed)
        logits = basic.linear(mixed, self.w.get("output.weight"))
        self._watch("output.weight (the logits)", logits)
        return WindowResult(rec.pos0, tokens, logits, logits.argmax(axis=1).astype(np.int32),
                            nonfinite=self._nonfinite)

    def _watch(self, stage: str, values: np.ndarray) -> None:
        """Remember the first stage of this window whose output holds NaN/Inf (one isfinite pass over [T, ...]
        activations per stage: small next to the GEMVs that made them)."""
        if self._nonfinite is None and not np.isfinite(values).all():
            self._nonfinite = stage

    def commit(self, n_keep: int) -> None:
        rec = self._pending
        if rec is None:
            raise InputError("commit without a window to commit (run a window first)")
        check_n_keep(n_keep, rec.T)
        st, g = self.state, self.g
        for layer, r in rec.gdn.items():
            st.gdn_conv[layer] = r.conv_seq[n_keep:n_keep + g.conv_kernel - 1].copy()
            if n_keep:
                _, st.gdn_state[layer] = gdn.gdn_recurrence(st.gdn_state[layer], r.q[:n_keep], r.k[:n_keep],
                                                            r.v[:n_keep], r.g[:n_keep], r.beta[:n_keep])
        positions = rec.pos0 + np.arange(n_keep)
        for layer, raw in rec.idx_raw.items():
            qsa.indexer_append(st.idx_tail[layer], st.idx_pooled[layer], raw[:n_keep], positions,
                               self.w.blk(layer, "indexer.k_norm"), g.eps, g.n_rot, g.rope_base)
        if rec.ple_seq is not None:
            st.ple_history = rec.ple_seq[n_keep:n_keep + g.ple.history].copy()
            st.ple_prev = np.concatenate([st.ple_prev, rec.tokens[:n_keep]])[-(g.ple.ngram_size - 1):]
        st.n_past += n_keep
        self._pending = None

    def sample(self, result: WindowResult, temperature: float, seed: int) -> np.ndarray:
        """Ids drawn from the window's logits (ops/sampling.py; greedy when temperature <= 0)."""
        return sampling.sample_rows(result.logits, result.pos0 + np.arange(len(result.tokens)), temperature, seed)

    def window_timer(self, eager: bool = False) -> WindowTimer:
        """timer(engine, tokens, pos, n_keep) -> (host ms of run + commit, the same host ms)."""
        if eager:
            raise InputError("eager launches need the GPU engine (--device gpu): the numpy engine has no graphs")

        def timer(engine, tokens, pos, n_keep):
            t0 = time.perf_counter()
            engine.run(tokens, pos)
            engine.commit(n_keep)
            ms = (time.perf_counter() - t0) * 1e3
            return ms, ms

        return timer

    # ---- one layer over the window's rows
    def _layer(self, layer, R, tokens, positions, rec):
        g, w = self.g, self.w
        if g.ple is not None and g.ple.layer == layer:
            R = self._ple(layer, R, tokens, rec)
            self._watch(f"layer {layer} PLE (n-gram embedding block)", R)
        mixed, inj = hyper.hc_read(R, *w.hc(f"blk.{layer}.hc_attn"), g.eps)
        self._watch(f"layer {layer} hc_attn (hyper-connection read)", mixed)
        if g.layer_is_attn[layer]:
            out = self._qsa(layer, mixed, positions, rec)
            self._watch(f"layer {layer} attention (QSA)", out)
        else:
            out = self._gdn(layer, mixed, rec)
            self._watch(f"layer {layer} Gated DeltaNet", out)
        R = hyper.hc_write(R, out, inj)
        mixed, inj = hyper.hc_read(R, *w.hc(f"blk.{layer}.hc_ffn"), g.eps)
        self._watch(f"layer {layer} hc_ffn (hyper-connection read)", mixed)
        router_logits = basic.linear(mixed, w.blk(layer, "ffn_gate_inp"))
        self._watch(f"layer {layer} router (ffn_gate_inp)", router_logits)
        ids, weights = moe.router_topk(router_logits, g.n_expert_used)
        if self.route_hook is not None:
            self.route_hook(layer, ids)
        out = moe.routed_experts(mixed, ids, weights, lambda e: w.expert(layer, e))
        self._watch(f"layer {layer} routed experts", out)
        out += moe.shared_expert(mixed, *w.shared(layer))
        self._watch(f"layer {layer} shared expert", out)
        return hyper.hc_write(R, out, inj)

    def _gdn(self, layer, x, rec):
        g, w, st = self.g, self.w, self.state
        h, conv_seq = gdn.gdn_conv(basic.linear(x, w.blk(layer, "attn_qkv")), st.gdn_conv[layer],
                                   w.blk(layer, "ssm_conv1d"))
        q, k, v = gdn.gdn_split(h, g.ssm_nk, g.ssm_dk, g.ssm_nv, g.ssm_dv)
        decay, beta = gdn.gdn_gates(basic.linear(x, w.blk(layer, "ssm_alpha")),
                                    basic.linear(x, w.blk(layer, "ssm_beta")),
                                    w.blk(layer, "ssm_dt.bias"), w.blk(layer, "ssm_a"))
        o, _ = gdn.gdn_recurrence(st.gdn_state[layer], q, k, v, decay, beta)
        rec.gdn[layer] = GDNRecord(conv_seq, q, k, v, decay, beta)
        z = basic.linear(x, w.blk(layer, "attn_gate")).reshape(o.shape)
        y = gdn.gdn_gated_norm(o, z, w.blk(layer, "ssm_norm"), g.eps)
        return basic.linear(y.reshape(len(x), -1), w.blk(layer, "ssm_out"))

    def _qsa(self, layer, x, positions, rec):
        g, w, st = self.g, self.w, self.state
        T, d = len(x), g.head_dim
        k = basic.linear(x, w.blk(layer, "attn_k")).reshape(T, g.n_head_kv, d)
        v = basic.linear(x, w.blk(layer, "attn_v")).reshape(T, g.n_head_kv, d)
        qg = basic.linear(x, w.blk(layer, "attn_q")).reshape(T, g.n_head, 2 * d)
        indexer = None
        if g.compress_ratios[layer]:
            raw = basic.linear(x, w.blk(layer, "indexer.k_proj"))
            rec.idx_raw[layer] = raw  # commit re-appends the kept rows to the tail, which the run only read
            qr = basic.linear(x, w.blk(layer, "indexer.q_proj")).reshape(T, g.idx_heads, g.idx_dim)
            indexer = qsa.WindowIndexer(qr, w.blk(layer, "indexer.q_norm"), raw, w.blk(layer, "indexer.k_norm"),
                                        st.idx_tail[layer], st.idx_pooled[layer], g.idx_budget)
        out = qsa.qsa_mix(k, v, qg, w.blk(layer, "attn_k_norm"), w.blk(layer, "attn_q_norm"), st.k_cache[layer],
                          st.v_cache[layer], positions, g.eps, g.n_rot, g.rope_base, indexer)
        return basic.linear(out, w.blk(layer, "attn_output"))

    def _ple(self, layer, R, tokens, rec):
        p, w, st = self.g.ple, self.w, self.state
        prev = st.ple_prev.copy()                                     # oldest first
        rows = []
        for tok in tokens:
            ctx = ple.ngram_context(int(tok), prev[::-1], p.eos_token_id)
            rows.append(ple.ngram_rows(ctx, w.ple_mult, p.heads_per_ngram, w.ple_sizes, w.ple_offsets))
            prev = np.concatenate([prev[1:], [tok]]) if len(prev) else prev
        emb = w.ple_rows(np.stack(rows))
        R, rec.ple_seq = ple.ple_mix(R, emb, st.ple_history, w.blk(layer, "ple_key"), w.blk(layer, "ple_value"),
                                     w.blk(layer, "ple_norm_key"), w.blk(layer, "ple_norm_query"),
                                     w.blk(layer, "ple_norm_conv"), w.blk(layer, "ple_conv1d"), p.dilation,
                                     self.g.eps)
        return R
