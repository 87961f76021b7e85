#!/usr/bin/env bash
# The adaptive expert cache (issue 20) on one model file, one device call, repo root as cwd:
#   1. make-profile --device gpu over a training text (the profile), and over a held-out text (its trace);
#   2. cache-sim of the held-out trace: static / lru / lfu at the slots that 12 GiB and 24 GiB of experts hold;
#   3. verify-bench --text-file HELD, T = 1,2,4,8 after 512 tokens, --expert-cache 12GiB and 24GiB by that profile,
#      with --expert-policy static, lru and lfu: t_verify, the VRAM share (the hit rate), swaps and MB copied.
# Env: OUT (folder; ONE log: $OUT/cache_policy.log), FN (the model, e.g. side_by_side.sh's full-size file),
#      TRAIN / HELD (text files; default README.md / docs/BENCHMARKS.md), BUDGET_S (default 540), SIZES (12GiB,24GiB).
# Every step has a timeout and runs only while the budget lasts; each run's CSV goes under a '## name' line.
set -u
OUT=${OUT:-/tmp/strata-cache}; FN=${FN:?FN: the model file}; BUDGET=${BUDGET_S:-540}
TRAIN=${TRAIN:-README.md}; HELD=${HELD:-docs/BENCHMARKS.md}; SIZES=${SIZES:-12GiB,24GiB}
LOG=$OUT/cache_policy.log; WORK=$(mktemp -d /tmp/cache-policy.XXXX)
mkdir -p "$OUT"; : > "$LOG"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
T0=$(date +%s); left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
say() { echo "$*" | tee -a "$LOG"; }
say "# cache-policy device run: commit ${STRATA_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}, $FN, train $TRAIN, held $HELD"
step() {  # name, seconds, strata arguments (CSV on stdout)
  local name=$1 limit=$2; shift 2
  if [ "$(left)" -lt $(( limit / 2 )) ]; then say "## $name skipped (budget)"; return 1; fi
  [ "$limit" -gt "$(left)" ] && limit=$(left)
  timeout "$limit" python3 -m strata_cli "$@" --format csv > "$WORK/$name.csv" 2> "$WORK/$name.err"
  local rc=$?
  say "## $name rc=$rc at $(( $(date +%s) - T0 )) s: $*"
  grep -v "^\s*$" "$WORK/$name.err" | cut -c1-400 | tail -4 | sed 's/^/# /' >> "$LOG"
  cat "$WORK/$name.csv" >> "$LOG"
  return $rc
}
step profile 90 make-profile "$FN" --device gpu --text-file "$TRAIN" --window 16 -o "$WORK/train.yaml" || exit 1
step held 90 make-profile "$FN" --device gpu --text-file "$HELD" --window 16 -o "$WORK/held.yaml" \
  --trace "$WORK/held.npz" || exit 1
SLOTS=$(python3 - "$FN" "$SIZES" <<'PY'
import sys
from strata_cli.model.gguf_file import open_model
from strata_cli.tiers.residency import expert_bytes, parse_size
per = int(expert_bytes(open_model(sys.argv[1])).max())
print(",".join(str(parse_size(s, "SIZES") // per) for s in sys.argv[2].split(",")))
PY
)
step cache-sim 60 cache-sim "$WORK/held.npz" --profile "$WORK/train.yaml" --slots "$SLOTS"
for size in ${SIZES//,/ }; do
  for policy in static lru lfu; do
    step "bench-$size-$policy" 120 verify-bench "$FN" --device gpu --window 1,2,4,8 -r 10 --warmup 2 -d 512 \
      --text-file "$HELD" --expert-profile "$WORK/train.yaml" --expert-cache "$size" --expert-policy "$policy"
  done
done
say "## summary: size policy T ms_median vram_share(hit rate) swaps fill_mb fill_late"
for f in "$WORK"/bench-*.csv; do
  python3 - "$f" <<'PY' | tee -a "$LOG"
import csv, sys
name = sys.argv[1].rsplit("/", 1)[-1][len("bench-"):-len(".csv")]
for r in csv.DictReader(open(sys.argv[1])):
    print(name.replace("-", " "), r["window"], r["ms_median"], r.get("vram_share"), r.get("swaps"), r.get("fill_mb"),
          r.get("fill_late"))
PY
done
say "## total $(( $(date +%s) - T0 )) s"
rm -rf "$WORK"
