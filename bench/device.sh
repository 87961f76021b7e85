#!/usr/bin/env bash
# One device call, from the repository root on the GPU machine: named steps run in order, each under its own time
# limit, each step's output kept apart under $OUT, and a table of the steps (rc, seconds) printed last.
#
#   bash bench/device.sh STEP[:SECONDS] ...
#
# Steps:
#   setup        install the carried wheels (.whl/*.whl) into /tmp/site; print the card, driver, CuPy, host cores
#   peer         start the llama.cpp build and the full-size Flash-Next file in the background (.peer/side_by_side.sh
#                prepare; they run on between calls while the machine stays warm)
#   synth        start only the full-size file's writer in the background (no llama.cpp build: a call that needs the
#                file but not the peer keeps its cores; the path and name are the ones `peer` writes, so a later sbs
#                reuses the file and only builds llama.cpp)
#   ready        wait (up to the step's limit) until the full-size file is written (its writer ended, the file there)
#                (both look for the writer's python3 command line: a plain pgrep -f of its name matched the step's
#                own bash -c, whose text holds the name, so until 2026-12-03 synth never started the writer)
#   warm         compile every kernel module in parallel (bench/warm_kernels.py): 65-89 s cold with 16 processes
#                (2026-12-02, gemv.cu per weight type; 124 s while it was one module)
#   gpu          the whole GPU suite, -v so each result keeps its name even when the step is cut
#   gpu=EXPR     the GPU tests whose file names match EXPR (a pytest -k expression over tests/test_gpu_*.py)
#   ids=FILE     the GPU tests whose node ids FILE lists (one a line), short tracebacks kept in ids-FILE.log
#   pool         bench/pool_bench.py on the host's cores, every type the engine reads
#   pool1        the same on one thread (per-core rates: a type slow on 16 threads but not on one scales badly)
#   pool-sweep   issue 17's diagnosis of the pool from DRAM (~150 s): bench/pool_bench.py --sweep over Q8_0, Q4_0,
#                Q2_K+Q4_0, MXFP4 ($POOL_SWEEP_TYPES), 1..16 threads, 4 KB / 2 MB / file pages, the pool with its
#                per-thread profile, the same items only read (touch), a plain read of the same bytes, the L3-hot pool,
#                and the A/B builds $POOL_AB at 1 and 16 threads; the summary printed, the whole output and JSON in
#                pool-sweep.out / .json
#   pool-bind    the pool, touch and read at all threads with OMP_PROC_BIND=close OMP_PLACES=cores (~20 s)
#   gemv         bench/quant_gemv_bench.py (routed-expert GEMVs per type and T), each type in its own process (a
#                kernel fault of one type then leaves the others' rows); each type's whole output (tracebacks) in
#                gemv-TYPE.txt
#   gemv-ab      bench/quant_gemv_bench.py --probe: Q2_K, Q4_0, Q8_0 as the engine holds them, the block types with
#                their decode-free probe rows, every variant checked against numpy before it is timed, and the dense
#                Q8_0 rows; whole output in gemv-ab.txt
#   ncu          Nsight Compute (--clock-control none) over bench/quant_gemv_bench.py's routed-expert kernels
#                ($NCU_TYPES, default Q2_K; T = $NCU_T, default "1 8"): speed of light, occupancy, warp stall reasons,
#                scheduler and memory sections of the qtc_* launches (ncu.txt; the table of each launch last)
#   pinned       bench/pinned_probe.py ($PINNED_ARGS; else --k 10, then --k 4): page-locking's cost, the pool on
#                page-locked experts, the copy engine alone and beside the pool (would the PCIe share gain from
#                page-locked experts?)
#   tiers        bench/tiers_device.sh on the full-size file (PCIe shares 0 / 0.5 / 1 / auto at cache 0)
#   window       bench/window_device.sh on the full-size file (window paths by T, nodes per layer, T = 1..16)
#   cache        bench/cache_policy.sh on the full-size file (issue 20: profile, held-out trace, cache-sim, policies;
#                each run budgeted inside the step's limit, the summary table always printed last; ~300 s)
#                (the full-size file: $FN, else the one .peer/side_by_side.sh prepare wrote)
#   profile      strata profile of the full-size file at T = 1 and 8 (every expert in VRAM; per stage, and per layer
#                in profile-t1.json / profile-t8.json): issue 18's "where the time goes" of record
#   nodes        graph-nodes of the default model's T = 1 / 4 / 8 window graphs (total and per layer)
#   split        issue 21 on one GPU: verify-bench of the full-size file (all experts resident) as one engine and
#                as two stages on device 0 (--gpus 0,0, split by bytes): per-stage ms, bytes, hand-off ms (JSON)
#   commit       issue 18 item 4: bench/commit_async_bench.py, the draft-noise loop with the asynchronous commit
#                against a synchronous one (the same rows checked), on the fixture (tiers off, then cache 3 + PCIe
#                0.5), the small preset (written to /tmp if missing) and the full-size file if there is one
#   blas-probe   bench/blas_spin_probe.py with numpy's BLAS on every core, then on one: the pool's wake and GB/s right
#                after a matmul against after a sleep (is the bench's "late wake" OpenBLAS spinning? ~30 s)
#   engine-ab    bench/engine_ab.sh: the tiered engine on the full-size file with $AB_SRC (another expert_pool.c, e.g.
#                carried in .devcarry) against this tree's pool, runs alternating in one tree ($AB_CACHE, $AB_T, $AB_RUNS)
#   kcache       pack CuPy's kernel cache into $OUT/kcache.tar.gz (copied to .devcarry/kcache.tar.gz, setup restores
#                it: a later fresh machine's warm-up then compiles only what changed)
#   soak         issue 17 under load (bench/soak.py) on the full-size file: $SOAK_WINDOWS (10000) windows of $SOAK_T (4)
#                tokens, -d $SOAK_DEPTH (64) in --ctx $SOAK_CTX (1024), --expert-cache $SOAK_CACHE (24GiB) by $SOAK_PROFILE
#                (else sbs's profile.yaml, else one made here), --pcie-frac $SOAK_PCIE (0.25); memory and the watchdog
#                every 100 windows, the last window against a fresh engine's (soak.json, soak.log)
#   soak-bg      the same soak started in a session of its own (it runs on between calls while the machine stays
#                warm: 10,000 windows take longer than one call); returns at once
#   soak-wait    waits (up to the step's limit; cut, the soak runs on) for soak-bg's run: a progress line a minute,
#                then its JSON and its exit status
#   signals      SIGINT, then SIGTERM, $SOAK_AFTER s (10) into the windows of a tiered verify-bench of the same
#                configuration (bench/soak.py --signal): exit status and seconds, what is left of its process group
#                and on the GPU (signals-INT.json, signals-TERM.json). SOAK_DEVICE=cpu (FN=a small model) checks
#                these steps' plumbing without a GPU
#   sbs=CONFIGS  .peer/side_by_side.sh run CONFIGS (comma-separated: resident,c0,c12,c24): strata and llama.cpp on
#                the full-size file in this call
# Logs go to $LOGS (default /tmp/strata-device); where the device tool's $OUT is set they come back packed in
# $OUT/logs.tgz (it returns at most 8 files).
# Env: LOGS, DEADLINE_S (the whole call's seconds, default 560), POOL_ARGS / GEMV_ARGS (extra bench options), STRATA_GIT_COMMIT (the tree's commit: the device copy has no .git history), SOAK_* (soak, above).
set -u
BACK=${OUT:-}; OUT=${LOGS:-/tmp/strata-device}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
SUMMARY=()

