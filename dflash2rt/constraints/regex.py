"""A small regular-expression engine over characters: parse → Thompson NFA → DFA states built
on demand (subset construction), so that ``TokenAutomaton.from_regex`` can walk each token's
text through it from every state.

Syntax (a full match of the whole output is what the pattern describes): literals; ``.`` (any
character but a newline); classes ``[abc]``, ranges ``[0-9a-f]``, negated ``[^...]``; escapes
``\\d \\w \\s`` (ASCII digits, word characters, whitespace), ``\\n \\t \\r`` and any escaped
punctuation (``\\]``, ``\\.``, ``\\\\``); negated escapes ``\\D \\W \\S``; grouping ``( )``; postfix ``*``,
``+``, ``?`` and bounded repeats ``{m}``, ``{m,}``, ``{m,n}``; alternation ``|``. Anything else
(anchors, back-references, lazy quantifiers, lookaround) raises ConstraintError naming it
rather than being read as a literal.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from ..errors import ConstraintError

_CLASSES = {"d": frozenset(string.digits),
            "w": frozenset(string.ascii_letters + string.digits + "_"),
            "s": frozenset(" \t\n\r\f\v")}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}


@dataclass(frozen=True)
class CharSet:
    """A set of characters: ``chars``, or every character outside it when ``negated``."""

    chars: frozenset
    negated: bool = False

    def __contains__(self, ch: str) -> bool:
        return (ch in self.chars) != self.negated


class _Parser:
    """Recursive descent over the pattern → NFA fragments (start, end) in ``nfa``."""

    def __init__(self, pattern: str) -> None:
        self.p, self.i = pattern, 0
        self.edges: list[list[tuple[CharSet | None, int]]] = []   # state → [(label, to)]

    def state(self) -> int:
        self.edges.append([])
        return len(self.edges) - 1

    def fail(self, what: str) -> ConstraintError:
        return ConstraintError(f"regex {self.p!r}: {what} at position {self.i}")

    def peek(self) -> str | None:
        return self.p[self.i] if self.i < len(self.p) else None

    def alternation(self) -> tuple[int, int]:
        frags = [self.concat()]
        while self.peek() == "|":
            self.i += 1
            frags.append(self.concat())
        if len(frags) == 1:
            return frags[0]
        s, e = self.state(), self.state()
        for a, b in frags:
            self.edges[s].append((None, a))
            self.edges[b].append((None, e))
        return s, e

    def concat(self) -> tuple[int, int]:
        s = e = self.state()
        while self.peek() not in (None, "|", ")"):
            a, b = self.repeat()
            self.edges[e].append((None, a))
            e = b
        return s, e

    def repeat(self) -> tuple[int, int]:
        start = self.i
        a, b = self.atom()
        while self.peek() in ("*", "+", "?", "{"):
            if self.peek() == "{":
                a, b = self.counted(start, a, b)
                start = -1                      # a repeat of a repeat: not supported
                continue
            op = self.p[self.i]
            self.i += 1
            start = -1                          # a bounded repeat may not follow
            s, e = self.state(), self.state()
            self.edges[s].append((None, a))
            self.edges[b].append((None, e))
            if op in "*?":
                self.edges[s].append((None, e))         # zero times
            if op in "*+":
                self.edges[b].append((None, a))         # again
            a, b = s, e
        return a, b

    MAX_REPEAT = 1000

    def counted(self, start: int, a: int, b: int) -> tuple[int, int]:
        """``{m}``, ``{m,}``, ``{m,n}`` after the atom ``pattern[start:i]`` (fragment a → b):
        m copies, then n − m optional ones (``{m,}``: then any number)."""
        if start < 0:
            raise self.fail("a bounded repeat of a repeat (group it: (a*){2})")
        end = self.p.find("}", self.i)
        body = self.p[self.i + 1:end] if end > 0 else ""
        parts = body.split(",")
        if end < 0 or len(parts) > 2 or not parts[0].isdigit() \
                or (len(parts) == 2 and parts[1] and not parts[1].isdigit()):
            raise self.fail("a bounded repeat must be {m}, {m,} or {m,n} with decimal m and n")
        lo = int(parts[0])
        hi = lo if len(parts) == 1 else (int(parts[1]) if parts[1] else None)
        if (hi is not None and hi < lo) or max(lo, hi or 0) > self.MAX_REPEAT:
            raise self.fail(f"bad bounded repeat {{{body}}} (0 <= m <= n <= {self.MAX_REPEAT})")
        atom_src = self.p[start:self.i]
        count = lo + 1 if hi is None else hi
        copies = [(a, b)] + [self._reparse(atom_src) for _ in range(max(count, 1) - 1)]
        s = e = self.state()
        for k, (x, y) in enumerate(copies[:count]):
            if hi is None and k == lo:                          # {m,}: the last copy, starred
                self.edges[e].append((None, x))
                self.edges[y].append((None, x))
                self.edges[x].append((None, y))
            else:
                self.edges[e].append((None, x))
                if k >= lo:                                     # one of the n − m optional
                    self.edges[x].append((None, y))
            e = y
        self.i = end + 1
        return s, e

    def _reparse(self, src: str) -> tuple[int, int]:
        """A fresh NFA fragment of the atom text ``src`` (each copy needs states of its own)."""
        saved = self.p, self.i
        self.p, self.i = src, 0
        try:
            return self.atom()
        finally:
            self.p, self.i = saved

    def atom(self) -> tuple[int, int]:
        ch = self.peek()
        if ch == "(":
            self.i += 1
            frag = self.alternation()
            if self.peek() != ")":
                raise self.fail("unclosed '('")
            self.i += 1
            return frag
        if ch in ("*", "+", "?"):
            raise self.fail(f"{ch!r} with nothing to repeat")
        if ch in ("{", "}", "^", "$", ")", "]"):
            raise self.fail(f"unsupported or unbalanced {ch!r} (escape it to match it)")
        label = self.char_class() if ch == "[" else self.single()
        s, e = self.state(), self.state()
        self.edges[s].append((label, e))
        return s, e

    def single(self) -> CharSet:
        ch = self.p[self.i]
        self.i += 1
        if ch == ".":
            return CharSet(frozenset("\n"), negated=True)
        if ch != "\\":
            return CharSet(frozenset(ch))
        return self.escape()

    def escape(self) -> CharSet:
        if self.i >= len(self.p):
            raise self.fail("a trailing backslash")
        ch = self.p[self.i]
        self.i += 1
        if ch in _CLASSES:
            return CharSet(_CLASSES[ch])
        if ch.isupper() and ch.lower() in _CLASSES:            # \D \W \S
            return CharSet(_CLASSES[ch.lower()], negated=True)
        if ch in _ESCAPES:
            return CharSet(frozenset(_ESCAPES[ch]))
        if not (ch.isascii() and ch.isalnum()):               # as re: \" \- \. \\ ...
            return CharSet(frozenset(ch))
        raise self.fail(f"unsupported escape \\{ch}")

    def char_class(self) -> CharSet:
        self.i += 1                                          # '['
        negated = self.peek() == "^"
        self.i += negated
        chars: set[str] = set()
        first = True
        while True:
            ch = self.peek()
            if ch is None:
                raise self.fail("unclosed '['")
            if ch == "]" and not first:
                self.i += 1
                return CharSet(frozenset(chars), negated)
            first = False
            lo = self.class_char()
            if isinstance(lo, frozenset):
                chars |= lo
                continue
            if self.peek() == "-" and self.i + 1 < len(self.p) and self.p[self.i + 1] != "]":
                self.i += 1
                hi = self.class_char()
                if isinstance(hi, frozenset) or hi < lo:
                    raise self.fail(f"bad range {lo!r}-{hi!r}")
                chars |= {chr(c) for c in range(ord(lo), ord(hi) + 1)}
            else:
                chars.add(lo)

    def class_char(self) -> str | frozenset:
        ch = self.p[self.i]
        self.i += 1
        if ch != "\\":
            return ch
        cs = self.escape()
        if cs.negated:
            raise self.fail("a negated escape inside a class")
        return cs.chars if len(cs.chars) != 1 else next(iter(cs.chars))


class CharDFA:
    """The pattern's DFA over characters, its states made on demand: state 0 is the start,
    ``DEAD`` (-1) the empty set; ``step(state, ch)``, ``accepting(state)``. ``mentioned``: the
    characters the pattern names; every other character steps as any other one does."""

    DEAD = -1

    def __init__(self, pattern: str) -> None:
        if not isinstance(pattern, str):
            raise ConstraintError(f"a regex must be a string, got {type(pattern).__name__}")
        parser = _Parser(pattern)
        start, self.final = parser.alternation()
        if parser.i != len(pattern):
            raise parser.fail("unbalanced ')'")
        self.edges = parser.edges
        self.mentioned = frozenset().union(*(label.chars for out in self.edges
                                             for label, _ in out if label is not None))
        self.sets: list[frozenset] = []
        self.ids: dict[frozenset, int] = {}
        self.memo: dict[tuple[int, str], int] = {}
        self._id(self._closure({start}))

    def _closure(self, states) -> frozenset:
        out, todo = set(states), list(states)
        while todo:
            for label, to in self.edges[todo.pop()]:
                if label is None and to not in out:
                    out.add(to)
                    todo.append(to)
        return frozenset(out)

    def _id(self, s: frozenset) -> int:
        if not s:
            return self.DEAD
        if s not in self.ids:
            self.ids[s] = len(self.sets)
            self.sets.append(s)
        return self.ids[s]

    def step(self, state: int, ch: str) -> int:
        if state == self.DEAD:
            return self.DEAD
        key = (state, ch)
        if key not in self.memo:
            moved = {to for n in self.sets[state] for label, to in self.edges[n]
                     if label is not None and ch in label}
            self.memo[key] = self._id(self._closure(moved))
        return self.memo[key]

    def accepting(self, state: int) -> bool:
        return state != self.DEAD and self.final in self.sets[state]

    def matches(self, text: str) -> bool:
        """Whether the whole ``text`` matches (tests and the reference use it)."""
        s = 0
        for ch in text:
            s = self.step(s, ch)
        return self.accepting(s)
