"""``constraints.utf8.ByteDFA`` against definitions that share no code with it: Python's own
UTF-8 codec (strict: no overlong form, no surrogate, nothing past U+10FFFF; its incremental
decoder says whether a byte string can still begin valid UTF-8) and the ``regex`` module's
full and partial matching (``re.ASCII``, as the engine documents its escape classes).

For every byte string checked, after walking it byte by byte:

- the state is the dead state exactly when no continuation of the bytes is valid UTF-8 that
  can still become a full match (a character begun counts as every character it can begin);
- the state is accepting, and ``matches`` is true, exactly when the bytes are valid UTF-8 with
  no character pending and the text fully matches.

The byte strings cover every lead byte and every byte after each valid prefix at the bounds
of the UTF-8 ranges (0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0,
0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF), and patterns that tell apart characters of every encoded
length, next to characters they do not name.
"""

from __future__ import annotations

import codecs
import random

import pytest

from dflash2rt.constraints.regex import CharDFA
from dflash2rt.constraints.utf8 import ByteDFA

regex = pytest.importorskip("regex", reason="the regex module (a transformers dependency) "
                            "gives the partial-match reference")

EDGES = (0x00, 0x41, 0x7F, 0x80, 0x81, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF,
         0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF)
ANY = "(.|\n)*"                                 # every text: only UTF-8 validity decides


def _decode_begun(data: bytes) -> tuple[str, bytes] | None:
    """The codec's incremental decoder: (complete characters, bytes held back), None on an
    error it has seen (it may see a bad second byte only at the third: 0xED 0xA0)."""
    d = codecs.getincrementaldecoder("utf-8")("strict")
    try:
        text = d.decode(data, final=False)
    except UnicodeDecodeError:
        return None
    return text, d.getstate()[0]


_FINISHES: dict[bytes, bool] = {}


def _finishes(pending: bytes) -> bool:
    """Whether some continuation bytes make ``pending`` a valid character (by search)."""
    if pending not in _FINISHES:
        got = _decode_begun(pending)
        _FINISHES[pending] = got is not None and (
            bool(got[0]) or any(_finishes(pending + bytes([b])) for b in range(0x80, 0xC0)))
    return _FINISHES[pending]


def _split(data: bytes) -> tuple[str, bytes] | None:
    """(complete characters, bytes of a character begun) of ``data``; None when no byte string
    that starts with ``data`` is valid UTF-8."""
    got = _decode_begun(data)
    if got is None or (got[1] and not _finishes(got[1])):
        return None
    return got


def _walk(dfa: ByteDFA, data: bytes) -> int:
    s = 0
    for b in data:
        s = dfa.step(s, b)
    return s


class _Reference:
    """Whether bytes can still become a full match of ``pattern``, and whether they are one,
    from the codec and ``regex``. ``named``: every non-ASCII character the pattern tells apart
    from others (those a range covers too); each other non-ASCII character matches the same
    atoms as any other (``.``, negated classes and escapes), so one stands for all."""

    def __init__(self, pattern: str, named: str = "") -> None:
        self.rx = regex.compile(pattern, regex.ASCII)
        self.named = set(named) | {c for c in pattern if ord(c) > 0x7F}
        self.memo: dict[bytes, list[str]] = {}

    def _completions(self, pending: bytes) -> list[str]:
        """The named characters that ``pending`` begins, and the first other one."""
        if pending not in self.memo:
            out = sorted(c for c in self.named if c.encode("utf-8").startswith(pending))

            def first_other(seq: bytes) -> str | None:
                split = _split(seq)
                if split is None:
                    return None
                if split[0]:
                    return None if split[0] in self.named else split[0]
                return next((c for b in range(0x80, 0xC0)
                             for c in [first_other(seq + bytes([b]))] if c), None)
            other = first_other(pending)
            self.memo[pending] = out + ([other] if other else [])
        return self.memo[pending]

    def viable(self, data: bytes) -> bool:
        split = _split(data)
        if split is None:
            return False
        text, pending = split
        if not pending:
            return self.rx.fullmatch(text, partial=True) is not None
        return any(self.rx.fullmatch(text + c, partial=True) is not None
                   for c in self._completions(pending))

    def full(self, data: bytes) -> bool:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return self.rx.fullmatch(text) is not None


def _check(dfa: ByteDFA, ref: _Reference, data: bytes, state: int) -> None:
    assert (state == ByteDFA.DEAD) == (not ref.viable(data)), data
    assert dfa.accepting(state) == ref.full(data), data