# The device tool kills a call at 600 s, and then logs.tgz is never written: every step's limit is cut to what is
# left of DEADLINE_S (default 560 s from the start of this script), so the steps end and the logs come back.
START=$(date +%s); DEADLINE_S=${DEADLINE_S:-560}

run_step() {  # run_step NAME SECONDS CMD...: output to $OUT/NAME.log and to stdout
    local name=$1 limit=$2; shift 2
    local s=$(date +%s) rc left
    left=$(( START + DEADLINE_S - s ))
    if [ "$left" -lt 5 ]; then SUMMARY+=("$(printf '%-18s skipped (deadline)' "$name")"); return 124; fi
    [ "$limit" -gt "$left" ] && limit=$left
    mkdir -p "$OUT"; echo "=== $name (limit ${limit}s)"
    # SIGINT first: pytest then still prints its summary of failures; SIGKILL 15 s later. The step runs in a session
    # of its own, killed whole when it ends: an inner `timeout` (tiers_device.sh's per-run limits) moves its command
    # to a process group of its own, out of reach of this timeout's signal, and on 2026-12-02 such a survivor (a cut
    # --pcie-frac 0.5 run) computed beside the next step (its verify-bench 35 ms where alone 16) and held the call's
    # stdout open to the device tool's limit. What a step starts on purpose to outlive it (peer) uses setsid itself.
    # STEP_LIMIT_S: the step's own limit (after the deadline's cut), so a step's script can budget inside it
    # (bench/cache_policy.sh) and end before this timeout's SIGINT
    STEP_LIMIT_S=$limit setsid timeout -s INT -k 15 "$limit" "$@" > >(tee "$OUT/$name.log") 2>&1 &
    local sid=$!
    wait "$sid"; rc=$?
    pkill -KILL -s "$sid" 2>/dev/null
    SUMMARY+=("$(printf '%-18s rc=%-4s %5ss' "$name" "$rc" "$(( $(date +%s) - s ))")")
    return $rc
}

