#!/usr/bin/env bash
# Expert tiers on the GPU engine (issue 10), one call on a GPU machine, from the repo root:
#   the GPU tier tests, then verify-bench on the `small` model with the expert cache swept (0, a quarter, half, all
#   pairs), the PCIe share (0, 0.5), split on/off and spin vs captured cuStreamWaitValue32 waits; BIG=path adds the
#   8-layer Flash-Next Q8_0 model (make-model --preset flash-next --layers 8 --type Q8_0, ~22 GiB; written if missing
#   unless SKIP_BIG=1) after a 512-token context.
# Env: OUT (results dir), SMALL, BIG, SKIP_BIG=1, STRATA_FIXTURES (for the tests).
set -euo pipefail
OUT=${OUT:-/tmp/strata-tiers}
SMALL=${SMALL:-/tmp/small-q8_0.gguf}
BIG=${BIG:-/tmp/flash-next-8l-q8_0.gguf}
mkdir -p "$OUT"
strata() { python3 -m strata_cli "$@"; }

python3 -m pytest -q -rs tests/test_gpu_tiers.py > "$OUT/tests.txt" 2>&1 || true
[ -f "$SMALL" ] || strata make-model "$SMALL" --preset small --type Q8_0 --seed 1 > /dev/null
pairs=$(python3 -c "import sys; from strata_cli.model.gguf_file import open_model; g = open_model(sys.argv[1]).geometry; print(g.n_layers * g.n_expert)" "$SMALL")
sweep="0,$((pairs / 4)),$((pairs / 2)),all"
run() {  # name, model, depth, extra options
  strata verify-bench "$2" --device gpu --window 1,2,4,8 -r 30 -d "$3" --format jsonl "${@:4}" > "$OUT/$1.jsonl"
}
run small-cache "$SMALL" 64 --expert-cache "$sweep"
run small-pcie "$SMALL" 64 --expert-cache 0 --pcie-frac 0.5
run small-split "$SMALL" 64 --expert-cache 0 --split
run small-stream "$SMALL" 64 --expert-cache 0 --tier-wait stream
if [ "${SKIP_BIG:-0}" != 1 ]; then
  [ -f "$BIG" ] || strata make-model "$BIG" --preset flash-next --layers 8 --type Q8_0 --ngram-vocab 1000 --seed 0 > /dev/null
  run big-cache0 "$BIG" 512 --expert-cache 0
  run big-cache0-pcie "$BIG" 512 --expert-cache 0 --pcie-frac 0.5
  run big-cache0-split "$BIG" 512 --expert-cache 0 --split --pcie-frac 0.5
fi
tail -3 "$OUT/tests.txt"
python3 - "$OUT" <<'PY'
import json, pathlib, sys
keys = ["window", "ms_median", "vram_pairs", "vram_share", "pcie_share", "cpu_share", "wait_b_ms", "wait_flag_ms",
        "host_ring_ms", "pool_ms", "pool_gb_s"]
print("run", *keys, sep="\t")
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.jsonl")):
    for line in f.read_text().splitlines():
        rec = json.loads(line)
        if "window" in rec:
            print(f"{f.stem}[{rec.get('expert_cache', 'all')}]", *(f"{rec[k]:.3f}" if isinstance(rec.get(k), float)
                  else rec.get(k, "") for k in keys), sep="\t")
PY
