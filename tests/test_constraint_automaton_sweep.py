"""``constraints.automaton.TokenAutomaton.from_regex`` and its id checks, against tables and
messages written out by hand.

The regex engine's start state is never re-entered (its NFA start has no incoming edge), so a
lifted table never leads back to state 0 and the suite's patterns cannot tell whether the
lifting, the pruning and ``allow_special`` treat a transition into state 0 as one. Here a
stand-in byte DFA, the minimal automaton of ``(ab)*`` (0 -a-> 1 -b-> 0, state 0 accepting), is
lifted over a hand-built vocabulary instead, and the expected table is written out by hand.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from dflash2rt.constraints import TokenAutomaton, automaton
from dflash2rt.errors import ConstraintError
from test_constraints import ListTokenizer




class CyclicByteDFA:
    """``(ab)*`` as its minimal byte DFA: state 0 (start, accepting) -a-> 1 -b-> 0."""

    DEAD = -1
    EDGES = {(0, ord("a")): 1, (1, ord("b")): 0}

    def __init__(self, char_dfa) -> None:
        pass

    def step(self, state: int, byte: int) -> int:
        return self.EDGES.get((state, byte), self.DEAD)

    def accepting(self, state: int) -> bool:
        return state == 0


TEXTS = ["a", "b", "ab", "<sp>", "<eos>"]
SP, EOS = 3, 4


@pytest.fixture
def cyclic(monkeypatch):
    monkeypatch.setattr(automaton, "ByteDFA", CyclicByteDFA)
    return TokenAutomaton.from_regex("(ab)*", ListTokenizer(TEXTS), eos=[EOS],
                                     allow_special=[SP])


def test_a_token_back_to_the_start_state_leads_to_state_0(cyclic):
    assert cyclic.advance(0, TEXTS.index("ab")) == 0
    assert cyclic.advance(cyclic.advance(0, TEXTS.index("a")), TEXTS.index("b")) == 0


def test_a_state_whose_only_way_to_a_match_is_back_through_the_start_is_kept(cyclic):
    after_a = cyclic.advance(0, TEXTS.index("a"))
    assert after_a == 1 and not cyclic.accepting(after_a)
    assert cyclic.allowed(after_a).tolist() == [False, True, False, True, False]


def test_an_allowed_special_token_loops_on_a_state_whose_tokens_all_lead_to_the_start(cyclic):
    assert cyclic.advance(1, SP) == 1 and cyclic.advance(0, SP) == 0
    assert not cyclic.allowed(2)[SP]                                # not after EOS


def test_the_lifted_cyclic_table_written_out(cyclic):
    #                          a   b  ab  sp eos
    assert cyclic.next.tolist() == [[1, -1, 0, 0, 2],
                                    [-1, 0, -1, 1, -1],
                                    [-1, -1, -1, -1, -1]]
    assert cyclic.final.tolist() == [True, False, True]


def test_a_bad_id_list_is_quoted_up_to_its_first_eight_ids():
    want = "ids must be token ids in [0, 6), got [10, 11, 12, 13, 14, 15, 16, 17]"
    with pytest.raises(ConstraintError, match=re.escape(want) + "$"):
        TokenAutomaton.token_set(list(range(10, 20)), 6)
    with pytest.raises(ConstraintError, match=re.escape("got [6, 7]") + "$"):
        TokenAutomaton.token_set([6, 7], 6)


def test_a_forbidden_entry_of_a_lifted_table_is_minus_one():
    tok = ListTokenizer(["a", "b", "", "ab"])
    a = TokenAutomaton.from_regex("ab", tok, vocab_size=6)
    assert int(np.min(a.next)) == -1
    assert a.next[0].tolist() == [1, -1, -1, 2, -1, -1]
