"""The GPU window's layer sequence (engine/gpu/window.py _LayerRecorder) without a GPU: every launcher replaced by
a recorder of its name, the recorded steps of each variant (every expert in VRAM, expert
tiers, stages of the layer split) in the order the device runs them. The nodes each launch adds are
test_window_nodes.py's (the real launchers, listed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from strata_cli.gpu.launch_util import WindowPath

LAUNCHERS = ("embed", "gdn", "launch_gemv", "hyper", "moe", "ple", "qsa", "sampling")


class _Rows:
    """Any array-like the recorder slices or reshapes."""

    shape = (1, 1)
    nbytes = 4

    def __getitem__(self, _):
        return self

    def reshape(self, *args):
        return self


class _Buffers(dict):
    def __missing__(self, key):
        return _Rows()


class _Recorded:
    """Stands in for a launcher module: each launch appends "module.name" to steps; scratch classes and
    geometry helpers are the real module's."""

    def __init__(self, real, label: str, steps: list, calls: list | None = None):
        self.real, self.label, self.steps, self.calls = real, label, steps, calls

    def __getattr__(self, name):
        if name[0].isupper() or name in ("cell_capacity", "router_fuses"):
            return getattr(self.real, name)

        def launch(*args, **kwargs):
            self.steps.append(f"{self.label}.{name}")
            pair = name.startswith(("hc_read", "router_")) or name == "ple_kv"
            out = (_Rows(), _Rows()) if pair else _Rows()
            if self.calls is not None:
                self.calls.append((f"{self.label}.{name}", kwargs, out))
            return out

        return launch


def _tiers(steps: list):
    return SimpleNamespace(pre=lambda layer, grp, *a: steps.append(f"tiers.pre {layer} {grp}"),
                           post=lambda layer, grp, *a: steps.append(f"tiers.post {layer} {grp}"))


def recorded_steps(monkeypatch, geometry, T: int, path: WindowPath, tiers: str | None = None,
                   ends: list | None = None, layers: tuple[int, int] | None = None, router_type: int = 0,
                   stacked: bool = True, shared: bool = True, calls: list | None = None) -> list[str]:
    """The launches record_window makes for a T-row window of `geometry` with launch variant `path`; tiers None
    (every expert in VRAM) or "one" (expert tiers). ends: appended the number of
    steps so far at each layer's end ("embed", then each "gap": GPUEngine.layer_nodes' stamps). layers: the
    range of a stage of the layer split (engine/gpu/layer_split.py; default every layer). router_type: the GGML
    type of the routers (every other weight F32); stacked: a layer's projections of its mixed rows stack (one GEMV:
    a GDN layer's qkv and z, a QSA layer's k, v, q and indexer q); shared: the shared expert joins the routed
    experts' tensors (one more entry a row); calls: appended (step, its keywords, what it returned) of each launch."""
    from strata_cli.engine.gpu import window

    steps: list[str] = []
    for mod in LAUNCHERS:
        monkeypatch.setattr(window, mod, _Recorded(getattr(window, mod), mod, steps, calls))
    monkeypatch.setattr(window, "copy_async", lambda *a: steps.append("memcpy"))
    for helper in ("split_k", "argmax_scratch"):
        monkeypatch.setattr(window, helper, lambda *a: None)
    weights = SimpleNamespace(raw=lambda name: (_Rows(), router_type if name.endswith("ffn_gate_inp.weight") else 0),
                              f32=lambda name: _Rows(), blk_f32=lambda *a: _Rows(), blk_raw=lambda *a: (_Rows(), 0),
                              hc=lambda prefix: SimpleNamespace(n_inj=1),
                              stack=lambda layer, name: (_Rows(), 0, 10**6) if stacked else None,
                              shared_expert_id=lambda layer: 99 if shared else None)
    stage = SimpleNamespace(tokens=SimpleNamespace(device=None), positions=SimpleNamespace(device=None),
                            out_ids=SimpleNamespace(device=None), out_nonfinite=SimpleNamespace(device=_Rows()))
    def count(layer, stage, stream):
        if stage in ("embed", "gap"):
            ends.append(len(steps))

    e = SimpleNamespace(buf=_Buffers(), w=weights, g=geometry, stage=stage, stamper=None if ends is None else count,
                        route_tap=None,
                        tiers=None if tiers is None else _tiers(steps),
                        window_paths=lambda T: path, layers=layers or (0, geometry.n_layers))
    window.record_window(e, T, None)
    return steps


