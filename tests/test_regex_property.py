r"""The constraint regex engine against Python's ``re``: random patterns from the supported
grammar (literals, ., classes and negated classes, every escape class, groups, *, +, ?, bounded
repeats, alternation) × random strings over an alphabet that hits them; ``CharDFA.matches``
must equal ``re.fullmatch`` on every pair (with ``re.ASCII``: ``\d \w \s`` are the ASCII
classes, as the engine documents; ``.`` and negated classes still match any other character).
"""

from __future__ import annotations

import random
import re

import pytest

from dflash2rt.constraints.regex import CharDFA

ALPHABET = "ab01 _-\n.é"
ATOMS = ["a", "b", "0", "1", " ", "_", "-", "é", r"\.", ".", r"\d", r"\D", r"\w", r"\W",
         r"\s", r"\S", "[ab]", "[^a]", "[0-9]", "[^0-9\\n]", "[a-b_]", "[\\d.]", r"\-", r"\ ",
         r"[\-\.]", r"\é"]


def _pattern(g: random.Random, depth: int = 0) -> str:
    parts = []
    for _ in range(g.randint(1, 3)):
        kind = g.random()
        if kind < 0.2 and depth < 2:
            atom = "(" + "|".join(_pattern(g, depth + 1) for _ in range(g.randint(1, 2))) + ")"
        else:
            atom = g.choice(ATOMS)
        q = g.random()
        if q < 0.15:
            atom += "*"
        elif q < 0.25:
            atom += "+"
        elif q < 0.35:
            atom += "?"
        elif q < 0.45:
            m = g.randint(0, 3)
            atom += g.choice([f"{{{m}}}", f"{{{m},}}", f"{{{m},{m + g.randint(0, 2)}}}"])
        parts.append(atom)
    return "".join(parts)


def _strings(g: random.Random, n: int) -> list[str]:
    return ["", *("".join(g.choice(ALPHABET) for _ in range(g.randint(1, 8))) for _ in range(n))]


@pytest.mark.parametrize("seed", range(4))
def test_char_dfa_equals_re_fullmatch(seed):
    g = random.Random(seed)
    checked = mismatches = matched = 0
    for _ in range(100):
        pat = _pattern(g)
        dfa = CharDFA(pat)
        rx = re.compile(pat, re.ASCII)
        for text in _strings(g, 60):
            want = rx.fullmatch(text) is not None
            matched += want
            checked += 1
            if dfa.matches(text) != want:
                mismatches += 1
                pytest.fail(f"{pat!r} on {text!r}: dfa {not want}, re {want}")
    assert checked == 100 * 61 and mismatches == 0
    assert matched > 100                 # the generator reaches both outcomes
