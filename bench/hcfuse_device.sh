#!/usr/bin/env bash
# Device driver of the fused HC read and GDN launches (STRATA_FUSED_HC, STRATA_FUSED_GDN; issue 11). cwd = a copy
# of the worktree, PYTHONPATH set, $OUT, $STRATA_FIXTURES, $BUDGET_S given. Writes $OUT/hcfuse.log only; a short
# table last (node counts, old vs fused ms per T).
set -u
LOG="$OUT/hcfuse.log"
BUDGET=${BUDGET_S:-90}
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
say() { echo "$@" | tee -a "$LOG"; }
step() {  # step NAME SECONDS CMD...: run with a timeout capped by the budget left; record rc and seconds
  local name=$1 want=$2; shift 2
  local l; l=$(left); if (( l < 8 )); then say "SKIP $name (budget: ${l}s left)"; echo "$name skipped" >> "$ROWS"; return; fi
  (( want > l - 3 )) && want=$(( l - 3 ))
  local s=$(date +%s)
  say "=== $name (timeout ${want}s)"
  timeout "$want" "$@" > "$TMPD/$name.out" 2>&1; local rc=$?
  cat "$TMPD/$name.out" >> "$LOG"
  say "=== $name rc=$rc $(( $(date +%s) - s ))s"
  echo "$name rc=$rc $(( $(date +%s) - s ))s" >> "$ROWS"
}
TMPD=$(mktemp -d)
ROWS=$TMPD/rows
say "hcfuse device run, tree $(cat .commit 2>/dev/null || echo '?'), $(date -u +%H:%M:%S)"
FX=$STRATA_FIXTURES/model-q8_0.gguf
step tests-fused 45 env STRATA_REQUIRE_GPU=1 python3 -m pytest -q -n 8 -m gpu tests/test_gpu_hc_fused.py
step tests-engine-fused 40 env STRATA_REQUIRE_GPU=1 STRATA_FUSED_HC=1 STRATA_FUSED_GDN=1 python3 -m pytest -q -n 8 -m gpu tests/test_gpu_engine.py tests/test_gpu_window_contract.py
if [ -f /tmp/fn8.gguf ]; then
  step bench-fused 60 env STRATA_FUSED_HC=1 STRATA_FUSED_GDN=1 python3 -m strata_cli verify-bench /tmp/fn8.gguf --device gpu --window 1,2,4,8 -r 50 -d 512 --format csv
  step bench-old 60 env STRATA_FUSED_HC=0 STRATA_FUSED_GDN=0 python3 -m strata_cli verify-bench /tmp/fn8.gguf --device gpu --window 1,2,4,8 -r 50 -d 512 --format csv
  step nodes-old 10 env STRATA_FUSED_HC=0 STRATA_FUSED_GDN=0 python3 -m strata_cli graph-nodes "$FX" --window 1 --format csv
  step nodes-fused 10 env STRATA_FUSED_HC=1 STRATA_FUSED_GDN=1 python3 -m strata_cli graph-nodes "$FX" --window 1 --format csv
  step profile-fused 60 env STRATA_FUSED_HC=1 STRATA_FUSED_GDN=1 python3 -m strata_cli profile /tmp/fn8.gguf --window 1 -r 30 -d 512
else
  say "SKIP fn8 steps: /tmp/fn8.gguf missing"
  step nodes-old 10 env STRATA_FUSED_HC=0 STRATA_FUSED_GDN=0 python3 -m strata_cli graph-nodes "$FX" --window 1 --format csv
  step nodes-fused 10 env STRATA_FUSED_HC=1 STRATA_FUSED_GDN=1 python3 -m strata_cli graph-nodes "$FX" --window 1 --format csv
fi
say ""
say "--- summary (step, rc, seconds; rc 0 = passed); node counts: the 'nodes' lines above"
cat "$ROWS" | tee -a "$LOG"
python3 - "$TMPD" <<'PY' 2>&1 | tee -a "$LOG"
import csv, io, pathlib, re, sys
d = pathlib.Path(sys.argv[1])
def bench(name):
    f = d / f"{name}.out"
    if not f.exists():
        return {}
    text = f.read_text().splitlines()
    head = next((i for i, l in enumerate(text) if l.startswith("window,")), None)
    if head is None:
        return {}
    lines = [text[head]] + [l for l in text[head + 1:] if l[:1].isdigit()]
    rows = [r for r in csv.DictReader(io.StringIO("\n".join(lines))) if r.get("window", "").isdigit()]
    return {int(r["window"]): r for r in rows}
for name in ("nodes-old", "nodes-fused"):
    f = d / f"{name}.out"
    m = re.search(r"(\d+) nodes, (\d+) edges", f.read_text()) if f.exists() else None
    print(f"{name}: {m.group(1) + ' nodes' if m else 'n/a'} (fixture q8_0, T=1)")
old, new = bench("bench-old"), bench("bench-fused")
print("T | old ms | fused ms | floor ms | fused x floor | old/fused")
for T in sorted(set(old) | set(new)):
    o, n = old.get(T, {}), new.get(T, {})
    om, nm = o.get("ms_median", "n/a"), n.get("ms_median", "n/a")
    try:
        ratio = f"{float(om) / float(nm):.3f}"
    except ValueError:
        ratio = "n/a"
    print(f"{T} | {om} | {nm} | {n.get('floor_ms', o.get('floor_ms', 'n/a'))} | {n.get('x_floor', 'n/a')} | {ratio}")
PY
rm -rf "$TMPD"