# the A/B builds of pool-sweep: the AVX2 build beside the AVX-512 one (what a host without AVX-512 gets;
# tests/test_tiers_pool.py holds both to numpy). The tuning macros of the 2026-12-02 sweep are settled in the code.
POOL_AB="--ab avx2"

pool_sweep() {  # pool_sweep NAME ARGS...: bench/pool_bench.py ARGS, its output in $OUT/NAME.out and .json, the summary
    local name=$1 rc; shift
    python3 bench/pool_bench.py "$@" --json "$OUT/$name.json" > "$OUT/$name.out" 2>&1; rc=$?
    sed -n '/^=== summary/,$p' "$OUT/$name.out" | grep -v '^{'
    [ "$rc" = 0 ] || tail -n 30 "$OUT/$name.out"
    return "$rc"
}

# the steps that read the full-size file fail (rc 2) when there is none, not rc 0 after one error line a run (a
# profile step of 2026-12-04 reported rc=0 with four "MODEL is an empty string" lines)
NEED_FILE='[ -s "$f" ] || { echo "no full-size file here: run synth (or peer), then ready, before this step" >&2; exit 2; };'

soak_profile() {  # the expert profile of the soak: $SOAK_PROFILE, else sbs's, else one made now (as side_by_side.sh)
    local p=${SOAK_PROFILE:-$OUT/sbs/profile.yaml}
    [ -f "$p" ] || { p=$OUT/soak-profile.yaml; [ -f "$p" ] || timeout 240 python3 -m strata_cli make-profile \
        "$(full_size)" --device gpu --random 512 --window 16 --ctx 600 -o "$p" > /dev/null 2> "$OUT/soak-profile.err" \
        || { tail -n 1 "$OUT/soak-profile.err" >&2; rm -f "$p"; }; }
    echo "$p"
}

soak_args() {  # the engine options of the soak and of the signals check: one configuration
    echo "$(full_size) --device ${SOAK_DEVICE:-gpu} --window ${SOAK_T:-4} --ctx ${SOAK_CTX:-1024} --expert-cache ${SOAK_CACHE:-24GiB}" \
        "--expert-profile $(soak_profile) --pcie-frac ${SOAK_PCIE:-0.25}"
}

soak_run() {  # the soak: its last line (JSON) on stdout and with the samples in soak.json, its progress in soak.log
    # shellcheck disable=SC2046
    python3 bench/soak.py $(soak_args) --windows "${SOAK_WINDOWS:-10000}" --depth "${SOAK_DEPTH:-64}" \
        --json "$OUT/soak.json" 2> >(tee "$OUT/soak.log" >&2)
}

soak_signals() {  # SIGINT, then SIGTERM into a tiered verify-bench's windows; 0 when both were clean
    local rc=0 s
    for s in INT TERM; do
        # shellcheck disable=SC2046
        python3 bench/soak.py $(soak_args) --signal $s --after "${SOAK_AFTER:-10}" --json "$OUT/signals-$s.json" || rc=1
    done
    return $rc
}

