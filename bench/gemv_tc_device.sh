#!/usr/bin/env bash
# engineer "gemv8" (issue 11): the tensor-core Q8_0_R32 dense GEMVs (STRATA_GEMV_TC=1) on the H200.
# 1. tests/test_gpu_q8r.py -k tensor_core (odd shapes, T = 2..19, NaN-poisoned, huge/tiny x, eager vs replay)
# 2. bench/gemv_tc_bench.py: Flash-Next shapes, T = 1, 2, 4, 8, CUDA cores vs tensor cores
# 3. strata verify-bench /tmp/fn8.gguf --window 1,2,4,8 -r 50 -d 512, TC=1 then TC=0
# 4. with STRATA_GEMV_TC=1: tests/test_gpu_q8r.py, test_gpu_dense.py, test_gpu_engine.py (GPU vs numpy, replay = eager)
# 5. the bench again at T = 2, 8 over Q8T_DEPTH:Q8T_ROWS:Q8T_MIN_BLOCKS 2:2:1 2:2:2 4:1:2 2:1:1 (3 compiles)
# Steps run in that order while the budget (GEMV8_BUDGET_S, else BUDGET_S, else 90 s) lasts; ~250 s for all.
# One log: $OUT/gemv8.log, a short table last. Every step under `timeout`, skipped when the budget is spent.
cd "$(dirname "$0")/.." || exit 1
LOG=${OUT:-/tmp}/gemv8.log
BUDGET=${GEMV8_BUDGET_S:-${BUDGET_S:-90}}
SUM=/tmp/gemv8.sum.$$
START=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - START))); }
step() {  # step NAME SECONDS CMD...: run if the budget allows, log rc and duration
    local name=$1 want=$2; shift 2
    local have; have=$(left)
    if [ "$have" -lt 10 ]; then echo "## $name: SKIPPED (budget left ${have}s)" >>"$LOG"; echo "$name skipped" >>"$SUM"; return; fi
    [ "$want" -gt "$have" ] && want=$have
    echo "## $name (limit ${want}s)" >>"$LOG"
    local t0; t0=$(date +%s)
    timeout "$want" "$@" >>"$LOG" 2>&1
    local rc=$?
    echo "## $name: rc=$rc in $(( $(date +%s) - t0 ))s" >>"$LOG"
    echo "$name rc=$rc $(( $(date +%s) - t0 ))s" >>"$SUM"
}
: >"$LOG"; : >"$SUM"
echo "gemv8 $(git rev-parse --short HEAD 2>/dev/null || cat .gemv8_commit 2>/dev/null) $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" >>"$LOG"
step "tc-tests" 45 python -m pytest -q -x -p no:cacheprovider tests/test_gpu_q8r.py -k tensor_core
step "bench" 30 python bench/gemv_tc_bench.py --window 1 2 4 8 --launches 10
if [ -f /tmp/fn8.gguf ]; then
    for tc in 1 0; do
        step "verify-bench tc=$tc" 75 env STRATA_GEMV_TC=$tc python -m strata_cli verify-bench /tmp/fn8.gguf \
            --device gpu --window 1,2,4,8 -r 50 -d 512 --format csv
    done
fi
step "tc-suite" 90 env STRATA_GEMV_TC=1 python -m pytest -q -p no:cacheprovider tests/test_gpu_q8r.py \
    tests/test_gpu_dense.py tests/test_gpu_engine.py
step "bench-variants" 60 python bench/gemv_tc_bench.py --window 2 8 --launches 10 --variant 2:2:1 2:2:2 4:1:2 2:1:1
{
    echo "== summary (steps) =="
    cat "$SUM"
    echo "== tensor cores vs CUDA cores, us per launch (bench) =="
    grep -E "^  (head|gdn_qkv|gdn_z|out|hc_down|hc_up|shexp_up|shexp_down|attn_k|attn_q) +T=|all shapes" "$LOG" | head -44
    echo "== verify-bench (CSV rows, tc=1 first) =="
    awk '/^## verify-bench tc=[01] \(/{p=1; print; next} /^## /{p=0} p && /,/' "$LOG" | cut -c1-240 | head -14
} >>"$LOG"
rm -f "$SUM"
