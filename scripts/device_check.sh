#!/usr/bin/env bash
# Device check in one command under one deadline (default 420 s; DEADLINE_S or --deadline):
# conformance ops + L0-L4 -> graphs level -> graph replay vs eager -> float64 off
# (DFLASH2RT_FP64=0: smoke, L1, L2) -> compute-sanitizer memcheck of the smoke launch -> bench
# b1 fp32 + bf16 -> the cost model on a synthetic real shape (checkpoint in a temporary folder).
# A section whose budget no longer fits before the deadline is skipped and says so. Writes only
# summary.txt, summary.json and results.tgz (every log and report) to $OUT (default out/device).
# Offline: the working tree is installed with --no-index --no-deps over the image's torch/triton.
#   scripts/device_check.sh                 # on a machine with an NVIDIA GPU (BACKEND=cuda)
#   scripts/device_check.sh --dry-run       # the same sections on the CPU, short sizes (CI)
# The driver is scripts/device_check.py (--help); PYTHON picks the interpreter (default: the
# repository's .venv when there is one, else python3).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=$PWD/.venv/bin/python; else PY=python3; fi
fi
export PYTHON=$PY
exec "$PY" scripts/device_check.py "$@"
