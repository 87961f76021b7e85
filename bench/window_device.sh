#!/usr/bin/env bash
# The GPU window's device check (issues 16 item 2, 18 items 1 and 3), one call from the repo root, <= 5 minutes:
#   1. the gpu tests the one layer recorder, the T-keyed paths, the per-layer node count and PDL touch (-v), then
#      bench/pdl_bench.py: the window graph on programmatic edges against ordinary ones, T = 1, 2, 8 on $1 (issue 18)
#   2. strata graph-nodes (with its "nodes per layer" line) on the tiny default model, T = 1 and 4, and, if
#      present, an 8-layer Flash-Next file ($FN8, default /tmp/fn8.gguf), T = 1
#   3. bench/window_paths_bench.py: CUDA-core and tensor-core GEMVs at T = 1, 2, 4, 8 on $1 (checks WINDOW_PATHS)
#   4. verify-bench T = 1, 2, 4, 8, 16 on $1 (its t/t(1) column: t(T)/t(1)), a short table last
# Usage: bench/window_device.sh MODEL.gguf
set -uo pipefail
MODEL=${1:?usage: bench/window_device.sh MODEL.gguf}
FN8=${FN8:-/tmp/fn8.gguf}
export STRATA_REQUIRE_GPU=1
strata() { python3 -m strata_cli "$@"; }
step() { local name=$1 limit=$2; shift 2; echo "=== $name"; timeout "$limit" "$@"; echo "=== $name rc=$?"; }
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")

step gpu-tests 80 python3 -m pytest -v -p no:cacheprovider $XDIST -m gpu tests/test_gpu_hc_read.py \
  tests/test_gpu_window_nodes.py tests/test_gpu_dense.py tests/test_gpu_q8r.py tests/test_gpu_engine.py tests/test_gpu_graphs.py tests/test_gpu_profile.py \
  tests/test_gpu_window_contract.py tests/test_gpu_pdl.py
# the PDL A/B (issue 18) right after the tests: the decision of this call, so it runs before any later step can
# eat the call's limit
step pdl 60 python3 bench/pdl_bench.py "$MODEL" --window 1 2 8 -r 30 --pairs 3 -d 128
step cpu-tests 20 python3 -m pytest -q -p no:cacheprovider tests/test_window_steps.py tests/test_stage_timing.py \
  tests/test_launch_checks.py tests/test_window_nodes.py
for T in 1 4; do
  step "graph-nodes default T=$T" 15 bash -c "python3 -m strata_cli graph-nodes --window $T | head -4"
done
[ -f "$FN8" ] && step "graph-nodes fn8 T=1" 30 bash -c "python3 -m strata_cli graph-nodes '$FN8' --window 1 | head -4"
step paths 45 python3 bench/window_paths_bench.py "$MODEL" --window 1 2 4 8 -r 20 -d 128
VB=$(mktemp)
step verify-bench 60 bash -c "python3 -m strata_cli verify-bench '$MODEL' --device gpu --window 1,2,4,8,16 -r 30 \
  -d 512 --format json > $VB"
python3 - "$VB" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
print(f"{'T':>3} {'ms/window':>10} {'t/t(1)':>7} {'x floor':>8}")
for r in rows:
    x = r.get("x_floor")
    print(f"{r['window']:>3} {r['ms_median']:>10.3f} {r['ms_vs_t1']:>7.2f} {x if x is None else f'{x:8.2f}'}")
PY
