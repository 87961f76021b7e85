#!/usr/bin/env bash
# The asynchronous commit's device check (issue 18 item 4), one call from the repo root, <= 5 minutes:
#   1. the gpu tests of the commit (async against a synchronous commit, bit for bit: graph/eager, tiers off and
#      cache 3 + PCIe 0.5, the layer split) and of the engines whose commit changed (-v)
#   2. bench/commit_async_bench.py: the `logprobs --draft-noise` loop, async against sync commit, on the fixture
#      (tiers off, then --expert-cache 3 --pcie-frac 0.5), on the `small` preset ($SMALL, written if missing) and,
#      if given, on MODEL ($1)
# Usage: bench/commit_async_device.sh [MODEL.gguf]
set -uo pipefail
MODEL=${1:-}
SMALL=${SMALL:-/tmp/small-q8_0.gguf}
export STRATA_REQUIRE_GPU=1
step() { local name=$1 limit=$2; shift 2; echo "=== $name"; timeout "$limit" "$@"; echo "=== $name rc=$?"; }
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")

step gpu-tests 150 python3 -m pytest -v -p no:cacheprovider $XDIST -m gpu tests/test_gpu_commit_async.py \
  tests/test_gpu_engine.py tests/test_gpu_layer_split.py tests/test_gpu_tiers_pcie.py tests/test_gpu_profile.py \
  tests/test_gpu_window_contract.py
step cpu-tests 30 python3 -m pytest -q -p no:cacheprovider tests/test_commit_async_cpu.py \
  tests/test_layer_split_orchestration.py
step bench-fixture 30 python3 bench/commit_async_bench.py --tokens 512 --window 8 --draft-noise 0.3 --reps 5
step bench-fixture-tiers 60 python3 bench/commit_async_bench.py --tokens 256 --window 8 --draft-noise 0.3 \
  --reps 3 --expert-cache 3 --pcie-frac 0.5
[ -f "$SMALL" ] || step make-small 60 python3 -m strata_cli make-model "$SMALL" --preset small --type Q8_0 --seed 1
step bench-small 60 python3 bench/commit_async_bench.py "$SMALL" --tokens 512 --window 8 --draft-noise 0.3 --reps 5
[ -n "$MODEL" ] && step bench-model 120 python3 bench/commit_async_bench.py "$MODEL" --tokens 512 --window 8 \
  --draft-noise 0.3 --reps 3
exit 0
