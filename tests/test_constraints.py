"""Constraint hooks, the parts below the engine: the regex engine, token automata
(validation, regex lifting, token sets), the device masking of verify rows along the drafts,
and the host's walk."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from dflash2rt.constraints import TokenAutomaton
from dflash2rt.constraints.device import ConstraintBatch, block_states
from dflash2rt.constraints.host import ConstraintTracker
from dflash2rt.constraints.regex import CharDFA
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.errors import ConstraintError, SamplingParamsError


class ListTokenizer:
    """A tokenizer whose token i has text ``texts[i]``."""

    def __init__(self, texts):
        self.texts = list(texts)
        self.vocab_size = len(self.texts)

    def decode(self, ids):
        return "".join(self.texts[i] for i in ids)


TEXTS = ["", "0", "1", "12", "]", "3]", "a", "]]", ",", "9,", "x1", "<eos>"]
EOS = 11


@pytest.mark.parametrize("pattern,yes,no", [
    (r"[0-9]+\]", ["1]", "0123]"], ["]", "12", "1]]", "a]"]),
    (r"(ab|c)*d", ["d", "abd", "cabcd"], ["", "ad", "abc"]),
    (r"a.?b", ["ab", "axb"], ["a\nb", "axxb"]),
    (r"[^0-9\]]+", ["ab", "-x"], ["a1", "]", ""]),
    (r"\d\w\s[a-c-]", ["1_ -", "9z\tb"], ["a1 a", "11 d"]),
    (r"x|", ["x", ""], ["xx"]),
    (r"[]a]*\.", ["].", "a].", "."], ["a]"]),
    (r"[a-a]+", ["a", "aa"], ["b", "-", ""]),                     # a range of one character
    (r"[\t-\r]", ["\t", "\n", "\r", "\x0b"], ["-", "\\", "t", " "]),   # escaped ends
    (r"[a-]x", ["ax", "-x"], ["bx", "x"]),                       # a trailing "-" is literal
])
def test_regex_matches(pattern, yes, no):
    dfa = CharDFA(pattern)
    assert all(dfa.matches(s) for s in yes), [s for s in yes if not dfa.matches(s)]
    assert not any(dfa.matches(s) for s in no), [s for s in no if dfa.matches(s)]


@pytest.mark.parametrize("pattern,match", [
    ("(ab", "unclosed"), ("ab)", "unbalanced"), ("*a", "nothing to repeat"),
    ("a{2,1}", "bad bounded repeat"), ("a{x}", "bounded repeat must be"), ("a{2", "bounded"),
    ("a*{2}", "repeat of a repeat"), ("a{2}{3}", "repeat of a repeat"),
    ("a{1001}", "bad bounded repeat"),
    ("a{2,1001}", "bad bounded repeat"), ("a{2,x}", "bounded repeat must be"),
    ("a{2,3,4}", "bounded repeat must be"), ("[a-", "unclosed"),
    ("a{1001,}", "bad bounded repeat"),
    ("[z-a]", "bad range"), (r"\q", "unsupported escape"), (r"\A", "unsupported escape"),
    (r"\Z", "unsupported escape"), (r"\B", "unsupported escape"),
    ("ab\\", "trailing backslash"), ("[ab", "unclosed"), ("^a", "unsupported")])
def test_regex_errors_name_the_problem(pattern, match):
    with pytest.raises(ConstraintError, match=match):
        CharDFA(pattern)


@pytest.mark.parametrize("pattern,n_min,n_max", [("a{1000}", 1000, 1000), ("a{0,1000}", 0, 1000),
                                                 ("a{1000,}", 1000, None)])
def test_a_bounded_repeat_of_the_largest_count_is_taken_exactly(pattern, n_min, n_max):
    dfa = CharDFA(pattern)
    for n in (0, 1, 999, 1000, 1001, 1500):
        want = n >= n_min and (n_max is None or n <= n_max)
        assert dfa.matches("a" * n) == want, n


@pytest.mark.parametrize("table,start,match", [
    (np.zeros((2, 3, 1), np.int32), 0, r"\[states, vocab\]"),
    (np.zeros((2, 3), np.float32), 0, "integers"),
    (np.array([[0, 2]]), 0, "next states"),
    (np.array([[0, 1]]), 0, "next states"),                      # one past the last state
    (np.zeros((0, 3), np.int32), 0, r"\[states, vocab\]"),
    (np.zeros((2, 0), np.int32), 0, r"\[states, vocab\]"),
    (np.array([[0, -2]]), 0, "next states"),
    (np.array([[0, 0]]), 1, "start state"),
    (np.array([[1, 1], [-1, -1]]), 1, "start state allows no token")])
def test_automaton_validation(table, start, match):
    with pytest.raises(ConstraintError, match=match):
        TokenAutomaton(table, start)


@pytest.mark.parametrize("vocab", [0, -3, 2.5, "12"])
def test_a_regex_automaton_needs_a_positive_integer_vocabulary(vocab):
    tok = ListTokenizer(TEXTS)
    with pytest.raises(ConstraintError, match="vocab_size must be a positive integer"):
        TokenAutomaton.from_regex("1", tok, vocab_size=vocab)


def test_a_regex_automaton_takes_the_vocabulary_size_it_is_given():
    tok = ListTokenizer(TEXTS)
    assert TokenAutomaton.from_regex("1", tok).next.shape[1] == len(TEXTS)   # its own size
    assert TokenAutomaton.from_regex("1", tok, vocab_size=3).next.shape[1] == 3
    one = TokenAutomaton.from_regex("1+", ListTokenizer(["1"]))             # one token: fine
    assert one.next.shape == (2, 1) and one.allowed(one.initial()).tolist() == [True]


def test_eos_leads_to_a_dead_end():
    """EOS is allowed exactly where the output is a complete match, and after it nothing is."""
    a = TokenAutomaton.from_regex(r"[0-9]+\]", ListTokenizer(TEXTS), eos=[EOS])
    s = a.advance(a.advance(a.initial(), TEXTS.index("12")), TEXTS.index("]"))
    assert a.allowed(s)[EOS] and a.accepting(s)
    end = a.advance(s, EOS)
    assert not a.allowed(end).any() and a.accepting(end)         # ended, and complete
    assert not a.allowed(a.advance(a.initial(), TEXTS.index("1")))[EOS]


@pytest.mark.parametrize("table", [[[0, -1, 0]], [[0]]])
def test_a_one_state_automaton_is_valid(table):
    a = TokenAutomaton(np.array(table))
    assert a.allowed(a.advance(a.initial(), 0))[0]


def test_an_automaton_starts_at_state_0_and_is_immutable_once_built():
    """``start`` defaults to state 0; the table is a copy (changing the caller's array later
    changes nothing) and every array of the automaton is read-only."""
    table = np.array([[1, -1, 0], [-1, -1, -1], [2, 2, 2]], np.int32)     # no conversion
    a = TokenAutomaton(table)
    assert a.start == 0 and a.initial() == 0
    assert a.allowed(0).tolist() == [True, False, True]
    table[0, 1] = 2
    assert a.allowed(0).tolist() == [True, False, True] and a.next.dtype == np.int32
    for arr in (a.next, a.dead, a.final):
        with pytest.raises(ValueError, match="read-only"):
            arr[0] = 1 if arr.dtype == np.int32 else True
    assert a.dead.tolist() == [False, True, False]


def test_token_set_and_its_errors():
    a = TokenAutomaton.token_set([2, 3], 6, eos=[5])
    assert a.allowed(0).tolist() == [False, False, True, True, False, True]
    assert a.advance(0, 3) == 0 and a.advance(0, 5) == 1 and a.dead.tolist() == [False, True]
    for bad in ([], [6], [True], ["1"]):
        with pytest.raises(ConstraintError):
            TokenAutomaton.token_set(bad, 6)


def _viable(dfa: CharDFA, text: str) -> bool:
    s = 0
    for ch in text:
        s = dfa.step(s, ch)
    return s != CharDFA.DEAD


def test_regex_lifted_to_tokens_allows_exactly_the_viable_sequences():
    """A token sequence walks the automaton iff every prefix's text is a viable prefix of
    the pattern; EOS only where the text so far is a full match."""
    pattern = r"[0-9]+(,[0-9]+)*\]"
    a = TokenAutomaton.from_regex(pattern, ListTokenizer(TEXTS), eos=[EOS])
    dfa = CharDFA(pattern)
    for seq in itertools.product(range(len(TEXTS)), repeat=3):
        s, text, ok = a.initial(), "", True
        for t in seq:
            want = (t == EOS and dfa.matches(text)) if t == EOS or not TEXTS[t] else \
                _viable(dfa, text + TEXTS[t])
            assert bool(a.allowed(s)[t]) == want, (seq, t, text)
            if not want:
                ok = False
                break
            if t == EOS:
                break
            s, text = a.advance(s, t), text + TEXTS[t]
        if ok and EOS not in seq:                     # a dead end only past a full match
            assert not a.dead[s] or dfa.matches(text)


def test_regex_never_allows_empty_or_unknown_tokens():
    a = TokenAutomaton.from_regex(r".*", ListTokenizer(TEXTS[:4]), vocab_size=6)
    assert a.vocab_size == 6 and a.allowed(0).tolist() == [False, True, True, True, False,
                                                            False]


def test_block_states_follow_the_drafts_row_by_row():
    tok = ListTokenizer(TEXTS)
    a = TokenAutomaton.from_regex(r"[0-9]+\]", tok, eos=[EOS])
    cb = ConstraintBatch.build([a, None], len(TEXTS), "cpu")
    draft = torch.tensor([[1, 4, 2], [6, 6, 6]])        # "1", "]", then "1" after the end
    states = block_states(cb.table, cb.state, draft)
    host = [a.initial()]
    for t in (1, 4):
        host.append(a.advance(host[-1], t))
    off = int(cb.state[0]) - a.initial()
    assert states[0, :3].tolist() == [h + off for h in host]
    assert int(states[0, 3]) == -1                       # "1" after "]" is forbidden
    assert states[1].tolist() == [0, 0, 0, 0]            # the free state
    x = cb.mask(torch.zeros(2, 4, len(TEXTS)), draft)
    for j, s in enumerate(host):
        assert torch.isfinite(x[0, j]).tolist() == a.allowed(s).tolist() or a.dead[s]
    assert torch.isfinite(x[0, 2]).tolist() == [False] * EOS + [True]   # only EOS after "]"
    assert torch.isfinite(x[0, 3]).all() and torch.isfinite(x[1]).all()  # past a rejection


def test_commit_matches_the_host_walk():
    a = TokenAutomaton.from_regex(r"[0-9]+(,[0-9]+)*\]", ListTokenizer(TEXTS))
    cb = ConstraintBatch.build([a, a], len(TEXTS), "cpu")
    cb.commit_(torch.tensor([[3, 9, 2, -1], [1, 8, 5, 7]]), torch.tensor([3, 2]))
    tr = ConstraintTracker(a, len(TEXTS))
    assert tr.feed([3, 9, 2]) is None
    assert int(cb.state[0]) - 1 == tr.state               # offset 1: the free state first
    tr2 = ConstraintTracker(a, len(TEXTS))
    tr2.feed([1, 8])
    assert int(cb.state[1]) - 1 == tr2.state


def test_tracker_finds_dead_ends_and_refuses_forbidden_tokens():
    a = TokenAutomaton.from_regex(r"[0-9]+\]", ListTokenizer(TEXTS))
    tr = ConstraintTracker(a, len(TEXTS))
    assert tr.feed([1, 5, 2]) == 2                        # "1", "3]": done, "1" never walked
    with pytest.raises(ConstraintError, match="forbids"):
        ConstraintTracker(a, len(TEXTS)).feed([4])


class BadHook:
    def __init__(self, mask):
        self.mask = mask

    def initial(self):
        return 0

    def allowed(self, state):
        return self.mask

    def advance(self, state, token):
        return state


@pytest.mark.parametrize("mask,match", [
    (np.ones(5, bool), r"shape \(12,\)"), (np.ones(12, np.int64), "dtype int64"),
    (np.zeros(12, bool), "allows no token"), (object(), "bool array")])
def test_generic_hook_masks_are_checked(mask, match):
    with pytest.raises(ConstraintError, match=match):
        ConstraintTracker(BadHook(mask), 12)


def test_params_take_only_hooks_and_automata_must_fit_the_vocabulary():
    with pytest.raises(SamplingParamsError, match="constraint"):
        SamplingParams(constraint="[0-9]+")
    a = TokenAutomaton.token_set([1], 8)
    with pytest.raises(ConstraintError, match="vocab_size=16"):
        Request((1,), SamplingParams(constraint=a)).validate(16)
    Request((1,), SamplingParams(constraint=a)).validate(8)
