#!/usr/bin/env bash
# Set up dflash2rt on a fresh machine: a virtualenv in .venv with the CPU build of torch, the core
# package, the three backend plugins, the conformance suite and the test tools (editable installs).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
# Pin the CPU build first: a bare torch requirement could pull a multi-GB CUDA build.
# On a GPU machine, install the matching torch build yourself before running this.
.venv/bin/python -c "import torch" 2>/dev/null || pip install "torch==${TORCH_VERSION:-2.13.0}"
pip install -e ".[dev,triton]" -e backends/cuda -e backends/rocm -e backends/xpu -e conformance
.venv/bin/dflash2rt backends
