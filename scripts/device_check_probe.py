"""What the device check asks a machine in child processes: whether the working tree is
installed (``INSTALLED``), the software versions (``VERSIONS``), and the smoke probe the
float64-less lane and memcheck run (``smoke``, ``device_check.py --smoke BACKEND``)."""

from __future__ import annotations

import json
import os


def smoke(name: str, expect_fp64: bool | None) -> int:
    """Create backend ``name`` (a kernel backend's creation runs its smoke launch) and print
    what runs; exit 1 on a kernel fallback or when float64 is not as expected."""
    from dflash2rt.registry import Registry

    reg = Registry.discover()
    status = next((s for s in reg.statuses() if s.name == name), None)
    backend = reg.select(name).backend
    problems = [f"kernel fallback: {f}" for f in backend.kernel_fallbacks]
    if expect_fp64 is not None and backend.has_fp64 != expect_fp64:
        problems.append(f"has_fp64 is {backend.has_fp64}, expected {expect_fp64}"
                        + (" (DFLASH2RT_FP64=0 was not honoured)"
                           if os.environ.get("DFLASH2RT_FP64") == "0" else ""))
    print(json.dumps({"backend": name, "device": str(backend.device),
                      "probe_fp64": getattr(status, "fp64", None), "has_fp64": backend.has_fp64,
                      "implementation": backend.implementation_summary(),
                      "kernel_fallbacks": list(backend.kernel_fallbacks),
                      "standing_fallbacks": list(backend.standing_fallbacks),
                      "graphs": getattr(backend.graph_adapter, "name", None),
                      "problems": problems}))
    return 1 if problems else 0


# Exit 0 when every named folder (relative to the current one) is installed from here (PEP 610).
INSTALLED = """import json, sys
from importlib.metadata import distributions
from pathlib import Path
want = {str(Path(d).resolve()) for d in sys.argv[1:]}
have = set()
for d in distributions():
    url = json.loads(d.read_text("direct_url.json") or "{}").get("url", "")
    if url.startswith("file://"):
        have.add(str(Path(url[7:]).resolve()))
missing = sorted(want - have)
print("not installed from this tree: " + ", ".join(missing) if missing else "installed")
sys.exit(1 if missing else 0)
"""
VERSIONS = """import platform, torch
from importlib.metadata import version
try:
    triton = version("triton")
except Exception as exc:
    triton = "none (" + type(exc).__name__ + ")"
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}; {gpu}); triton {triton}; "
      f"python {platform.python_version()}")
"""