PLAIN = WindowPath(gemv_tc=False)
TC = WindowPath(gemv_tc=True)
HC_READ = ["hyper.hc_read"]
HC_WRITE = ["hyper.hc_write"]
GDN = ["launch_gemv.gemv", "gdn.gdn_mix", "launch_gemv.gemv"]  # qkv + z (one GEMV), gdn_mix, out
# k, v, q, indexer q and k: one GEMV; k/v into the cache, the norms and ropes, the window's pooled keys, block scores,
# selection and attention one launch; the out projection
QSA = ["launch_gemv.gemv", "qsa.qsa_mix", "launch_gemv.gemv"]
# the router's GEMV in its top-k launch (an F32 router), the shared expert one more entry of the routed launches;
# the experts' combine is the next read's
MOE = ["moe.router_gemv_topk", "moe.routed_parts"]
# the PLE's n-gram rows and their key / value projection read the tokens only: the window's inputs, before the
# embedding (of the stage that holds the PLE layer); its mix is the first kernel of the PLE layer's first read
PLE = ["ple.ngram_gather", "ple.ple_kv"]
COPIES, EMBED = ["memcpy", "memcpy"], ["embed.gather_rows", "hyper.broadcast_streams"]
INPUTS = COPIES + PLE + EMBED
HEAD = ["launch_gemv.gemv", "sampling.argmax_rows", "memcpy"]


@pytest.fixture
def geometry(fixture_dir):
    from strata_cli.model.gguf_file import open_model

    g = open_model(fixture_dir / "model-q8_0.gguf").geometry
    assert g.ple is not None and g.ple.layer > 0 and any(g.compress_ratios) and g.gdn_layers  # every kind of step
    return g


def mixer(g, layer: int) -> list[str]:
    if not g.layer_is_attn[layer]:
        return GDN
    return QSA


def unsplit(g, moe) -> list[str]:
    """The steps of a one-group window: moe(layer) = its MoE steps. Every block's write goes into the next read (the
    PLE layer's into its mix, the first kernel of that layer's first read), so there is no write node."""
    want = list(INPUTS)
    for layer in range(g.n_layers):
        want += HC_READ + mixer(g, layer) + HC_READ + moe(layer)
    return want + HC_READ + HEAD


def stage_steps(g, lo: int, hi: int) -> list[str]:
    """The steps of a stage of the layer split over layers [lo, hi), every expert in VRAM: the tokens' and
    positions' copies, the PLE's inputs on the stage that holds the PLE layer, the embedding only on the first
    stage (a later one starts from the R the previous stage's hand-off wrote), its layers (its first read has no
    pending write), then the head on the last stage, else the last layer's write on its own, so that the R handed
    on is whole."""
    want = COPIES + (PLE if lo <= g.ple.layer < hi else []) + (EMBED if lo == 0 else [])
    for layer in range(lo, hi):
        want += HC_READ + mixer(g, layer) + HC_READ + MOE
    if hi < g.n_layers:
        return want + HC_WRITE
    return want + HC_READ + HEAD


@pytest.mark.parametrize("path", [PLAIN, TC], ids=("cuda-core", "tensor-core"))
def test_layer_split_stages_record_their_range(monkeypatch, geometry, path):
    g = geometry
    L = g.n_layers
    assert stage_steps(g, 0, L) == unsplit(g, lambda layer: MOE)
    for bounds in [(0, 1, L), (0, g.ple.layer, L), (0, g.ple.layer + 1, L), (0, 2, 5, L), (0, 3, 4, 7, L)]:
        for lo, hi in zip(bounds, bounds[1:]):
            got = recorded_steps(monkeypatch, g, 5, path, layers=(lo, hi))
            assert got == stage_steps(g, lo, hi), (bounds, lo, hi)


@pytest.mark.parametrize("T,path", [(3, PLAIN), (5, TC)], ids=("cuda-core", "tensor-core"))
def test_window_applies_each_write_in_the_next_read(monkeypatch, geometry, T, path):
    assert recorded_steps(monkeypatch, geometry, T, path) == unsplit(geometry, lambda layer: MOE)


def test_projections_of_two_types_are_a_gemv_each(monkeypatch, geometry):
    """No stack: a GDN layer's qkv and z are two GEMVs, a QSA layer's k, v, q three and its indexer q and k one
    more each, before its mixer's one launch."""
    g = geometry
    got = recorded_steps(monkeypatch, g, 3, PLAIN, stacked=False)
    want = unsplit(g, lambda layer: MOE)
    extra = len(g.gdn_layers) + sum(2 + (2 if g.compress_ratios[layer] else 0) for layer in g.attn_layers)
    assert len(got) == len(want) + extra and got.count("gdn.gdn_mix") == len(g.gdn_layers)
    first = got.index("gdn.gdn_mix")
    assert got[first - 2:first] == ["launch_gemv.gemv", "launch_gemv.gemv"]
    assert g.compress_ratios[g.attn_layers[0]]
    qsa = got.index("qsa.qsa_mix")  # k, v, q, the indexer q and k, the mixer, the out projection
    assert got[qsa - 5:qsa + 2] == ["launch_gemv.gemv"] * 5 + ["qsa.qsa_mix", "launch_gemv.gemv"]


