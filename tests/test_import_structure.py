"""The import picture of ``dflash2rt/``, read from the source (AST, function-level and
``if TYPE_CHECKING:`` imports too: a type a module names is a dependency, and a circle through
type-checking imports is a circle): no cycles between modules or between subpackages, imports only downward through the layers
below, no core module importing a vendor plugin, graphs knowing no engine, and backend selection
outside the engine. A new subpackage must be placed in LAYERS (a deliberate decision)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "dflash2rt"

# Lowest first. A unit (a subpackage, or a top-level module) imports only from lower layers.
LAYERS = (
    {"errors"},
    {"ops", "bundled", "constraints"},
    {"watermark"},                   # below backend: its keyed draws are a draw source (ops.draws)
    {"backend"},
    {"kernels", "graphs", "models"},
    {"vendor"},                      # GpuVendor: the record hookspecs and plugin_kit both name
    {"hookspecs"},
    {"plugin_kit", "registry"},      # plugin_kit's graph self-test commits to a models KVCache
    {"cpu", "engine", "distributed"},   # distributed: the sharded target, rank launch
    {"bench", "metrics", "progress"},   # measurement; a run's metrics export; LLM's bar
    {"prompts"},                     # prompts to ids: run, LLM, the server's load generator
    {"api", "train", "synth"},
    {"serve"},                       # the OpenAI server, over api's model resolution and
                                     # the engine
    {"llm"},                         # vLLM's LLM (its chat renders with the server's templates)
    {"qualify"},
    {"cli"},
    {"__main__"},
)
# Units that must never be imported by the unit named (beyond the layer order).
FORBIDDEN = {
    "graphs": {"engine", "models", "registry", "api"},    # graphs know no engine
    "engine": {"registry", "api", "cli"},                 # selection belongs to api / cli
    "ops": {"backend", "kernels", "models", "engine"},
}
PLUGIN_PREFIXES = ("dflash2rt_cuda", "dflash2rt_rocm", "dflash2rt_xpu")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Every module ``path`` imports (absolute names), including dynamic
    ``importlib.import_module("...")`` calls with a literal name."""
    mod, is_pkg = module_name(path), path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join(pkg + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)) \
                and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module" \
                and node.args and isinstance(node.args[0], ast.Constant):
            out.add(str(node.args[0].value))
    return out


def graph() -> dict[str, set[str]]:
    files = sorted(ROOT.rglob("*.py"))
    known = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, known) for p in files}


def unit(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative enough here)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


G = graph()
INTERNAL = {m: {t for t in ts if t in G and t != m} for m, ts in G.items()}
UNIT_EDGES: dict[str, set[tuple[str, str]]] = {}      # (unit a -> unit b) → example module pairs
for _m, _ts in INTERNAL.items():
    for _t in _ts:
        if unit(_m) and unit(_t) and unit(_m) != unit(_t):
            UNIT_EDGES.setdefault(f"{unit(_m)}->{unit(_t)}", set()).add((_m, _t))


def test_the_walk_sees_the_package():
    assert len(G) > 50 and "dflash2rt.engine.engine" in G
    assert "dflash2rt.backend" in INTERNAL["dflash2rt.engine.engine"]


def test_no_module_cycles():
    assert cycles(INTERNAL) == []


def test_no_subpackage_cycles():
    edges: dict[str, set[str]] = {}
    for key in UNIT_EDGES:
        a, b = key.split("->")
        edges.setdefault(a, set()).add(b)
    assert cycles(edges) == [], {k: sorted(v)[:2] for k, v in UNIT_EDGES.items()}


def test_every_unit_has_a_layer():
    placed = set().union(*LAYERS)
    missing = sorted({unit(m) for m in G if unit(m)} - placed)
    assert not missing, f"place these in LAYERS (tests/test_import_structure.py): {missing}"


@pytest.mark.parametrize("edge", sorted(UNIT_EDGES))
def test_imports_go_down_the_layers(edge):
    layer = {u: i for i, units in enumerate(LAYERS) for u in units}
    a, b = edge.split("->")
    assert layer.get(b, 99) < layer.get(a, -1), \
        f"{a} (layer {layer.get(a)}) imports {b} (layer {layer.get(b)}): {sorted(UNIT_EDGES[edge])}"
    assert b not in FORBIDDEN.get(a, ()), f"{a} must not import {b}: {sorted(UNIT_EDGES[edge])}"


def test_no_core_module_imports_a_vendor_plugin():
    bad = {m: sorted(t for t in ts if t.startswith(PLUGIN_PREFIXES)) for m, ts in G.items()}
    assert {m: ts for m, ts in bad.items() if ts} == {}


def test_the_checker_catches_what_it_guards(tmp_path):
    """The rules fail on a tree that breaks them (so this file cannot pass vacuously)."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    pkg = tmp_path / "dflash2rt" / "graphs"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text("import importlib\nfrom typing import TYPE_CHECKING\n"
                              "from ..engine import engine\n"
                              "if TYPE_CHECKING:\n    from ..models.pair import ModelPair\n"
                              "def f():\n    importlib.import_module('dflash2rt_cuda.plugin')\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path / "dflash2rt"
    try:
        got = imports_of(pkg / "x.py", {"dflash2rt.engine.engine", "dflash2rt.models.pair"})
    finally:
        ROOT = saved
    assert got == {"importlib", "typing", "dflash2rt.engine.engine", "dflash2rt.models.pair",
                   "dflash2rt_cuda.plugin"}       # a TYPE_CHECKING import counts
