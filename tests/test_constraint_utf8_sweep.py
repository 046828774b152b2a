"""``constraints.utf8.ByteDFA``'s states against its documented shape, written out by hand: the
dead state is -1 (as ``CharDFA``'s and the token tables' no-transition), and a character
begun under a pattern that names no non-ASCII character is one state per (bytes still to
come, lead byte that narrows the next byte's range), whatever its lead byte or length."""

from __future__ import annotations

import pytest

from dflash2rt.constraints.regex import CharDFA
from dflash2rt.constraints.utf8 import ByteDFA

from test_constraint_utf8_defs import ANY, _walk


@pytest.mark.parametrize("byte", [0x80, 0xBF, 0xC0, 0xC1, 0xF5, 0xF8, 0xFF])
def test_the_dead_state_is_minus_one_and_stays_dead(byte):
    dfa = ByteDFA(CharDFA(ANY))
    assert dfa.step(0, byte) == -1
    assert dfa.step(dfa.step(0, 0x41), byte) == -1
    assert [dfa.step(-1, b) for b in range(256)] == [-1] * 256
    assert dfa.accepting(-1) is False and dfa.matches(bytes([0x41, byte])) is False
    assert _walk(ByteDFA(CharDFA("é")), b"\xc3\xa8") == -1          # valid UTF-8, not "é"


# Beginnings of characters under ANY, by hand from the UTF-8 table: one byte to come (a
# two-byte lead, two bytes of a three-byte character, three of a four-byte one), two to come
# (a three-byte lead other than E0 / ED, two bytes of a four-byte character), three to come
# (a four-byte lead other than F0 / F4), and the four leads whose second byte is narrower.
ONE_LEFT = [b"\xc2", b"\xc3", b"\xdf", b"\xe0\xa0", b"\xe0\xbf", b"\xe1\x80", b"\xed\x9f",
            b"\xef\xbf", b"\xf0\x90\x80", b"\xf1\x80\xbf", b"\xf4\x8f\xbf"]
TWO_LEFT = [b"\xe1", b"\xec", b"\xee", b"\xef", b"\xf0\x90", b"\xf0\xbf", b"\xf1\x80",
            b"\xf3\xbf", b"\xf4\x80", b"\xf4\x8f"]
THREE_LEFT = [b"\xf1", b"\xf2", b"\xf3"]
NARROW = [b"\xe0", b"\xed", b"\xf0", b"\xf4"]


def test_a_character_begun_is_one_state_per_bytes_left_and_narrowing_lead():
    dfa = ByteDFA(CharDFA(ANY))
    groups = [ONE_LEFT, TWO_LEFT, THREE_LEFT] + [[n] for n in NARROW]
    states = [{_walk(dfa, seq) for seq in group} for group in groups]
    assert [len(s) for s in states] == [1] * 7, states
    merged = [s.pop() for s in states]
    assert len(set(merged)) == 7 and -1 not in merged
    assert not any(dfa.accepting(s) for s in merged)


def test_every_two_byte_lead_and_every_three_byte_start_of_a_four_byte_character_merge():
    """All 30 two-byte leads, and all 3 × 16 × 64 + 16 × 64 + 48 × 64 three-byte beginnings of
    four-byte characters, are one state (with one byte to come)."""
    dfa = ByteDFA(CharDFA(ANY))
    leads = {dfa.step(0, b) for b in range(0xC2, 0xE0)}
    second = {0xF0: range(0x90, 0xC0), 0xF4: range(0x80, 0x90)}
    begun = {_walk(dfa, bytes([a, b, c])) for a in range(0xF0, 0xF5)
             for b in second.get(a, range(0x80, 0xC0)) for c in range(0x80, 0xC0)}
    assert len(leads) == 1 and leads == begun