soak_bg() {  # soak_run in a session of its own (as peer: descriptors above 2 closed, so the call can return)
    rm -f "$OUT/soak.rc" "$OUT/soak.json" "$OUT/soak.out"
    for fd in $(ls /proc/$$/fd); do [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done
    setsid nohup bash -c "$(declare -f $SOAK_FNS); OUT=$OUT; soak_run > $OUT/soak.out 2>&1; echo \$? > $OUT/soak.rc" \
        < /dev/null > /dev/null 2>&1 &
    echo "soak started in the background (pid $!): progress in $OUT/soak.log, soak-wait collects it"
}

soak_wait() {  # soak-bg's run: a progress line a minute until it ends, then its last lines and its exit status
    [ -f "$OUT/soak.out" ] || { echo "no soak was started (soak-bg)"; return 1; }
    local n=0
    until [ -f "$OUT/soak.rc" ]; do sleep 5; n=$((n + 1)); [ $((n % 12)) = 0 ] && tail -n 1 "$OUT/soak.log"; done
    grep -v '^soak: window' "$OUT/soak.log" | tail -n 5; tail -n 1 "$OUT/soak.out"
    return "$(cat "$OUT/soak.rc")"
}
SOAK_FNS="full_size soak_profile soak_args soak_run soak_signals"

full_size() { echo "${FN:-$(ls -S /tmp/peer_work/synth_*q2_k*.gguf 2>/dev/null | head -1)}"; }

gpu_tests() {  # gpu_tests [K]: the gpu-marked tests (those matching K), names kept, failures listed last
    # the slow tier tests first (xdist hands out tests in collection order, so they no longer start last and run
    # past the step's limit); a per-test limit where pytest-timeout is installed, so a hang costs one test's
    # time and the run still ends with its summary of failures
    local files=(tests/test_gpu_tiers*.py tests/test_gpu_cache_policy.py) k=() t=()
    for f in tests/test_gpu_*.py; do case " ${files[*]} " in *" $f "*) ;; *) files+=("$f");; esac; done
    [ -n "${1:-}" ] && k=(-k "$1")
    python3 -c "import pytest_timeout" 2>/dev/null && t=(--timeout "${TEST_TIMEOUT:-150}")
    # the whole output (short tracebacks of every failure) stays in gpu-full.log; the names in gpu-results.txt
    STRATA_REQUIRE_GPU=1 python3 -m pytest -v -n 12 -m gpu -p no:cacheprovider --tb=short -rfE "${t[@]}" "${k[@]}" "${files[@]}" \
        tests/test_tiers_*.py tests/test_tier_engine_host.py > "$OUT/gpu-full.log" 2>&1
    local rc=$?  # pytest's: the step's rc says whether the suite passed (it said 0 for 11 failures on 2026-12-02)
    grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/gpu-full.log" \
        | sed -E 's/^\[gw[0-9]+\] \[ *[0-9]+%\] //' > "$OUT/gpu-results.txt"
    grep -cE "(^| )PASSED" "$OUT/gpu-results.txt" | sed 's/^/passed: /'
    grep -E "FAILED|ERROR" "$OUT/gpu-results.txt" | head -40
    tail -n 1 "$OUT/gpu-results.txt"
    return $rc
}

