#!/usr/bin/env bash
# Device driver of the fused HC read and GDN launches (STRATA_FUSED_HC, STRATA_FUSED_GDN; issue 11). cwd = a copy of the worktree,
# PYTHONPATH set, $OUT, $STRATA_FIXTURES, $BUDGET_S given. Writes $OUT/hcfuse.log only; a short table last.
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
  timeout "$want" "$@" >> "$LOG" 2>&1; local rc=$?
  say "=== $name rc=$rc $(( $(date +%s) - s ))s"
  echo "$name rc=$rc $(( $(date +%s) - s ))s" >> "$ROWS"
}
ROWS=$(mktemp)
say "hcfuse device run, tree $(cat .commit 2>/dev/null || echo '?'), $(date -u +%H:%M:%S)"
FX=$STRATA_FIXTURES/model-q8_0.gguf
step tests-fused 25 env STRATA_REQUIRE_GPU=1 python3 -m pytest -q -n 8 -m gpu tests/test_gpu_hc_fused.py
step tests-engine-fused 30 env STRATA_REQUIRE_GPU=1 STRATA_FUSED_HC=1 STRATA_FUSED_GDN=1 python3 -m pytest -q -n 8 -m gpu tests/test_gpu_engine.py tests/test_gpu_window_contract.py
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
rm -f "$ROWS"
