"""The pattern's automaton over the UTF-8 bytes of the output (``regex.CharDFA`` underneath).

Tokens add bytes, not characters: a byte-fallback token is one byte of a character, and a
byte-level BPE token may end inside one. A state here is a character-DFA state with the bytes
of a character begun but not finished (at most three); a byte that cannot continue valid UTF-8
(a stray continuation byte, an overlong or surrogate form, a code point past U+10FFFF) is the
dead state, so no output the automaton accepts is invalid UTF-8, and a state is accepting only
with no character pending.
"""

from __future__ import annotations

from bisect import bisect_left

from .regex import CharDFA


def _expected(lead: int) -> int:
    """Bytes in the sequence a lead byte starts (0: not a lead byte)."""
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0


def _second_ok(lead: int, b: int) -> bool:
    """The second byte's range, which excludes overlong forms, surrogates and > U+10FFFF."""
    lo, hi = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF),
              0xF4: (0x80, 0x8F)}.get(lead, (0x80, 0xBF))
    return lo <= b <= hi


def _completions(seq: bytes):
    """Every character whose UTF-8 starts with ``seq`` (a valid partial sequence), in code
    point order, lazily."""
    left = _expected(seq[0]) - len(seq)
    if left == 0:
        yield seq.decode("utf-8")
        return
    lo, hi = (0x80, 0xBF)
    if len(seq) == 1:
        lo = next(b for b in range(0x80, 0xC0) if _second_ok(seq[0], b))
        hi = max(b for b in range(0x80, 0xC0) if _second_ok(seq[0], b))
    for b in range(lo, hi + 1):
        yield from _completions(seq + bytes([b]))


class ByteDFA:
    """``step(state, byte)``, ``accepting(state)``; states made on demand, 0 the start, ``DEAD``
    (-1) the dead state.

    A state with a character begun is kept as what the rest of that character can do: the
    character-DFA state each character the pattern names (``CharDFA.mentioned``) would reach,
    and the one every other character reaches. Begun characters that agree on that are one
    state (there are about 20,000 three-byte beginnings of four-byte characters, and a pattern
    tells few of them apart), and one whose every completion is dead is the dead state."""

    DEAD = -1

    def __init__(self, dfa: CharDFA) -> None:
        self.dfa = dfa
        named = sorted(dfa.mentioned)                        # code point order = byte order
        self.named = [(ch, ch.encode("utf-8")) for ch in named]
        self.named_bytes = [enc for _, enc in self.named]
        self.states: list[tuple[int, bytes]] = [(0, b"")]    # a representative of each state
        self.ids: dict[tuple, int] = {(0, b""): 0}
        self.memo: dict[tuple[int, int], int] = {}

    def _id(self, cs: int, pending: bytes = b"") -> int:
        if cs == CharDFA.DEAD:
            return self.DEAD
        key = (cs, b"") if not pending else self._future(cs, pending)
        if key is None:
            return self.DEAD
        if key not in self.ids:
            self.ids[key] = len(self.states)
            self.states.append((cs, pending))
        return self.ids[key]

    def _future(self, cs: int, seq: bytes) -> tuple | None:
        """What completing the begun character ``seq`` from ``cs`` can lead to (None: dead
        whatever follows): the bytes left, the lead byte where it narrows the next byte's
        range, each named character's remaining bytes and state, and every other's state."""
        lo = bisect_left(self.named_bytes, seq)
        named = []
        for ch, enc in self.named[lo:]:
            if not enc.startswith(seq):
                break
            named.append((enc[len(seq):], self.dfa.step(cs, ch)))
        names = {ch for ch, enc in self.named[lo:lo + len(named)]}
        other = next((c for c in _completions(seq) if c not in names), None)
        other_to = CharDFA.DEAD if other is None else self.dfa.step(cs, other)
        if other_to == CharDFA.DEAD and all(t == CharDFA.DEAD for _, t in named):
            return None
        narrow = seq[0] if len(seq) == 1 and seq[0] in (0xE0, 0xED, 0xF0, 0xF4) else None
        return ("begun", _expected(seq[0]) - len(seq), narrow, tuple(named), other_to)

    def step(self, state: int, byte: int) -> int:
        if state == self.DEAD:
            return self.DEAD
        key = (state, byte)
        if key not in self.memo:
            self.memo[key] = self._step(*self.states[state], byte)
        return self.memo[key]

    def _step(self, cs: int, pending: bytes, byte: int) -> int:
        if not pending:
            need = _expected(byte)
            if need == 0:
                return self.DEAD
            if need == 1:
                return self._id(self.dfa.step(cs, chr(byte)))
            return self._id(cs, bytes([byte]))
        if len(pending) == 1 and not _second_ok(pending[0], byte) \
                or not 0x80 <= byte <= 0xBF:
            return self.DEAD
        seq = pending + bytes([byte])
        if len(seq) < _expected(seq[0]):
            return self._id(cs, seq)
        return self._id(self.dfa.step(cs, seq.decode("utf-8")))

    def accepting(self, state: int) -> bool:
        if state == self.DEAD:
            return False
        cs, pending = self.states[state]
        return not pending and self.dfa.accepting(cs)

    def matches(self, data: bytes) -> bool:
        s = 0
        for b in data:
            s = self.step(s, b)
        return self.accepting(s)
