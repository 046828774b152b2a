"""Automatic mutants of one module, each run against the tests you name: a sweep that finds
classes of bug the suite lets through (the hand-made, named mutants are ``mutants.py``).

    python scripts/mutate.py --tree /tmp/copy dflash2rt/ops/verify.py tests/test_verify.py ...
    python scripts/mutate.py --tree /tmp/copy MODULE TESTS... --recheck LOG   # its survivors

``--tree``: a copy of the working tree (``git worktree add /tmp/copy``) whose module is
mutated in place and restored after each mutant; its tests import its own ``dflash2rt``
(PYTHONPATH), so the tree you edit is never touched. Each mutant changes one node of the
module's syntax tree: a comparison (< and <=, == and !=, is / in and their negations), an
arithmetic or bitwise operator, ``and`` / ``or``, a ``not`` / unary minus / ``~`` dropped, an
``if`` negated, a number + 1 (or × 2), a boolean constant flipped; docstrings and annotations
are left alone. It runs ``pytest -x -m "not slow"`` on the tests (one torch thread) and prints
each SURVIVED mutant (line, kind, change, the changed statement); the output of one run is
what ``--recheck`` reads.
Some survivors are equivalent (a fast path that computes the same values, a slice end past the
data): read each before writing a test for it.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import time

CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
       ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn,
       ast.NotIn: ast.In}
BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.Div: ast.Mult,
       ast.FloorDiv: ast.Div, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd,
       ast.Mod: ast.FloorDiv}


def _skipped(tree: ast.AST) -> set[int]:
    """ids of docstring constants and of every node inside an annotation."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and n.body and isinstance(n.body[0], ast.Expr) \
                and isinstance(n.body[0].value, ast.Constant):
            out.add(id(n.body[0].value))
        anns = [n.annotation] if isinstance(n, (ast.arg, ast.AnnAssign)) and n.annotation else []
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.returns is not None:
            anns.append(n.returns)
        for a in anns:
            out.update(id(x) for x in ast.walk(a))
    return out


def points(tree: ast.AST) -> list[tuple[int, str, int, int]]:
    """(node index in ast.walk order, kind, operand index, line) of every mutation."""
    skip, pts = _skipped(tree), []
    for i, n in enumerate(ast.walk(tree)):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Compare):
            pts += [(i, "cmp", j, n.lineno) for j, op in enumerate(n.ops) if type(op) in CMP]
        elif isinstance(n, (ast.BinOp, ast.AugAssign)) and type(n.op) in BIN:
            pts.append((i, "bin", 0, n.lineno))
        elif isinstance(n, ast.BoolOp):
            pts.append((i, "bool", 0, n.lineno))
        elif isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.Not, ast.USub, ast.Invert)):
            pts.append((i, "unary", 0, n.lineno))
        elif isinstance(n, ast.Constant) and type(n.value) in (bool, int, float):
            pts.append((i, "const", 0, n.lineno))
        elif isinstance(n, ast.If):
            pts.append((i, "if", 0, n.lineno))
    return pts


def mutate(src: str, pt: tuple[int, str, int, int]) -> tuple[str, str]:
    """The module's source with one mutation applied → (source, what changed)."""
    tree = ast.parse(src)
    idx, kind, j, _ = pt
    n = next(x for i, x in enumerate(ast.walk(tree)) if i == idx)
    if kind == "cmp":
        old = n.ops[j]
        n.ops[j] = CMP[type(old)]()
        desc = f"{type(old).__name__}->{type(n.ops[j]).__name__}"
    elif kind == "bin":
        old = n.op
        n.op = BIN[type(old)]()
        desc = f"{type(old).__name__}->{type(n.op).__name__}"
    elif kind == "bool":
        desc = f"{type(n.op).__name__}->swapped"
        n.op = ast.Or() if isinstance(n.op, ast.And) else ast.And()
    elif kind == "unary":
        desc = f"drop {type(n.op).__name__}"
        for parent in ast.walk(tree):
            for field, value in ast.iter_fields(parent):
                if value is n:
                    setattr(parent, field, n.operand)
                elif isinstance(value, list):
                    value[:] = [n.operand if x is n else x for x in value]
    elif kind == "const" and isinstance(n.value, bool):
        desc = f"{n.value}->{not n.value}"
        n.value = not n.value
    elif kind == "const":
        old = n.value
        n.value = old * 2 if isinstance(old, float) and old else old + 1
        desc = f"{old!r}->{n.value!r}"
    else:
        desc = "if negated"
        n.test = ast.UnaryOp(ast.Not(), n.test)
    return ast.unparse(ast.fix_missing_locations(tree)), desc


def changed_line(base: list[str], mutated: str) -> str:
    """The statement a mutant changed, as ``ast.unparse`` writes it (two mutants of one line
    with the same description, such as either ``&`` of ``a & b & c``, differ here)."""
    new = mutated.splitlines()
    return next((n.strip() for o, n in zip(base, new) if o != n), "")


def survivors(log: str) -> set[tuple]:
    """(line, kind, description, changed statement) of each survivor a run printed; runs that
    printed no statement give (line, kind, description), which matches every mutant so
    described."""
    out = set()
    for line in open(log, encoding="utf-8"):
        m = re.match(r"SURVIVED line (\d+) (\S+) (.*?) \(\d+ ?s\)(?:: (.*))?$", line.rstrip("\n"))
        if m:
            key = (int(m.group(1)), m.group(2), m.group(3))
            out.add(key + (m.group(4),) if m.group(4) is not None else key)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("module", help="the module's path inside the tree")
    ap.add_argument("tests", nargs="+", help="test files (paths inside the tree)")
    ap.add_argument("--tree", required=True, help="a copy of the working tree to mutate")
    ap.add_argument("--recheck", help="the output of an earlier run: only its survivors")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per mutant's tests")
    a = ap.parse_args()
    path = os.path.join(a.tree, a.module)
    src = open(path, encoding="utf-8").read()
    pts = points(ast.parse(src))
    base = ast.unparse(ast.parse(src)).splitlines()
    if a.recheck:
        want = survivors(a.recheck)

        def wanted(p) -> bool:
            s, d = mutate(src, p)
            return (p[3], p[1], d) in want or (p[3], p[1], d, changed_line(base, s)) in want
        pts = [p for p in pts if wanted(p)]
    print(f"{len(pts)} mutants of {a.module}", flush=True)
    env = {**os.environ, "PYTHONPATH": os.path.abspath(a.tree), "OMP_NUM_THREADS": "1"}
    alive = 0
    try:
        for k, pt in enumerate(pts):
            mutated, desc = mutate(src, pt)
            with open(path, "w", encoding="utf-8") as f:
                f.write(mutated)
            t = time.monotonic()
            try:
                rc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p",
                                     "no:randomly", "-p", "no:cacheprovider", "-m",
                                     "not slow", *a.tests], cwd=a.tree, env=env,
                                    capture_output=True, timeout=a.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = -9
            if rc in (0, 5):            # 5: no test ran, which kills nothing either
                alive += 1
                print(f"SURVIVED line {pt[3]} {pt[1]} {desc} ({time.monotonic() - t:.0f} s): "
                      f"{changed_line(base, mutated)}", flush=True)
            if k % 25 == 24:
                print(f"... {k + 1} of {len(pts)}", flush=True)
    finally:
        with open(path, "w", encoding="utf-8") as f:
            f.write(src)
    print(f"{alive} of {len(pts)} survived", flush=True)
    return 1 if alive else 0


if __name__ == "__main__":
    sys.exit(main())
