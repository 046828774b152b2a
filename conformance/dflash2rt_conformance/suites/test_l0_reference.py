"""L0: the float64 / Fraction reference reproduces the target law exactly and detects every
seeded mutation (docs/verification.md). An oracle that catches no mutation proves nothing."""

from __future__ import annotations

import ast
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from dflash2rt_conformance.reference import laws, rng
from dflash2rt_conformance.reference.mutants import MUTANTS

pytestmark = pytest.mark.dflash2rt_level("L0")

PROMPT = (0,)
M = 4                     # the quarter lattice: every breakpoint of quarter tables lies on it
CONFIGS = [  # (V, γ, L, salt); Fractions run the first two (γ = 3 costs ~20 s in Fractions)
    pytest.param(3, 2, 3, "a", id="V3-g2-n3-a"),
    pytest.param(4, 2, 3, "b", id="V4-g2-n3-b", marks=pytest.mark.dflash2rt_exhaustive),
    pytest.param(3, 3, 4, "c", id="V3-g3-n4-c", marks=pytest.mark.dflash2rt_exhaustive),
]


def _lattice_law(v, gamma, length, salt, exact, mutant=None):
    p_fn, q_fn = laws.quarter_tables(v, exact, salt)
    law = laws.joint_law(lambda ctx: laws.enumerate_law(
        lambda d: laws.spec_round(d, ctx, p_fn, q_fn, gamma, mutant), M, exact), PROMPT, length)
    return law, laws.target_law(p_fn, PROMPT, length)


@pytest.mark.parametrize("v,gamma,length,salt", CONFIGS[:2])
def test_exact_law_in_fractions(v, gamma, length, salt, results):
    law, target = _lattice_law(v, gamma, length, salt, exact=True)
    tv = laws.tv(law, target)
    results.metric("L0", f"TV Fraction V={v} γ={gamma} L={length} [{salt}]", str(tv))
    assert tv == 0, f"[L0 law case=fraction-V{v}-g{gamma}-L{length}-{salt}] TV = {tv} ≠ 0"
    assert sum(law.values()) == 1


@pytest.mark.parametrize("v,gamma,length,salt", CONFIGS)
def test_lattice_law_in_float64(v, gamma, length, salt, results):
    law, target = _lattice_law(v, gamma, length, salt, exact=False)
    tv = float(laws.tv(law, target))
    results.metric("L0", f"TV float64 lattice V={v} γ={gamma} L={length} [{salt}]", tv)
    assert tv <= 1e-12, f"[L0 law case=float64-V{v}-g{gamma}-L{length}-{salt}] TV = {tv:.3g}"


def _dirichlet_tables(v, k, salt):
    """Irrational, context-dependent Dirichlet tables; q on k < V tokens (sparse)."""
    def p_fn(ctx):
        g = np.random.default_rng(zlib.crc32(repr((salt, "p") + ctx).encode()))
        p = g.dirichlet(np.full(v, 0.7))
        p[g.integers(v)] = 0.0 if v > 2 else p[0]
        return p / p.sum()

    def q_fn(ctx, e):
        g = np.random.default_rng(zlib.crc32(repr((salt, "q", e) + ctx).encode()))
        q = np.zeros(v)
        q[g.choice(v, k, replace=False)] = g.dirichlet(np.ones(k))
        return q
    return p_fn, q_fn


@pytest.mark.parametrize("v,k,gamma,length", [(4, 3, 3, 4), (5, 2, 2, 4)])
def test_closed_form_law_dirichlet(v, k, gamma, length, results):
    p_fn, q_fn = _dirichlet_tables(v, k, f"{v}{k}")
    law = laws.joint_law(lambda ctx: laws.closed_form_round(ctx, p_fn, q_fn, gamma), PROMPT,
                         length)
    tv = float(laws.tv(law, laws.target_law(p_fn, PROMPT, length)))
    results.metric("L0", f"TV closed form Dirichlet V={v} K={k} γ={gamma} L={length}", tv)
    assert tv <= 1e-12, f"[L0 law case=closed-form-V{v}-K{k}] TV = {tv:.3g} > 1e-12"


def test_greedy_law_is_the_greedy_chain():
    p_fn, q_fn = laws.quarter_tables(4, False, "greedy")
    seq, ctx = (), PROMPT
    while len(seq) < 6:
        out = laws.greedy_round(ctx + seq, p_fn, q_fn, 3)
        seq += out
    chain, c = (), PROMPT
    for _ in range(len(seq)):
        p = np.asarray(p_fn(c + chain), float)
        chain += (int(np.flatnonzero(p == p.max())[0]),)
    assert seq == chain, f"[L0 greedy case=quarter-V4-g3] spec {seq} ≠ target chain {chain}"


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_mutation_is_detected(mutant, results):
    detected = []
    for salt in ("a", "b"):
        law, target = _lattice_law(3, 2, 3, salt, exact=False, mutant=mutant)
        detected.append(float(laws.tv(law, target)))
        if detected[-1] > 1e-3:
            break
    results.metric("L0", f"mutant {mutant} TV", max(detected))
    assert max(detected) > 1e-3, \
        f"[L0 mutation case={mutant}] NOT detected ({MUTANTS[mutant]}): TV {detected}"


def test_reference_philox_known_answers():
    """Random123's known-answer vectors for Philox-4x32-10."""
    kats = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
            ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6,
                                                     0x6d5451fd)),
            ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
             (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    for counter, key, want in kats:
        got = tuple(int(w) for w in rng.philox4x32(counter, key))
        assert got == want, f"[L0 philox case=kat] {got} ≠ {want}"


REFERENCE = Path(__file__).resolve().parent.parent / "reference"


def test_reference_imports_numpy_only_ast():
    for path in sorted(REFERENCE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for n in names:
                assert n.split(".")[0] in {"numpy", "__future__", "fractions", "zlib", "typing",
                                           "math", "dataclasses"}, \
                    f"[L0 purity case={path.name}] reference imports {n!r}"


def test_reference_imports_numpy_only_at_run_time():
    code = ("import sys, importlib, pkgutil; import dflash2rt_conformance.reference as r\n"
            "for m in pkgutil.iter_modules(r.__path__): importlib.import_module(r.__name__ + '.' "
            "+ m.name)\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'dflash2rt', "
            "'triton')]\nprint(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, f"[L0 purity case=sys.modules] loaded: {out.stdout} {out.stderr}"
