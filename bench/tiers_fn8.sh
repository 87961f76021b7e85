#!/usr/bin/env bash
# Expert tiers on the 8-layer Flash-Next Q8_0 file (issue 10's benchmark), one short device call, repo root as cwd:
#   the GPU tier tests; verify-bench --expert-cache 0 with --pcie-frac 0 / 0.25 / 0.5 / auto and --split (auto);
#   make-profile --device gpu; the cache at 25 / 50 / 75 % of the pairs by that profile. T = 1,2,4,8, one sequence
#   after a 512-token context. Every step has a timeout and runs only while the budget lasts.
# Env: OUT (folder; ONE log: $OUT/tiers.log), FN (default /tmp/fn8.gguf), BUDGET_S (default 150), STRATA_FIXTURES.
# The log: each run's CSV under a '## name' line, its stderr (what the engine chose) as '# ' lines, then a summary.
set -u
OUT=${OUT:-/tmp/strata-tiers}; FN=${FN:-/tmp/fn8.gguf}; BUDGET=${BUDGET_S:-150}
LOG=$OUT/tiers.log; WORK=$(mktemp -d /tmp/tiers-fn8.XXXX)
mkdir -p "$OUT"; : > "$LOG"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
T0=$(date +%s); left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
say() { echo "$*" | tee -a "$LOG"; }
say "# tiers device run: commit ${STRATA_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}, $FN, budget $BUDGET s"
# the file's pages into the page cache meanwhile (the pool and the PCIe copies read them through the mapping)
( timeout 30 cat "$FN" > /dev/null 2>&1 & )

# 1. the GPU tier tests (the new ones and the old, several processes)
STRATA_REQUIRE_GPU=1 timeout 55 python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/test_gpu_tiers.py \
  > "$WORK/tests.txt" 2>&1
say "## tests rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "passed|failed|error|^(FAILED|ERROR)|Error" "$WORK/tests.txt" | cut -c1-300 | tail -15 | sed 's/^/# /' >> "$LOG"

bench() {  # name, seconds, verify-bench options
  local name=$1 limit=$2; shift 2
  if [ "$(left)" -lt $(( limit / 2 )) ]; then say "## $name skipped (budget)"; return; fi
  [ "$limit" -gt "$(left)" ] && limit=$(left)
  timeout "$limit" python3 -m strata_cli verify-bench "$FN" --device gpu --window 1,2,4,8 -r 10 --warmup 1 -d 512 \
    --format csv "$@" > "$WORK/$name.csv" 2> "$WORK/$name.err"
  local rc=$?
  say "## $name rc=$rc at $(( $(date +%s) - T0 )) s: $*"
  grep -v "^\s*$" "$WORK/$name.err" | cut -c1-400 | tail -6 | sed 's/^/# /' >> "$LOG"
  cat "$WORK/$name.csv" >> "$LOG"
}
# 2. the PCIe share beside the CPU pool, nothing in VRAM
bench c0-auto 25 --expert-cache 0 --pcie-frac auto
bench c0-p0 25 --expert-cache 0 --pcie-frac 0
bench c0-p0.5 25 --expert-cache 0 --pcie-frac 0.5
# the copies issued on the serving thread instead of the copy thread (does the thread overlap them with the pool?)
STRATA_PCIE_COPY_THREAD=0 bench c0-auto-nothread 25 --expert-cache 0 --pcie-frac auto
bench c0-p0.25 25 --expert-cache 0 --pcie-frac 0.25
bench c0-auto-split 25 --expert-cache 0 --split
# 3. a profile from the GPU engine, then 25 / 50 / 75 % of the 4096 pairs by it
PROFILE=()
if [ "$(left)" -gt 40 ]; then
  timeout 25 python3 -m strata_cli make-profile "$FN" --device gpu --random 256 --window 16 --ctx 300 \
    -o "$WORK/fn8.yaml" --format csv > "$WORK/profile.csv" 2> "$WORK/profile.err"
  rc=$?; say "## make-profile rc=$rc at $(( $(date +%s) - T0 )) s"
  tail -3 "$WORK/profile.err" | cut -c1-300 | sed 's/^/# /' >> "$LOG"; cat "$WORK/profile.csv" >> "$LOG"
  [ $rc = 0 ] && PROFILE=(--expert-profile "$WORK/fn8.yaml")
fi
bench cache-sweep 50 --expert-cache 1024,2048,3072 "${PROFILE[@]}"
say "## total $(( $(date +%s) - T0 )) s"
python3 bench/tiers_summary.py "$WORK" | tee -a "$LOG"
rm -rf "$WORK"
