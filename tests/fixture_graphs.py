"""Out-of-tree fixture backends with fake graph adapters on CPU (tests/fixtures/backends/
fake_graphs_modes.py, installed as real distributions: dist-info + entry point), for the
conformance graphs level's proof of replay."""

from __future__ import annotations

from pathlib import Path

from fixture_dists import install

MODES = ("replay", "refuse", "differ")   # correct graphs; capture refused; replay != eager


def install_graph_backend(root: Path, mode: str) -> str:
    """Install the fixture backend ``graphs-MODE`` under ``root`` (a sys.path entry)."""
    assert mode in MODES, mode
    name = f"graphs-{mode}"
    install(root, "backends/fake_graphs_modes.py", name, params={"mode": mode, "name": name})
    return name
