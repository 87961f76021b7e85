#!/usr/bin/env bash
# Issue 20's benchmark of the adaptive expert cache on one model file, one device call, repo root as cwd:
#   1. token files: the first $TRAIN_TOKENS ids of $TRAIN and the first $HELD_TOKENS of $HELD (the model's tokenizer);
#   2. make-profile of the training tokens (the profile) and of the held-out ones (their counts and routing trace),
#      --expert-cache auto: every expert in VRAM when they fit (the engine's "expert cache:" line, in the table);
#   3. the slots each of $SIZES holds by that profile (the engine's choice); cache-sim of the held-out trace under
#      $POLICIES and profile-info --holdout at those slots (cache-sim's static hit rate must equal profile-info's);
#   4. verify-bench T = 1 and 8 on the held-out tokens per size and policy: t_verify, the VRAM share (hit rate);
#   5. the summary table (bench/cache_policy_lib.py table): always, also when a run failed, was cut or the step was
#      stopped (SIGINT / SIGTERM); a row that did not finish says why.
# Each run has its own limit (timeout -k 5): its percentage of the step's limit $STEP_LIMIT_S (bench/device.sh
# exports it; 10 s at least), never more than what is left of it less $RESERVE_S (the table's time).
# Env: FN (the model), OUT (the folder of cache_policy.log), STEP_LIMIT_S (300), TRAIN / HELD (text files: README.md,
#      docs/BENCHMARKS.md), TRAIN_TOKENS (2048), HELD_TOKENS (1024), SIZES (12GiB,24GiB), POLICIES (static,lru,lfu),
#      DEVICE (gpu; cpu: a dry run on the numpy engine, no hit rates), DEPTH (256), REPS (8), RESERVE_S (15).
set -u
FN=${FN:?FN: the model file}; OUT=${OUT:-/tmp/strata-cache}; LIMIT=${STEP_LIMIT_S:-300}; RESERVE=${RESERVE_S:-15}
TRAIN=${TRAIN:-README.md}; HELD=${HELD:-docs/BENCHMARKS.md}; TRAIN_TOKENS=${TRAIN_TOKENS:-2048}
HELD_TOKENS=${HELD_TOKENS:-1024}; SIZES=${SIZES:-12GiB,24GiB}; POLICIES=${POLICIES:-static,lru,lfu}
DEVICE=${DEVICE:-gpu}; DEPTH=${DEPTH:-256}; REPS=${REPS:-8}
WORK=$(mktemp -d /tmp/cache-policy.XXXX); LOG=$OUT/cache_policy.log; mkdir -p "$OUT"; : > "$LOG"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
LIB=(python3 bench/cache_policy_lib.py); STRATA=(python3 -m strata_cli)
T0=$(date +%s); CHILD=; CURRENT=; FAILED=0
say() { echo "$*" | tee -a "$LOG"; }

run() {  # run NAME PERCENT CMD...: stdout to $WORK/NAME.out, stderr .err, "RC LIMIT" to .rc (lib's status())
  local name=$1 pct=$2 left limit rc; shift 2
  left=$(( LIMIT - RESERVE - ($(date +%s) - T0) )); limit=$(( LIMIT * pct / 100 ))
  [ "$limit" -lt 10 ] && limit=10
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 5 ]; then echo skipped > "$WORK/$name.rc"; say "## $name skipped (budget)"; FAILED=1; return 1; fi
  # in the background, so that a signal to this script is handled at once (finish), not after the run
  timeout -k 5 "$limit" "$@" > "$WORK/$name.out" 2> "$WORK/$name.err" & CHILD=$! CURRENT=$name
  wait "$CHILD"; rc=$?; CHILD=
  echo "$rc $limit" > "$WORK/$name.rc"; [ "$rc" = 0 ] || FAILED=1
  say "## $name rc=$rc (limit $limit s) at $(( $(date +%s) - T0 )) s: $*"
  grep -v '^[[:space:]]*$' "$WORK/$name.err" | cut -c1-300 | tail -n 3 | sed 's/^/# /' | tee -a "$LOG"
  cat "$WORK/$name.out" >> "$LOG"
  return "$rc"
}

finish() {  # the summary table of whatever ran, then the work folder removed (exit status 1 if a run failed)
  if [ -n "$CHILD" ]; then kill -TERM "$CHILD" 2>/dev/null; wait "$CHILD"; echo stopped > "$WORK/$CURRENT.rc"; fi
  say "## summary: $FN, train $TRAIN, held-out $HELD, device $DEVICE, $(( $(date +%s) - T0 )) s of $LIMIT s"
  "${LIB[@]}" table "$WORK" "$SIZES" "$POLICIES" | tee -a "$LOG"
  rm -rf "$WORK"
}
trap 'finish; exit 130' INT TERM

say "# cache-policy run: commit ${STRATA_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}, $FN, step limit $LIMIT s"
if run train-tokens 5 "${LIB[@]}" tokens "$FN" "$TRAIN" "$TRAIN_TOKENS" "$WORK/train.tok" &&
   run held-tokens 5 "${LIB[@]}" tokens "$FN" "$HELD" "$HELD_TOKENS" "$WORK/held.tok" &&
   run profile 20 "${STRATA[@]}" make-profile "$FN" --device "$DEVICE" --tokens "$WORK/train.tok" --window 16 \
     -o "$WORK/train.yaml" --format csv; then
  if run held 16 "${STRATA[@]}" make-profile "$FN" --device "$DEVICE" --tokens "$WORK/held.tok" --window 16 \
       -o "$WORK/held.yaml" --trace "$WORK/held.npz" --format csv &&
     run slots 5 "${LIB[@]}" slots "$FN" "$WORK/train.yaml" "$SIZES"; then
    SLOTS=$(tail -n +2 "$WORK/slots.out" | cut -d, -f2 | paste -sd,)
    run sim 5 "${STRATA[@]}" cache-sim "$WORK/held.npz" --profile "$WORK/train.yaml" --slots "$SLOTS" \
      --policy "$POLICIES" --format csv
    run info 5 "${STRATA[@]}" profile-info "$WORK/train.yaml" --holdout "$WORK/held.yaml" --slots "$SLOTS" \
      --format csv
  fi
  for size in ${SIZES//,/ }; do
    for policy in ${POLICIES//,/ }; do
      run "bench-$size-$policy" 14 "${STRATA[@]}" verify-bench "$FN" --device "$DEVICE" --window 1,8 -r "$REPS" \
        --warmup 2 -d "$DEPTH" --tokens "$WORK/held.tok" --expert-profile "$WORK/train.yaml" --expert-cache "$size" \
        --expert-policy "$policy" --format csv
    done
  done
fi
finish
exit "$FAILED"
