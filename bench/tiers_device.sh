#!/usr/bin/env bash
# The expert tiers on the device, one call (<= 5 minutes): the GPU tier tests (-v), then verify-bench at
# --expert-cache 0 with --pcie-frac 0 / 0.25 / 0.5 / 1 / auto, each under a timeout, with
# its load lines (one "load: PHASE in S s" per phase, "expert pages in", the PCIe share chosen, "engine built in",
# any "tiers: waiting" or error line); with TIERS_PROFILE (an expert profile, e.g. the one side_by_side.sh made)
# also 12 and 24 GiB of experts by that profile; a short table last.
#   bench/tiers_device.sh MODEL.gguf [OUT_DIR]
# After the table: auto against 0 per T (whether DEFAULT_PCIE_FRAC = AUTO is safe).
# Env: TIERS_TEST_S (the tests' timeout, default 120), TIERS_RUN_S (each verify-bench's timeout, default 36),
# TIERS_WINDOWS (default 1,8), TIERS_REPS (default 5), TIERS_DEVICE (default gpu; cpu checks the script here),
# TIERS_PROFILE (see above).
set -u
model=${1:?usage: bench/tiers_device.sh MODEL.gguf [OUT_DIR]}
out=${2:-${OUT:-/tmp/tiers_device}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ "${TIERS_DEVICE:-gpu}" = gpu ]; then  # the GPU tier tests (TIERS_DEVICE=cpu checks the runs only)
    timeout -k 5 "${TIERS_TEST_S:-120}" python -m pytest -v -m gpu tests/test_gpu_tiers.py tests/test_gpu_tiers_pcie.py \
        2>&1 | tee "$out/tests.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|skipped"
    echo "tests rc ${PIPESTATUS[0]}" | tee -a "$out/tests.log"
fi
runs=("0" "0.25" "0.5" "1" "auto")
[ -n "${TIERS_PROFILE:-}" ] && runs+=("0 --expert-cache 12GiB" "0 --expert-cache 24GiB")
for spec in "${runs[@]}"; do
    name=$(echo "pcie $spec" | tr ' ' '_')
    cache=(--expert-cache 0); case $spec in *expert-cache*) cache=(--expert-profile "$TIERS_PROFILE");; esac
    t0=$(date +%s%N)
    # -k: a run that ignores the TERM (as a --pcie-frac 0.5 build did on 2026-12-02) is killed 10 s later
    # shellcheck disable=SC2086
    timeout -k 10 "${TIERS_RUN_S:-36}" python -m strata_cli verify-bench "$model" --device "${TIERS_DEVICE:-gpu}" \
        "${cache[@]}" --pcie-frac $spec --window "${TIERS_WINDOWS:-1,8}" -r "${TIERS_REPS:-5}" --warmup 1 --format json \
        >"$out/$name.json" 2>"$out/$name.err"
    rc=$?
    printf '%s: rc %s, %s ms wall\n' "$name" "$rc" "$(( ($(date +%s%N) - t0) / 1000000 ))"
    grep -E '^load:|engine built|expert pages in|PCIe share|PCIe copy path|tiers: waiting|error|warning' "$out/$name.err" \
        | sed -E 's/^expert cache: .*(PCIe share: )/\1/; s/^/    /'
done
python - "$out" "${runs[@]}" <<'PY'
import json, sys
out, runs = sys.argv[1], sys.argv[2:]
cols = ["window", "ms_median", "pcie_share", "cpu_share", "gpu_ms", "wait_b_ms", "wait_flag_ms", "host_ring_ms",
        "pool_ms", "cpu_mb", "pool_gb_s", "issue_ms", "copy_ms", "pcie_mb", "copy_gb_s", "tier_floor_ms"]
print("| run | " + " | ".join(cols) + " |")
print("|" + "---|" * (len(cols) + 1))
for spec in runs:
    name = ("pcie " + spec).replace(" ", "_")
    try:
        rows = json.load(open(f"{out}/{name}.json"))["rows"]
    except (OSError, ValueError, KeyError):
        print(f"| {name} | " + " | ".join(["-"] * len(cols)) + " |")
        continue
    for r in rows:
        cells = [f"{r.get(c):.3g}" if isinstance(r.get(c), float) else str(r.get(c, "-")) for c in cols]
        print(f"| {name} | " + " | ".join(cells) + " |")
# auto against the pool alone per T: DEFAULT_PCIE_FRAC = AUTO (tiers/share.py) is safe where auto is no slower
# than 0 at every T (3 % for noise); the auto line above says the share it chose and the times it predicted
def medians(name):
    try:
        return {r["window"]: r["ms_median"] for r in json.load(open(f"{out}/{name}.json"))["rows"]}
    except (OSError, ValueError, KeyError):
        return {}
auto, zero = medians("pcie_auto"), medians("pcie_0")
both = sorted(set(auto) & set(zero))
if both:
    parts = [f"T={T}: {auto[T]:.1f} vs {zero[T]:.1f} ms ({auto[T] / zero[T] - 1:+.0%})" for T in both]
    safe = all(auto[T] <= 1.03 * zero[T] for T in both)
    print(f"auto vs 0: {'; '.join(parts)} -> default auto {'safe' if safe else 'NOT safe'}")
else:
    print("auto vs 0: a run is missing")
PY
