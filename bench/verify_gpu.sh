#!/usr/bin/env bash
# GPU verify-window benchmark (issue 3), one call on a GPU machine, from the repo root:
#   graph vs eager on the fixture-sized and `small` models, graph-nodes for T = 1 and 4, and t_verify(T) on a
#   synthetic Qwen3.8-Flash-Next scaled to 8 layers (full width, 512 experts top-10, vocab 248320, Q8_0, ~22 GiB)
#   after a 512-token context, with the bytes each window reads and the measured copy bandwidth, and where its
#   window graph's time goes (bench/graph_costs.py).
# Env: OUT (results dir), FIXTURE (a small GGUF; default the shared fixture's q8_0), BIG (where to write the
# 22 GiB model), SKIP_BIG=1 to leave the big model out, STRATA_GIT_COMMIT (the commit, where the tree has no .git).
set -euo pipefail
OUT=${OUT:-/tmp/strata-bench}
FIXTURE=${FIXTURE:-../shared/fixtures/qwen4exp-tiny/model-q8_0.gguf}
BIG=${BIG:-/tmp/flash-next-8l-q8_0.gguf}
SMALL=${SMALL:-/tmp/small-q8_0.gguf}
mkdir -p "$OUT"
strata() { python3 -m strata_cli "$@"; }

for T in 1 4; do strata graph-nodes "$FIXTURE" --window "$T" --format json > "$OUT/nodes-t$T.json"; done
strata graph-nodes "$FIXTURE" --commit --format json > "$OUT/nodes-commit.json"
[ -f "$SMALL" ] || strata make-model "$SMALL" --preset small --type Q8_0 --seed 1 > /dev/null
for model in "$FIXTURE" "$SMALL"; do
  name=$(basename "$model" .gguf)
  strata verify-bench "$model" --device gpu --window 1,2,4,8 -r 200 -d 64 --format json > "$OUT/$name-graph.json"
  strata verify-bench "$model" --device gpu --window 1,2,4,8 -r 50 -d 64 --eager --format json > "$OUT/$name-eager.json"
done
if [ "${SKIP_BIG:-0}" != 1 ]; then
  [ -f "$BIG" ] || strata make-model "$BIG" --preset flash-next --layers 8 --type Q8_0 --ngram-vocab 1000 --seed 0 > /dev/null
  strata verify-bench "$BIG" --device gpu --window 1,2,4,8 -r 50 -d 512 --format json > "$OUT/flash-next-8l-graph.json"
  python3 bench/graph_costs.py "$BIG" --window 1 8 --context 512 > "$OUT/flash-next-8l-costs.txt"
fi
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for f in sorted(out.glob("*.json")):
    doc = json.loads(f.read_text())
    if f.name.startswith("nodes"):
        m = doc["meta"]
        print(f"{f.stem}: {m['nodes']} nodes, {m['edges']} edges; " +
              ", ".join(f"{r['count']}x {r['node']}" for r in doc["rows"]))
        continue
    for r in doc["rows"]:
        extra = f" | read {r['read_bytes'] / 1e9:.3f} GB floor {r['floor_ms']:.3f} ms x{r['x_floor']:.2f}" if r.get("floor_ms") else ""
        print(f"{f.stem:28s} T={r['window']:<2} {r['ms_median']:8.3f} ms (p10 {r['ms_p10']:.3f} p90 {r['ms_p90']:.3f})"
              f" host {r['host_ms']:.3f} ms capture {r.get('capture_ms') or 0:.1f} ms{extra}")
PY
[ -f "$OUT/flash-next-8l-costs.txt" ] && head -n 14 "$OUT/flash-next-8l-costs.txt" || true
