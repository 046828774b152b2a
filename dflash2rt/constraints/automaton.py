"""The constraint hook's contract and its built-in implementation, a token automaton.

A constraint (``SamplingParams.constraint``, as vLLM's ``structured_outputs`` / SGLang's
``regex`` are request sampling parameters) is any object with the shape grammar engines such
as xgrammar and outlines expose:

- ``initial() -> state``: the state before the first generated token;
- ``allowed(state) -> bool[V]``: the tokens that may come next (V: the target's vocabulary);
- ``advance(state, token) -> state``: the state after one more token.

A state with no allowed token is a dead end: the request finishes there (the token that reached
it is the last one returned) with finish_reason "constraint" when the hook says the output is
complete there (optional ``accepting(state) -> bool``), else "constraint_unsatisfiable": the
output does not match, and no token could have continued it. A ``TokenAutomaton`` built from a
regex prunes every state from which no complete match can be reached, so it never gets stuck.

``TokenAutomaton`` is that contract held as a table: ``next`` int32 [S, V], -1 where a token is
forbidden, so ``allowed(s) = next[s] >= 0`` and ``advance(s, t) = next[s, t]``. Its tables go to
the device, where verify row j's state is gathered along the drafts with no host round trip
(``constraints.device``). A generic hook (any other object) has its masks built on the host:
each step's next-token mask, and in a speculative step every verify row's mask from the
step's drafts, copied to the host for it (one more round trip per step, counted).
Build one from a regex (``from_regex``: the pattern's automaton over UTF-8 bytes lifted to tokens
by walking each token's bytes from every state; special tokens are never text) or from a token
set (``token_set``).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import ConstraintError
from .regex import CharDFA
from .utf8 import ByteDFA
from .vocab import vocab_bytes


@runtime_checkable
class Constraint(Protocol):
    """The per-request constraint hook (see the module docstring)."""

    def initial(self) -> Any: ...

    def allowed(self, state: Any) -> Any: ...

    def advance(self, state: Any, token: int) -> Any: ...


class TokenAutomaton:
    """A token-level DFA: ``next`` int32 [S, V] (-1: forbidden), start state ``start``.
    Immutable once built (the table is copied and made read-only)."""

    def __init__(self, next_table: np.ndarray, start: int = 0,
                 accepting: np.ndarray | None = None) -> None:
        t = np.asarray(next_table)
        if t.ndim != 2 or t.shape[0] < 1 or t.shape[1] < 1:
            raise ConstraintError(f"a token automaton's table must be [states, vocab], got "
                                  f"shape {t.shape}")
        if not np.issubdtype(t.dtype, np.integer):
            raise ConstraintError(f"a token automaton's table must hold integers, got {t.dtype}")
        s = t.shape[0]
        if t.size and (t.min() < -1 or t.max() >= s):
            raise ConstraintError(f"a token automaton's next states must be in [-1, {s}) "
                                  f"(-1: forbidden), got [{t.min()}, {t.max()}]")
        if not isinstance(start, numbers.Integral) or not 0 <= start < s:
            raise ConstraintError(f"start state must be an integer in [0, {s}), got {start!r}")
        self.next = t.astype(np.int32, copy=True)
        self.next.flags.writeable = False
        self.start = int(start)
        self.dead = ~(self.next >= 0).any(axis=1)                  # [S] no allowed token
        self.dead.flags.writeable = False
        acc = np.ones(s, bool) if accepting is None else np.asarray(accepting, bool)
        if acc.shape != (s,):
            raise ConstraintError(f"accepting must be bool [{s}] (one per state), got shape "
                                  f"{acc.shape}")
        self.final = acc.copy()                                   # [S] a complete output
        self.final.flags.writeable = False
        if self.dead[self.start]:
            raise ConstraintError("the start state allows no token: the constraint could never "
                                  "produce any output")

    @property
    def num_states(self) -> int:
        return self.next.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.next.shape[1]

    def initial(self) -> int:
        return self.start

    def allowed(self, state: int) -> np.ndarray:
        return self.next[state] >= 0

    def advance(self, state: int, token: int) -> int:
        return int(self.next[state, token])

    def accepting(self, state: int) -> bool:
        """Whether the output so far is complete (a match) at ``state``."""
        return bool(self.final[state])

    def __repr__(self) -> str:
        return f"TokenAutomaton(states={self.num_states}, vocab={self.vocab_size})"

    @staticmethod
    def token_set(ids: Sequence[int], vocab_size: int, eos: Sequence[int] = ()
                  ) -> "TokenAutomaton":
        """Any sequence of tokens from ``ids``; with ``eos``, those ids too, which end it
        (state 1: a dead end, so a request that ignores EOS finishes there)."""
        ids, eos = _token_ids(ids, vocab_size, "ids"), _token_ids(eos, vocab_size, "eos")
        if not ids:
            raise ConstraintError("token_set needs at least one allowed token id")
        t = np.full((2, vocab_size), -1, dtype=np.int32)
        t[0, ids] = 0
        t[0, eos] = 1
        return TokenAutomaton(t, 0)

    @staticmethod
    def from_regex(pattern: str, tokenizer, vocab_size: int | None = None,
                   eos: Sequence[int] = (), allow_special: Sequence[int] = ()
                   ) -> "TokenAutomaton":
        """The tokens whose output bytes (``vocab.vocab_bytes``) spell, as UTF-8 text, a full
        match of ``pattern`` (``regex.CharDFA``; ``utf8.ByteDFA``), with the ``eos`` ids
        allowed exactly at complete matches (leading to a dead end). Special tokens (the
        tokenizer's, and EOS) are never matched as text; ``allow_special``: special token ids
        allowed in every state, leaving it unchanged. States from which no complete match can
        be reached are pruned, so every allowed token keeps a match possible; a vocabulary
        that cannot spell any match is a ConstraintError. Tokens with no bytes, and ids past
        the tokenizer's vocabulary, are never allowed."""
        vocab = tokenizer.vocab_size if vocab_size is None else vocab_size
        if not isinstance(vocab, numbers.Integral) or vocab < 1:
            raise ConstraintError(f"vocab_size must be a positive integer, got {vocab!r}")
        eos = _token_ids(eos, vocab, "eos")
        special = _token_ids(allow_special, vocab, "allow_special")
        dfa = ByteDFA(CharDFA(pattern))
        spelled = vocab_bytes(tokenizer, vocab, special=list(eos) + list(special))
        trie = _Trie([(i, b) for i, b in enumerate(spelled) if b])
        index, order, rows = {0: 0}, [0], []
        while len(rows) < len(order):                          # breadth-first over states
            s = order[len(rows)]
            row = np.full(vocab, -1, dtype=np.int64)
            for tok, end in trie.walk(dfa, s):
                if end not in index:
                    index[end] = len(order)
                    order.append(end)
                row[tok] = index[end]
            rows.append(row)
        table, final = _prune(np.stack(rows), np.array([dfa.accepting(s) for s in order]),
                              pattern)
        n = table.shape[0]
        if eos:                                               # EOS at complete matches only
            table = np.concatenate([table, np.full((1, vocab), -1, dtype=np.int64)])
            table[np.flatnonzero(final)[:, None], eos] = n
            final = np.append(final, True)
        if special:
            live = np.flatnonzero((table >= 0).any(axis=1))
            table[live[:, None], special] = live[:, None]
        return TokenAutomaton(table, 0, final)


def _prune(table: np.ndarray, final: np.ndarray, pattern: str) -> tuple[np.ndarray, np.ndarray]:
    """Keep the states from which a complete match (``final``) is reachable, renumbered in
    order; a transition into any other state becomes -1."""
    live = final.copy()
    while True:
        step = ((table >= 0) & live[np.maximum(table, 0)]).any(axis=1)
        grown = live | step
        if (grown == live).all():
            break
        live = grown
    if not live[0]:
        raise ConstraintError(f"regex {pattern!r}: no text the vocabulary can spell matches it "
                              "(every path dies before a complete match)")
    keep = np.flatnonzero(live)
    new = np.full(len(live), -1, dtype=np.int64)
    new[keep] = np.arange(len(keep))
    t = table[keep]
    t = np.where(t >= 0, new[np.maximum(t, 0)], -1)
    return t, final[keep]


class _Trie:
    """Token byte strings in a trie, so a walk from a state prunes every token that shares a
    dead prefix at once. The byte strings are non-empty (a token with no bytes is never
    allowed: the caller leaves it out)."""

    def __init__(self, texts: Sequence[tuple[int, bytes]]) -> None:
        self.root: dict = {}
        for tok, text in texts:
            node = self.root
            for ch in text:
                node = node.setdefault(ch, {})
            node.setdefault(None, []).append(tok)

    def walk(self, dfa: ByteDFA, state: int):
        """(token, end state) for every token whose whole byte string stays alive from
        ``state``."""
        stack = [(self.root, state)]
        while stack:
            node, s = stack.pop()
            for key, child in node.items():
                if key is None:                            # tokens whose text ends here
                    yield from ((tok, s) for tok in child)
                    continue
                nxt = dfa.step(s, key)
                if nxt != ByteDFA.DEAD:
                    stack.append((child, nxt))


def _token_ids(ids: Sequence[int], vocab: int, what: str) -> list[int]:
    try:
        out = [int(t) for t in ids if isinstance(t, numbers.Integral) and not isinstance(t, bool)]
    except TypeError as exc:
        raise ConstraintError(f"{what} must be a sequence of token ids, got {ids!r}") from exc
    if len(out) != len(list(ids)) or any(not 0 <= t < vocab for t in out):
        raise ConstraintError(f"{what} must be token ids in [0, {vocab}), got {list(ids)[:8]!r}")
    return out
