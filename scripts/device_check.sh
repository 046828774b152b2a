#!/usr/bin/env bash
# Device check for a machine with an NVIDIA GPU. Installs nothing from the internet (the working
# tree goes in with --no-index --no-deps over the image's torch/triton), then runs the conformance
# suite on `cuda`, graph replay == eager with step latency, and the benchmark. Results land as
# JSON / JUnit under $OUT (default out/device). Budget: under 5 minutes on one H200.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/device}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
start=$(date +%s)
say() { echo "== [$(( $(date +%s) - start ))s] $*"; }

say "install (offline, editable, no dependencies)"
$PY -m pip install -q --no-deps --no-build-isolation --no-index \
    -e . -e backends/cuda -e conformance 2>&1 | tail -3
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
$PY -m dflash2rt backends --json > "$OUT/backends.json"
$PY -m dflash2rt backends

say "conformance on cuda"
timeout 150 $PY -m pytest -p no:cacheprovider --pyargs dflash2rt_conformance \
    --dflash2rt-backend cuda --junitxml "$OUT/conformance-junit.xml" \
    --dflash2rt-json "$OUT/conformance.json" -q 2>&1 | tail -25

say "graph replay == eager, graph vs eager step latency"
timeout 60 $PY scripts/graph_check.py --backend cuda --out "$OUT/graphs.json"

say "benchmark: spec vs target-only vs transformers"
timeout 90 $PY -m dflash2rt bench --backend cuda --json --repeats 2 --prompts 4 \
    > "$OUT/bench.json"
$PY - "$OUT/bench.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print({k: r[k] for k in ("tau", "ar_tokens_per_s", "spec_tokens_per_s", "hf_tokens_per_s",
                         "speedup_vs_ar", "speedup_vs_hf")})
PY
say "done"
