"""Out-of-tree fixture plugins (tests/fixtures/backends/) installed as real distributions
(dist-info + entry point) on a path, for the registry and vendor-plugin tests."""

from __future__ import annotations

from pathlib import Path

from fixture_dists import install

SOURCES = {"good": "backends/good.py", "broken": "backends/broken_import.py",
           "raising": "backends/raising_hook.py", "misspelled": "backends/misspelled_hook.py",
           "duplicate": "backends/duplicate_cpu.py", "mismatch": "backends/gpu_style.py",
           "smokefail": "backends/gpu_style.py"}
# The GPU-style fixture twice: Triton's active target is "cuda" where the vendor needs "hip" (the
# wrong Triton installed); the right target, but a kernel's smoke launch fails on the device.
PARAMS = {"mismatch": {"name": "fx-mismatch", "target": "cuda", "smoke_fails": False},
          "smokefail": {"name": "fx-smokefail", "target": "hip", "smoke_fails": True}}


def write_plugin(root: Path, kind: str) -> str:
    """Install fixture plugin ``kind`` under ``root`` (a sys.path entry); return its ep name."""
    install(root, SOURCES[kind], f"fixture-{kind}", module=f"fixture_{kind}_plugin",
            dist=f"fixture-{kind}", params=PARAMS.get(kind))
    return f"fixture-{kind}"
