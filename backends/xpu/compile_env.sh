#!/usr/bin/env bash
# Make the environment in which the kernels compile for the XPU plugin's targets without an Intel
# GPU: a virtualenv (default out/venv-xpu) with Intel's Triton beside the CPU build of torch, and
# dflash2rt with this plugin. Intel's Triton ("triton-xpu" on PyPI: Triton with its intel
# backend, which lowers a kernel to SPIR-V in-process) installs the same import package as the
# PyPI triton of .venv, hence its own environment. Prints that environment's python; then
#   TRITON_INTERPRET=0 out/venv-xpu/bin/python -m dflash2rt.kernels.compile_check
# compiles for pvc and dg2, and tests/test_kernels_compile_xpu.py runs it from the test suite.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${1:-out/venv-xpu}
PY=${PYTHON:-python3}
# Intel's backend builds a small C++ helper when it makes its compiler and links it with
# -lze_loader: the Level Zero loader library must exist (no driver or device is used).
if [ ! -e "$(g++ -print-file-name=libze_loader.so)" ]; then
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libze-dev >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
           apt-get install -y -qq libze-dev >/dev/null; }; } \
        || { echo "install the Level Zero loader (libze-dev): Intel's Triton links -lze_loader" >&2
             exit 1; }
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
# The CPU build first, as scripts/setup.sh does: a bare torch requirement could pull a CUDA build.
"$VENV/bin/python" -c "import torch" 2>/dev/null || pip install "torch==${TORCH_VERSION:-2.13.0}"
# triton-xpu 3.3.0b1 is the newest Intel Triton on PyPI (Triton 3.3, as torch 2.7's XPU wheels
# use; torch's own pytorch-triton-xpu is only on download.pytorch.org). intel-sycl-rt 2025.0.4
# (torch 2.7's oneAPI) brings the sycl.hpp and libsycl that the helper is built against.
pip install "triton-xpu==3.3.0b1" "intel-sycl-rt==2025.0.4"
pip install -e . -e backends/xpu
"$VENV/bin/python" -c "from triton.backends import backends; assert 'intel' in backends, backends"
echo "$VENV/bin/python"
