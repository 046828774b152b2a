#!/usr/bin/env bash
# Device check for a machine with an NVIDIA GPU. Installs nothing from the internet (the working
# tree goes in with --no-index --no-deps over the image's torch/triton), then runs the conformance
# suite on `cuda`, graph replay == eager with step latency, and the benchmark. Results land as
# JSON / JUnit under $OUT (default out/device). Budget: under 5 minutes on one H200.
# BACKEND=cpu runs the same sections on the CPU backend (a dry run of the plumbing).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/device}
BACKEND=${BACKEND:-cuda}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
start=$(date +%s)
say() { echo "== [$(( $(date +%s) - start ))s] $*"; }
status=0
section() {  # section NAME TIMEOUT CMD...: run one section, keep going on failure, record rc
    local name=$1 limit=$2; shift 2
    say "$name"
    timeout "$limit" "$@"
    local rc=$?
    [ $rc -eq 0 ] || { echo "!! $name: exit $rc"; status=1; }
    echo "$name $rc" >> "$OUT/sections.txt"
}

say "install (offline, editable, no dependencies)"
plugins=()
[ -d "backends/$BACKEND" ] && plugins=(-e "backends/$BACKEND")
$PY -m pip install -q --no-deps --no-build-isolation --no-index \
    -e . "${plugins[@]}" -e conformance 2>&1 | tail -3
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  $PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} | tee "$OUT/system.txt"
$PY -m dflash2rt backends --json > "$OUT/backends.json"
$PY -m dflash2rt backends

# Ops and levels L0-L4 in one process, graphs in another: a failed capture must not be able to
# leave CUDA state behind that fails unrelated tests.
conformance() {  # conformance TAG -k-EXPR
    $PY -m pytest -p no:cacheprovider --pyargs dflash2rt_conformance --dflash2rt-backend "$BACKEND" \
        --junitxml "$OUT/conformance-$1-junit.xml" --dflash2rt-json "$OUT/conformance-$1.json" \
        -k "$2" -q --no-header -rfE --tb=short -W ignore > "$OUT/conformance-$1.log" 2>&1
    local rc=$?
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/conformance-$1.log" | tail -40
    return $rc
}
export -f conformance; export BACKEND OUT PY     # timeout runs it in a child bash
section "conformance on $BACKEND: ops, L0-L4" 150 bash -c 'conformance ops "not graphs"'
section "conformance on $BACKEND: graphs" 60 bash -c 'conformance graphs graphs'
$PY - "$OUT"/conformance-ops.json "$OUT"/conformance-graphs.json <<'PY' || true
import json, os, sys
runs = [json.load(open(f)) for f in sys.argv[1:] if os.path.exists(f)]
for r in runs:
    print("conformance:", r["result"].upper(), f"({r['duration_s']:.0f} s)")
    for lv, d in r["levels"].items():
        if d["passed"] or d["failed"]:
            print(f"  {lv:7s} {d['result']:8s} passed {d['passed']} failed {d['failed']} skipped {d['skipped']}")
for o in (o for r in runs[:1] for o in r["ops"]):
    err = f"max_abs {o['max_abs']:.2e} (atol {o['atol']})" if o["kind"] == "float" else \
          f"mismatches {o['mismatches']}"
    print(f"  {'ok ' if o['passed'] else 'BAD'} {o['op']:24s} {o['dtype']:9s} {err} [{o['checks']} checks]")
PY

section "graph replay == eager, graph vs eager step latency" 70 \
    $PY scripts/graph_check.py --backend "$BACKEND" --out "$OUT/graphs.json"

section "where a graphed step's time goes (graph replays, top kernels)" 60 \
    $PY scripts/step_profile.py --backend "$BACKEND" --out "$OUT/profile.json"

section "benchmark: spec vs target-only vs transformers (T = 0, 0.7, 1)" 150 \
    $PY -m dflash2rt bench --backend "$BACKEND" --repeats 2 --prompts 4 --json-out "$OUT/bench.json"
$PY - "$OUT/bench.json" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
print({k: r.get(k) for k in ("tau", "target_only_tokens_per_s", "spec_tokens_per_s", "hf_tokens_per_s",
                             "speedup_vs_target_only", "speedup_vs_hf", "efficiency")})
PY
section "benchmark in bfloat16 (the same runs)" 150 \
    $PY -m dflash2rt bench --backend "$BACKEND" --dtype bfloat16 --repeats 2 --prompts 4 \
    --json-out "$OUT/bench-bf16.json"
# Real scale (issue 16): a Qwen3-8B-shaped pair with random weights, in bf16 with graphs: the
# cost model per block size x context x batch beside transformers (sdpa, StaticCache) on the
# same checkpoint. SCALE=0 skips it (the default for BACKEND=cpu dry runs); SCALE_SHAPE picks
# another synth shape.
[ "$BACKEND" = cpu ] && SCALE=${SCALE:-0}
if [ "${SCALE:-1}" = 1 ]; then
    section "synth ${SCALE_SHAPE:-qwen3-8b} (random weights, the published layout)" 150 \
        $PY -m dflash2rt synth --shape "${SCALE_SHAPE:-qwen3-8b}" --out "$OUT/synth"
    section "cost model on ${SCALE_SHAPE:-qwen3-8b}, bf16, graphs (bench --costs)" 180 \
        $PY -m dflash2rt bench --costs --backend "$BACKEND" --model "$OUT/synth" \
        --dtype bfloat16 --contexts 128,2048,8192 --batches 1,8 \
        --json-out "$OUT/costs-${SCALE_SHAPE:-qwen3-8b}.json"
    rm -rf "$OUT/synth"            # ~17 GB of random weights: not worth carrying back
fi
if [ "${QUALIFY:-0}" = 1 ] && [ $(( $(date +%s) - start )) -lt 210 ]; then
    section "qualify --quick (conformance L0 only: the full suite ran above)" 110 \
        $PY -m dflash2rt qualify --backend "$BACKEND" --quick --conformance-select L0 \
        --out "$OUT/qualify"
fi
say "done (status $status)"
exit $status
