#!/usr/bin/env bash
# The tiered engine with another CPU pool source beside this tree's, on one machine in one call, runs alternating:
#
#   AB_SRC=FILE bash bench/engine_ab.sh          (bash bench/device.sh engine-ab:S runs it with the device's paths)
#
# FILE: an expert_pool.c to compare with kernels/expert_pool.c (e.g. `git show REV:kernels/expert_pool.c`, carried in
# .devcarry). The pool's library is cached by its source's hash (strata_cli/tiers/native.py), so the two builds are
# swapped in place in this tree: the CUDA kernels stay warm (a copy of the tree elsewhere compiles them cold, CuPy's
# cache being per source path: 2026-12-03 call 8 lost its second build that way). The tree's own file is put back on
# any exit. Why alternate: the same commit's tiered cells moved by a third between machines and machine states that
# session, more than the change under test.
# Env: FN (the model; default the full-size file), AB_CACHE (12GiB), AB_T (1,8), AB_RUNS (4: this, other, this,
# other), AB_BUDGET (seconds after which no further run starts, 150), AB_PROFILE (else one made as sbs makes it),
# AB_OUT (logs, /tmp/engine_ab). One summary line per run and T last.
set -u
SRC=kernels/expert_pool.c
[ -f "${AB_SRC:-}" ] || { echo "engine_ab: AB_SRC=${AB_SRC:-} is no file (the other expert_pool.c)"; exit 2; }
F=${FN:-$(ls -S /tmp/peer_work/synth_*q2_k*.gguf 2>/dev/null | head -1)}
[ -f "$F" ] || { echo "engine_ab: no model (FN, or the full-size file in /tmp/peer_work)"; exit 2; }
A=${AB_OUT:-/tmp/engine_ab}; mkdir -p "$A"
cp "$SRC" "$A/this.c"; cp "$AB_SRC" "$A/other.c"
trap 'cp "$A/this.c" "$SRC"' EXIT
for b in other this; do  # both libraries compiled before anything is timed
    cp "$A/$b.c" "$SRC"; python3 -c "from strata_cli.tiers import native; print('$b', native.build())" || exit 1
done
P=${AB_PROFILE:-$A/profile.yaml}
[ -f "$P" ] || python3 -m strata_cli make-profile "$F" --device gpu --random 512 --window 16 --ctx 600 -o "$P" \
    > /dev/null 2> "$A/profile.err" || { tail -n 1 "$A/profile.err"; exit 1; }
T0=$(date +%s); i=0
for ((r = 0; r < ${AB_RUNS:-4}; r++)); do
    [ $(( $(date +%s) - T0 )) -gt "${AB_BUDGET:-150}" ] && { echo "budget spent after $i runs"; break; }
    b=this; [ $((r % 2)) = 1 ] && b=other
    cp "$A/$b.c" "$SRC"
    timeout 150 python3 -m strata_cli verify-bench "$F" --device gpu --window "${AB_T:-1,8}" -r 10 --warmup 2 -d 512 \
        --expert-profile "$P" --expert-cache "${AB_CACHE:-12GiB}" --format csv > "$A/$i-$b.csv" 2> "$A/$i-$b.err"
    echo "run $i ($b) rc=$? at $(( $(date +%s) - T0 )) s"; i=$((i + 1))
done
python3 - "$A" <<'PY'
import csv, glob, os, sys
cols = ("ms_median", "gpu_ms", "pool_ms", "pool_gb_s", "copy_ms", "host_gb_s", "pcie_frac")
print("run   build  T " + " ".join(f"{c:>10}" for c in cols))
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*-*.csv"))):
    run, build = os.path.basename(f)[:-4].split("-", 1)
    for r in csv.DictReader(open(f)):
        v = [float(r[c]) if r.get(c) not in (None, "") else float("nan") for c in cols]
        print(f"{run:>3} {build:>7} {r['window']:>2} " + " ".join(f"{x:10.2f}" for x in v))
PY
