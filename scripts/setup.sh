#!/usr/bin/env bash
# Set up dflash2rt on a fresh machine: a virtualenv in .venv with the CPU build of torch, the core
# package, the three backend plugins, the conformance suite and the test tools (editable installs),
# then the Triton that matches the installed torch, or none.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
# Pin the CPU build first: a bare torch requirement could pull a multi-GB CUDA build.
# On a GPU machine, install the matching torch build yourself before running this.
.venv/bin/python -c "import torch" 2>/dev/null || pip install "torch==${TORCH_VERSION:-2.13.0}"
pip install -e ".[dev]" -e backends/cuda -e backends/rocm -e backends/xpu -e conformance
# Triton: several distributions install the import package `triton` (PyPI triton, torch's ROCm
# and XPU builds), and one installed over another breaks it. The decision
# (dflash2rt/plugin_kit/triton_dist.py) reads torch's own requirements: PyPI triton on the CPU
# build (the interpreter lane, the compile checks) and where torch requires it (CUDA), nothing
# over a vendor's Triton; it says which and why on stderr, and exits 3 when only a fix by hand
# (printed) repairs the environment.
triton_dist() { .venv/bin/python -m dflash2rt.plugin_kit.triton_dist "$@"; }
if ! triton_args=$(triton_dist --pip-args); then
    echo "setup.sh: everything else is installed; fix Triton as said above, then run this again" >&2
    exit 1
fi
if [ -n "$triton_args" ]; then
    mapfile -t triton_args <<< "$triton_args"
    echo "setup.sh: pip install ${triton_args[*]}" >&2
    pip install "${triton_args[@]}"
    triton_dist --check >&2
fi
.venv/bin/dflash2rt backends
