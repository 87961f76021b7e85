"""Localise the GPU's one-row (T=1) window divergence from the numpy engine on random geometry seed 51 (F32; 4:1
GQA, expert width 16), found by tests/test_gpu_window_contract.py on the H200 and still open (issue 8).

    python3 bench/window_t1_probe.py [SEED]      (on a GPU machine, from the repo root; 50 is a passing control)

Prints the committed state after 16 tokens (GPU vs numpy), the row-0 error of T=1 and T=2 windows at position 16
(graph and eager), row 0 of every per-layer buffer in write order with `<==` at the first one where T=1 and T=2
differ, and T=1 against numpy on fresh engines at positions 0, 5 and 9."""
import pathlib, sys, tempfile
import numpy as np
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from random_models import random_preset, write_random
from spec_windows import committed_state
from strata_cli.engine.reference import ReferenceEngine
from strata_cli.engine.gpu import GPUEngine
from strata_cli.gpu.runtime import cupy

seed = int(sys.argv[1]) if len(sys.argv) > 1 else 51
rng = np.random.default_rng(seed)
model = write_random(pathlib.Path(tempfile.mkdtemp()), random_preset(rng), seed, "F32" if seed != 52 else "BF16")
tok = rng.integers(0, model.geometry.n_vocab, 48); tok[17] = model.geometry.eos_token_id
g = model.geometry
rel = lambda a, b: float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-30))

def fed(e, n):
    e.reset()
    if n:
        e.run(tok[:n], 0); e.commit(n)
    return e

ref = ReferenceEngine(model, n_ctx=96); ref.run(tok[:16], 0); ref.commit(16)
e = GPUEngine(model, n_ctx=96)
fed(e, 16)
a, b = committed_state(e), committed_state(ref)
print("state after commit(16) GPU vs numpy (rel):", {k: f"{rel(a[k], b[k]):.1e}" for k in a if a[k].size})
want1 = ref.run(tok[16:17], 16).logits
def snap(e, T):
    """Row 0 of every per-layer buffer the window wrote, in the order the window writes them."""
    bb, out, host = e.buf, {}, cupy().asnumpy
    if g.ple is not None:
        out["ple_rows"], out["ple_normed"] = host(bb["ple_rows"][0]), host(bb["ple_normed"][0])
    for l in range(g.n_layers):
        if l in g.gdn_layers:
            for n in ("qkv", "q", "k", "v", "g", "beta"):
                out[f"{n}.{l}"] = host(bb[f"{n}.{l}"][0])
        else:
            out[f"kc.{l}@16"], out[f"vc.{l}@16"] = host(bb[f"kc.{l}"][16]), host(bb[f"vc.{l}"][16])
            if g.compress_ratios[l]:
                out[f"idx_raw.{l}"] = host(bb[f"idx_raw.{l}"][0])
    out["logits"] = host(bb["logits"][0])
    return out
rows = {}
for name, T, eager in (("T1 graph", 1, False), ("T1 eager", 1, True), ("T2 graph", 2, False), ("T2 eager", 2, True)):
    r = e.run(tok[16:16 + T], 16, eager=eager)
    rows[name] = (r.logits[0], snap(e, T))
    print(f"{name}: row0 rel err vs numpy T=1 {rel(r.logits[0], want1[0]):.2e}")
s1, s2 = rows["T1 eager"][1], rows["T2 eager"][1]
print("first buffers where T=1 and T=2 row 0 differ (GPU, write order):")
for k in s1:
    d = rel(s1[k].astype(np.float64), s2[k].astype(np.float64))
    print(f"  {k:14s} {d:.2e}{'  <==' if d > 1e-5 else ''}")
for p in (0, 5, 9):
    e2 = fed(GPUEngine(model, n_ctx=96), p); r2 = ReferenceEngine(model, n_ctx=96)
    if p: r2.run(tok[:p], 0); r2.commit(p)
    print(f"T=1 at pos {p} after commit({p}): rel err {rel(e2.run(tok[p:p+1], p).logits, r2.run(tok[p:p+1], p).logits):.2e}")