for arg in "$@"; do
    name=${arg%%:*}; limit=${arg#*:}; [ "$limit" = "$arg" ] && limit=300
    case $name in
        setup) run_step setup "$limit" bash -c '
            python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
            nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
            python3 -c "import cupy, numpy; print(\"cupy\", cupy.__version__, \"numpy\", numpy.__version__)"
            python3 -m pip list --path /tmp/site 2>/dev/null | grep -i gguf
            # a kernel cache packed by an earlier call (kcache step), carried in .devcarry: warm then compiles only
            # the modules whose sources changed since (a cold warm-up is 65-90 s of every fresh machine)
            if [ -f .devcarry/kcache.tar.gz ]; then mkdir -p ~/.cupy && tar xzf .devcarry/kcache.tar.gz -C ~/.cupy \
                && echo "kernel cache restored: $(ls ~/.cupy/kernel_cache | wc -l) files"; fi
            echo "host cores $(nproc), $(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2)"; df -h /tmp | tail -1';;
        # every descriptor above 2 closed first: on 2026-12-02 the call that started the peer returned 250 s after its
        # last step (the build's end), as if the background build held a descriptor the device tool waits on
        peer) run_step peer "$limit" bash -c 'for fd in $(ls /proc/$$/fd); do [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done
            exec bash .peer/side_by_side.sh prepare';;
        synth) run_step synth "$limit" bash -c 'for fd in $(ls /proc/$$/fd); do [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done
            W=/tmp/peer_work; mkdir -p "$W"; A="--preset flash-next --ple-rows 1000000 --expert-type q2_k"
            M=$W/synth_$(echo "$A q8_0" | tr -c "A-Za-z0-9_.-" _ | cut -c1-120).gguf
            if [ -s "$M" ] || pgrep -f "^python3 -u .*make_synth_qwen4exp[.]py" > /dev/null; then echo "file there or being written: $M"
            else (setsid nohup python3 -u .peer/make_synth_qwen4exp.py $A --type q8_0 -o "$M" > "$W.synth.log" 2>&1 \
                < /dev/null &); echo "writing $M in the background (log $W.synth.log)"; fi';;
        ready) run_step ready "$limit" bash -c "$(declare -f full_size)"'; T0=$(date +%s)
            until ! pgrep -f "^python3 -u .*make_synth_qwen4exp[.]py" > /dev/null && [ -n "$(full_size)" ]; do sleep 3; done
            echo "full-size file ready after $(( $(date +%s) - T0 )) s: $(ls -l "$(full_size)")"';;
        warm) run_step warm "$limit" python3 bench/warm_kernels.py --jobs "$(nproc)";;
        gpu) run_step gpu "$limit" bash -c "$(declare -f gpu_tests); OUT=$OUT gpu_tests";;
        gpu=*) run_step gpu-k "$limit" bash -c "$(declare -f gpu_tests); OUT=$OUT gpu_tests '${name#gpu=}'";;
        pool) run_step pool "$limit" python3 bench/pool_bench.py --threads "$(nproc)" ${POOL_ARGS:-};;
        pool1) run_step pool1 "$limit" python3 bench/pool_bench.py --threads 1 ${POOL_ARGS:-};;
        pool-sweep) run_step pool-sweep "$limit" bash -c "$(declare -f pool_sweep); OUT=$OUT pool_sweep pool-sweep \
            --sweep --types ${POOL_SWEEP_TYPES:-Q8_0,Q4_0,Q2_K,MXFP4} --gb 1.5 $(echo $POOL_AB) ${POOL_ARGS:-}";;
        pool-bind) run_step pool-bind "$limit" env OMP_PROC_BIND=close OMP_PLACES=cores bash -c "$(declare -f pool_sweep)
            OUT=$OUT pool_sweep pool-bind --sweep --types Q8_0,Q4_0 --threads $(nproc) --pages huge,file \
            --modes pool,touch,read --gb 1.5 ${POOL_ARGS:-}";;
        gemv) run_step gemv "$limit" bash -c 'for t in ${GEMV_TYPES:-Q8_0 Q4_0 Q2_K Q4_K Q6_K IQ2_XS IQ4_XS MXFP4}; do
            python3 bench/quant_gemv_bench.py --jobs "$(nproc)" --types $t '"${GEMV_ARGS:-}"' > "'"$OUT"'/gemv-$t.txt" 2>&1
            grep -vE "^#|^type" "'"$OUT"'/gemv-$t.txt" | grep -E "^[A-Z0-9_]+ |Error" | head -12; done';;
        ncu) run_step ncu "$limit" bash -c 'command -v ncu >/dev/null || { echo "ncu: not on PATH"; exit 2; }
            ncu --clock-control none --target-processes all -k "regex:qtc_" --section SpeedOfLight --section Occupancy \
                --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
                python3 bench/quant_gemv_bench.py --jobs 1 --types ${NCU_TYPES:-Q2_K} --window ${NCU_T:-1 8} --launches 2 \
                > "'"$OUT"'/ncu.txt" 2>&1; rc=$?
            grep -E "qtc_|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Block Size|Grid Size|Warp Cycles Per Issued|Issued Warp|No Eligible|Stall|Theoretical Occupancy" "'"$OUT"'/ncu.txt" | head -150; exit $rc';;
        gemv-ab) run_step gemv-ab "$limit" bash -c 'python3 bench/quant_gemv_bench.py --probe --jobs "$(nproc)" '"${GEMV_ARGS:-}"' \
            > "'"$OUT"'/gemv-ab.txt" 2>&1; rc=$?; grep -vE "^\{" "'"$OUT"'/gemv-ab.txt" | tail -80; exit $rc';;
        ids=*) f=${name#ids=}; run_step "ids-$(basename "$f" .txt)" "$limit" bash -c "STRATA_REQUIRE_GPU=1 python3 -m pytest \
            -v -n 12 -m gpu -p no:cacheprovider --tb=short -rfE --timeout \${TEST_TIMEOUT:-150} \$(cat $f) 2>&1 \
            | grep -vE ' PASSED|^\[gw|^$|Benchmark|warner'";;
        tiers) TIERS_PROFILE=${TIERS_PROFILE:-$(ls "$OUT/sbs/profile.yaml" 2>/dev/null)} run_step tiers "$limit" \
            bash bench/tiers_device.sh "$(full_size)" "$OUT/tiers";;
        pinned) run_step pinned "$limit" bash -c 'if [ -n "${PINNED_ARGS:-}" ]; then python3 bench/pinned_probe.py $PINNED_ARGS
            else for k in 10 4; do python3 bench/pinned_probe.py --gb 6 --k $k; done; fi';;
        window) run_step window "$limit" bash bench/window_device.sh "$(full_size)";;
        cache) FN=$(full_size) run_step cache "$limit" bash bench/cache_policy.sh;;
        profile) run_step profile "$limit" bash -c 'set -o pipefail; f="'"$(full_size)"'"; '"$NEED_FILE"' rc=0
            for T in 1 8; do
            python3 -m strata_cli profile "$f" --window $T -r 20 -d 512 --per-layer --format json > "'"$OUT"'/profile-t$T.json" || rc=1
            python3 -m strata_cli profile "$f" --window $T -r 20 -d 512 | tail -45 || rc=1; done; exit $rc';;
        nodes) run_step nodes "$limit" bash -c 'for T in 1 4 8; do python3 -m strata_cli graph-nodes --window $T \
            | grep -E "nodes|per layer" | head -3; done';;
        split) run_step split "$limit" bash -c 'f="'"$(full_size)"'"; '"$NEED_FILE"' for g in "" "--gpus 0,0"; do
            python3 -m strata_cli verify-bench "$f" --device gpu --window 1,4,8 -r 10 $g --format json \
                > "'"$OUT"'/split${g:+-2stages}.json" && python3 -c "import json,sys; [print({k: v for k, v in r.items()
                if k == \"window\" or k.startswith((\"ms_median\", \"stage\"))}) for r in json.load(sys.stdin)[\"rows\"]]" \
                < "'"$OUT"'/split${g:+-2stages}.json"; done';;
        commit) run_step commit "$limit" bash -c 'set -u; B="python3 bench/commit_async_bench.py --window 8 --draft-noise 0.3"
            $B --tokens 512 --reps 5; $B --tokens 256 --reps 3 --expert-cache 3 --pcie-frac 0.5
            [ -f /tmp/small-q8_0.gguf ] || python3 -m strata_cli make-model /tmp/small-q8_0.gguf --preset small --type Q8_0 --seed 1
            $B /tmp/small-q8_0.gguf --tokens 512 --reps 5; F="'"$(full_size)"'"
            if [ -n "$F" ]; then $B "$F" --tokens 512 --reps 3; else echo "commit: no full-size file (yet): its row skipped"; fi';;
        blas-probe) run_step blas-probe "$limit" bash -c 'python3 bench/blas_spin_probe.py --threads "$(nproc)"
            OPENBLAS_NUM_THREADS=1 python3 bench/blas_spin_probe.py --threads "$(nproc)"';;
        engine-ab) AB_OUT=$OUT/engine-ab run_step engine-ab "$limit" bash bench/engine_ab.sh;;
        kcache) run_step kcache "$limit" bash -c '[ -n "'"$BACK"'" ] && tar czf "'"$BACK"'/kcache.tar.gz" -C ~/.cupy kernel_cache \
            && ls -la "'"$BACK"'/kcache.tar.gz"';;
        soak) run_step soak "$limit" bash -c "$(declare -f $SOAK_FNS); OUT=$OUT soak_run";;
        soak-bg) run_step soak-bg "$limit" bash -c "$(declare -f $SOAK_FNS soak_bg); SOAK_FNS='$SOAK_FNS'; OUT=$OUT soak_bg";;
        soak-wait) run_step soak-wait "$limit" bash -c "$(declare -f soak_wait); OUT=$OUT soak_wait";;
        signals) run_step signals "$limit" bash -c "$(declare -f $SOAK_FNS); OUT=$OUT soak_signals";;
        # the last call's profile goes first: side_by_side.sh's make-profile refuses to overwrite it, and then ran
        # c12 / c24 with no profile at all (2026-12-03, call 6: "expert id order", the table silent about it)
        sbs=*) cfg=${name#sbs=}; rm -f "$OUT/sbs/profile.yaml"
            OUT=$OUT/sbs run_step sbs "$limit" bash .peer/side_by_side.sh run ${cfg//,/ };;
        *) echo "unknown step $name"; SUMMARY+=("$(printf '%-18s unknown' "$name")");;
    esac
done
[ -n "$BACK" ] && tar czf "$BACK/logs.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
echo "=== steps (commit ${STRATA_GIT_COMMIT:-?})"; printf '%s\n' "${SUMMARY[@]}"
