#!/bin/bash
# bench/quant_gpu.sh: device check of gemv_quant.cu's staged GEMVs (issues 12, 18) (repo root, $OUT set; ~240 s):
#   1. compile the variants it uses (bench/warm_kernels.py, 16 processes),
#   2. tests/test_gpu_quant.py on the benchmark recipes' types (the numpy/gguf references, odd shapes,
#      T = 1..16, dense and expert-strided, row views, graph replay),
#   3. bench/quant_gemv_bench.py (expert GB/s per type and T; the JSON line is printed last).
# One log: $OUT/quant.log.
set -u
LOG=${OUT:-.}/quant.log
BUDGET=${BUDGET_S:-240}
T0=$(date +%s)
left() { local l=$((BUDGET - ($(date +%s) - T0))); echo $((l > 5 ? l : 5)); }
TYPES="Q4_K Q2_K Q3_K Q5_K Q6_K Q4_0 Q5_1 IQ2_XS IQ3_XXS IQ4_NL IQ4_XS MXFP4"
BENCH_TYPES=${QUANT_BENCH_TYPES:-Q8_0,Q4_0,Q4_K,Q5_K,Q6_K,Q2_K,Q3_K,IQ2_XS,IQ3_XXS,IQ4_XS,MXFP4}
MODS="gemv moe"  # Q8_0 experts and the grouping (the 256-block types' down projection is Q4_0, in TYPES)
for t in $TYPES; do MODS="$MODS gemv_quant.${t,,}"; done
K="not fixture and not gather and (two_types or $(echo $TYPES | sed 's/ / or /g'))"
{
    echo "== $(date -u +%T) warm: $MODS"
    timeout 50 python3 bench/warm_kernels.py --jobs 16 $MODS 2>&1 | tail -2
    echo "== $(date -u +%T) tests, $(left) s left: -k '$K'"
    TEST_S=$(($(left) - 110)); [ "$TEST_S" -lt 15 ] && TEST_S=15  # leave the bench ~110 s
    STRATA_REQUIRE_GPU=1 timeout $TEST_S python3 -m pytest -q -n 12 -m gpu -p no:cacheprovider -rfE \
        tests/test_gpu_quant.py -k "$K" 2>&1 | tail -25
    echo "pytest rc=${PIPESTATUS[0]} (124: cut by the time budget)"
    echo "== $(date -u +%T) bench, $(left) s left"
    timeout $(($(left) - 2)) python3 bench/quant_gemv_bench.py --types "$BENCH_TYPES" 2>&1 | tail -60
    echo "== $(date -u +%T) done in $(($(date +%s) - T0)) s"
} > "$LOG" 2>&1