def test_a_router_of_another_type_is_a_gemv_then_router_topk(monkeypatch, geometry):
    """... and the shared expert then has its launches (router_topk's ids have no slot for it)."""
    from strata_cli.model import quants

    moe = ["launch_gemv.gemv", "moe.router_topk", "moe.shared_expert", "moe.routed_parts"]
    got = recorded_steps(monkeypatch, geometry, 3, PLAIN, router_type=quants.F16)
    assert got == unsplit(geometry, lambda layer: moe)


def test_a_shared_expert_of_other_types_has_its_own_launches(monkeypatch, geometry):
    moe = ["moe.router_gemv_topk", "moe.shared_expert", "moe.routed_parts"]
    got = recorded_steps(monkeypatch, geometry, 3, PLAIN, shared=False)
    assert got == unsplit(geometry, lambda layer: moe)


def test_unsplit_tiers_replace_the_moe_only(monkeypatch, geometry):
    def tiers(layer):
        return [f"tiers.pre {layer} 0", f"tiers.post {layer} 0"]

    assert recorded_steps(monkeypatch, geometry, 2, PLAIN, tiers="one") == unsplit(geometry, tiers)


def test_layer_split_stages_commit_their_own_state(monkeypatch, geometry):
    """record_commit of a stage over [lo, hi): the GDN and indexer commits of its layers only, the PLE commit iff
    it holds the PLE layer; the stages of a split together commit what the one engine does."""
    from strata_cli.engine.gpu import window

    g = geometry
    L = g.n_layers

    def commit_steps(lo, hi):
        steps: list[str] = []
        for name in ("gdn", "qsa", "ple"):
            monkeypatch.setattr(window, name, _Recorded(getattr(window, name), name, steps))
        monkeypatch.setattr(window, "copy_async", lambda *a: steps.append("memcpy"))
        inside = lambda layers: [layer for layer in layers if lo <= layer < hi]  # noqa: E731
        e = SimpleNamespace(buf=_Buffers(), w=SimpleNamespace(blk_f32=lambda *a: _Rows(), stack=lambda layer, name: None), g=g,
                            stage=SimpleNamespace(n_keep=SimpleNamespace(device=None)),
                            gdn_layers=inside(g.gdn_layers), attn_layers=inside(g.attn_layers),
                            has_ple=lo <= g.ple.layer < hi)
        window.record_commit(e, None)
        return steps

    def want(lo, hi):
        out = ["memcpy"]
        out += ["gdn.gdn_conv_commit", "gdn.gdn_commit_state"] * sum(lo <= x < hi for x in g.gdn_layers)
        out += ["qsa.indexer_commit"] * sum(lo <= x < hi and g.compress_ratios[x] > 0 for x in g.attn_layers)
        return out + (["ple.ple_history_commit", "ple.ple_prev_commit"] if lo <= g.ple.layer < hi else [])

    assert commit_steps(0, L) == want(0, L)
    for lo, hi in [(0, 1), (1, 4), (4, L), (2, 3)]:
        assert commit_steps(lo, hi) == want(lo, hi), (lo, hi)
    halves = commit_steps(0, 4) + commit_steps(4, L)
    assert sorted(s for s in halves if s != "memcpy") == sorted(s for s in want(0, L) if s != "memcpy")


@pytest.mark.parametrize("first", [False, True], ids=("unsplit", "stage-from-ple"))
def test_the_ple_layer_s_first_read_is_its_mix(monkeypatch, geometry, first):
    """The PLE layer's first read gets a launch_ple.PleMix pending (its first kernel is the PLE's mix) over the
    (key, value) rows of the inputs' ple_kv, carrying the previous layer's write (the experts' combine), or none
    where the PLE layer is a stage's first; no other read gets one."""
    from strata_cli.gpu import launch_hyper, launch_ple

    g = geometry
    lo = g.ple.layer if first else 0
    calls = []
    recorded_steps(monkeypatch, g, 5, PLAIN, layers=(lo, g.n_layers), calls=calls)
    kv = next(out for name, _, out in calls if name == "ple.ple_kv")
    reads = [kwargs.get("pending") for name, kwargs, _ in calls if name == "hyper.hc_read"]
    mix = reads[2 * (g.ple.layer - lo)]  # two reads a layer
    assert isinstance(mix, launch_ple.PleMix) and (mix.key, mix.value) == kv
    assert sum(isinstance(r, launch_ple.PleMix) for r in reads) == 1
    assert isinstance(mix.pending, launch_hyper.CombineWrite) if not first else mix.pending is None