def _valid_pending(data: bytes) -> bool:
    split = _split(data)
    return split is not None and bool(split[1])


def test_every_one_and_two_byte_string_is_dead_exactly_when_not_a_utf8_beginning():
    dfa, checked = ByteDFA(CharDFA(ANY)), 0
    for a in range(256):
        sa = dfa.step(0, a)
        assert (sa == ByteDFA.DEAD) == (_split(bytes([a])) is None), hex(a)
        assert dfa.accepting(sa) == (a < 0x80), hex(a)
        for b in range(256):
            data = bytes([a, b])
            s = dfa.step(sa, b)
            assert (s == ByteDFA.DEAD) == (_split(data) is None), data
            assert dfa.accepting(s) == dfa.matches(data) == _decodes(data), data
            checked += 1
    assert checked == 256 * 256


def _decodes(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_every_character_begun_continues_exactly_as_the_codec_allows():
    """Every valid two- and three-byte beginning of a character, followed by each byte at a
    bound of the UTF-8 ranges: overlong, surrogate and past-U+10FFFF forms are dead at the
    byte that makes them so, and a character is accepting only once its last byte is in."""
    dfa, checked = ByteDFA(CharDFA(ANY)), 0
    two = [bytes([a, b]) for a in range(0xC0, 0x100) for b in range(0x80, 0xC0)
           if _valid_pending(bytes([a, b]))]
    assert len(two) == (32 + 12 * 64 + 32 + 2 * 64) + (48 + 3 * 64 + 16)   # E0..EF, F0..F4
    three = [p + bytes([b]) for p in two for b in EDGES if _valid_pending(p + bytes([b]))]
    assert len(three) == 256 * 7                  # 0x80 0x81 0x8F 0x90 0x9F 0xA0 0xBF
    for prefix in two + three:
        s = _walk(dfa, prefix)
        assert s != ByteDFA.DEAD and not dfa.accepting(s), prefix
        for b in EDGES + (0x01, 0x3F, 0xBE, 0xE1, 0xEE, 0xF1, 0xF3):
            data = prefix + bytes([b])
            t = dfa.step(s, b)
            assert (t == ByteDFA.DEAD) == (_split(data) is None), data
            assert dfa.accepting(t) == _decodes(data), data
            checked += 1
    assert checked == (len(two) + len(three)) * (len(EDGES) + 7)


def test_the_first_and_last_character_of_every_length_and_range_decode():
    """The bounds of each encoded length and of each lead byte's narrowed second byte."""
    dfa = ByteDFA(CharDFA(ANY))
    for cp in (0x00, 0x7F, 0x80, 0x7FF, 0x800, 0xFFF, 0x1000, 0xCFFF, 0xD000, 0xD7FF, 0xE000,
               0xFFFF, 0x10000, 0x3FFFF, 0x40000, 0xFFFFF, 0x100000, 0x10FFFF):
        data = chr(cp).encode("utf-8")
        assert dfa.matches(data) and dfa.matches(data * 2), hex(cp)
        for cut in range(1, len(data)):
            s = _walk(dfa, data[:cut])
            assert s != ByteDFA.DEAD and not dfa.accepting(s), (hex(cp), cut)
    for bad in (b"\xc0\x80", b"\xc1\xbf", b"\xe0\x9f\xbf", b"\xed\xa0\x80", b"\xed\xbf\xbf",
                b"\xf0\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\x80", b"\xbf",
                b"a\x80", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc3\xa9\xa9", b"\xf8",
                b"\xff"):
        assert not dfa.matches(bad), bad


# (pattern, the non-ASCII characters it tells apart that it does not spell out: a range's)
PATTERNS = [
    ("é", ""),
    ("[^é]é", ""),
    ("a(é|€)*😀?", ""),
    ("[é-ë]+x", "êë"),
    ("[ÿ-ā]\n", "Āā"),                           # a range across lead bytes 0xC3 / 0xC4
    (r"\W\w", ""),
    (".€.", ""),
    ("(😀|😁)x|😂", ""),
    ("[^😀]+", ""),
    ("\u07ff\u0800|\ud7ff\ue000|\uffff\U00010000|\U0010ffff", ""),
    ("[^a\u0800-\u0802]?\u0801", "\u0800\u0802"),
    (r"\S+\s", ""),
    # a character begun whose only live completions have 0x80 next or last, 0xBE / 0xBF
    # last, or none
    ("[^\u0081-\u00bf]", "".join(map(chr, range(0x81, 0xC0)))),
    ("[^\u0801-\u083f]", "".join(map(chr, range(0x801, 0x840)))),
    ("[^\u0800-\u083d]", "".join(map(chr, range(0x800, 0x83E)))),
    ("[^\u0800-\u083f]|x", "".join(map(chr, range(0x800, 0x840)))),
    ("[^\U00010001-\U0001003f]", "".join(map(chr, range(0x10001, 0x10040)))),
    ("a{2}[^b\n]", ""),
]


def _pieces(pattern: str, named: str) -> list[bytes]:
    """Byte pieces for random strings: each named character, every proper prefix of it, ASCII
    and unnamed characters of each length, and the bound bytes."""
    chars = {c for c in pattern + named if ord(c) > 0x7F} | set("ßЖ中\uffef𝄞\U0010fffe")
    out = [c.encode() for c in chars] + [c.encode()[:k] for c in chars
                                         for k in range(1, len(c.encode()))]
    return out + [b"a", b"b", b"x", b"\n", b" ", b"_", b"0"] + [bytes([b]) for b in EDGES]


@pytest.mark.parametrize("pattern,named", PATTERNS, ids=[p for p, _ in PATTERNS])
def test_dead_and_accepting_states_equal_the_codec_and_regex(pattern, named):
    dfa, ref = ByteDFA(CharDFA(pattern)), _Reference(pattern, named)
    pieces = _pieces(pattern, named)
    g = random.Random(pattern)
    alphabet = sorted({b for p in pieces for b in p})
    for a in alphabet:                                           # every short string
        sa = dfa.step(0, a)
        _check(dfa, ref, bytes([a]), sa)
        for b in alphabet:
            _check(dfa, ref, bytes([a, b]), dfa.step(sa, b))
    ends = 0
    for _ in range(300):                                        # every prefix of random ones
        data, s = b"", 0
        for piece in (g.choice(pieces) for _ in range(g.randint(1, 6))):
            for b in piece:
                data += bytes([b])
                s = dfa.step(s, b)
                _check(dfa, ref, data, s)
        ends += dfa.accepting(s)
    g = random.Random(pattern + "!")
    for _ in range(300):                                        # walks the pattern allows
        data, s = b"", 0
        for _ in range(12):
            nxt = [p for p in pieces if _walk_from(dfa, s, p) != ByteDFA.DEAD]
            if not nxt:
                break
            piece = g.choice(nxt)
            for b in piece:
                data += bytes([b])
                s = dfa.step(s, b)
                _check(dfa, ref, data, s)
            ends += dfa.accepting(s)
    assert dfa.matches(b"") == ref.full(b"")
    assert ends > 0, pattern                                     # the walks reach matches


def _walk_from(dfa: ByteDFA, s: int, data: bytes) -> int:
    for b in data:
        s = dfa.step(s, b)
    return s


def test_begun_characters_are_told_apart_by_lead_byte_and_by_what_they_can_become():
    """States merged only where every continuation agrees: the lead bytes whose second byte's
    range is narrower (0xE0, 0xED, 0xF0, 0xF4) are not one state with a lead byte that takes
    0x80..0xBF, and a named character's prefix is not one state with an unnamed one's."""
    dfa = ByteDFA(CharDFA(ANY))
    for narrow, wide in ((0xE0, 0xE1), (0xED, 0xEC), (0xF0, 0xF1), (0xF4, 0xF3)):
        s, t = dfa.step(0, narrow), dfa.step(0, wide)
        assert s != t and ByteDFA.DEAD not in (s, t)
    # "[^😀]+": after F0 9F 98, the byte 0x80 ends the one excluded character
    dfa = ByteDFA(CharDFA("[^😀]+"))
    s = _walk(dfa, b"\xf0\x9f\x98")
    assert dfa.step(s, 0x80) == ByteDFA.DEAD and dfa.accepting(dfa.step(s, 0x81))
    s = _walk(dfa, b"\xf0\x9f\x99")
    assert dfa.accepting(dfa.step(s, 0x80))
    # "é": 0xC3 begins it, 0xC4 begins only characters it cannot use
    dfa = ByteDFA(CharDFA("é"))
    assert dfa.step(0, 0xC3) != ByteDFA.DEAD and dfa.step(0, 0xC4) == ByteDFA.DEAD
    assert dfa.step(dfa.step(0, 0xC3), 0xA8) == ByteDFA.DEAD
    assert dfa.matches("é".encode()) and not dfa.matches("éé".encode())
