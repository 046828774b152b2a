"""A batch's constraints on the device: every request's token automaton in one table, each
request's state, and the masking of target rows (verify row j with the state after d_1..d_j).

The batch table stacks the automata of the batch's requests (state 0 is the free state: every
token leads back to it, so unconstrained rows of a mixed batch are left unchanged); ``allow``
[S, V] bool is ``next >= 0``, and every token at the free state and at dead ends. A dead-end
row is left unmasked on purpose: the host finishes the request at the token that reached it
(finish_reason "constraint"), so what such a row emits is never returned, and verification
never sees a row with no finite logit. A draft token that the mask forbids has p = 0 and is
rejected; its row and the rows after it get state -1 (read as the free state): what they emit
lies past the rejection.

The draft side follows the constraint too (``draft_logits``, ``walk``), so that its proposals
are ones the mask allows: slot 0's draft logits are masked with the committed state (and a
generic hook's next-token mask), later slots' with ``ever`` (the tokens the request's automaton
allows at some state), which only shapes the candidate sets; the selector's walk then masks the
lattice row it reads with the state after the path so far (``ops.selector.WalkMask``) and draws
from that masked law, which is the q verification uses: lossless whatever the mask.

Generic (host) hooks: ``host_mask`` [R, V] holds each row's mask for the next token, written
by the engine from the host after each step; a speculative step's verify rows take
``host_block`` [R, γ+1, V] instead, built on the host from the step's drafts (one more
device→host round trip per step, counted: ``RunStats.constraint_host_masks`` and ``syncs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import torch

from .automaton import TokenAutomaton


def step_states(table: torch.Tensor, state: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """One token per row: state [R] int64, token [R] → next state [R] (-1 when the state is
    -1, the token is -1 or forbidden)."""
    v = table.shape[1]
    nxt = table.view(-1)[state.clamp(min=0) * v + token.clamp(min=0)].long()
    return torch.where((state >= 0) & (token >= 0), nxt, -1)


def block_states(table: torch.Tensor, state: torch.Tensor, draft: torch.Tensor | None
                 ) -> torch.Tensor:
    """The state of each verify row: [R] committed states and drafts [R, γ] → [R, γ+1], row j
    the state after d_1..d_j (row 0: the committed state); ``draft`` None: [R, 1]."""
    cols = [state]
    for j in range(0 if draft is None else draft.shape[1]):
        cols.append(step_states(table, cols[-1], draft[:, j]))
    return torch.stack(cols, 1)


def mask_rows(logits: torch.Tensor, allow: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """Logits [R, T, V] with the tokens row (r, j)'s state forbids at −inf (state −1: none)."""
    ok = allow[states.clamp(min=0)]                                       # [R, T, V] bool
    return logits.masked_fill(~ok, -torch.inf)


@dataclass(frozen=True)
class ConstraintBatch:
    """R requests' constraint state: ``table`` int32 [S, V] and ``allow`` bool [S, V] (module
    docstring), ``state`` int64 [R] after the committed tokens (``commit_`` advances it on the
    device), ``host_mask`` bool [R, V] for generic hooks (None when there is none), and on
    the host ``generic``: which rows' hooks are host hooks."""

    table: torch.Tensor
    allow: torch.Tensor
    state: torch.Tensor
    host_mask: torch.Tensor | None
    generic: tuple[bool, ...]
    host_block: dict = field(default_factory=dict)   # "rows": the verify rows' host masks
    ever: torch.Tensor | None = None   # bool [R, V]: allowed at some live state of the row's
    #                                    automaton (all True: free or generic rows)

    @staticmethod
    def build(constraints: Sequence, vocab: int, device: torch.device | str
              ) -> "ConstraintBatch | None":
        """From requests' ``SamplingParams.constraint`` (None: unconstrained); None when no
        request has one. Token automata must have ``vocab`` columns (checked before)."""
        if all(c is None for c in constraints):
            return None
        tables = [np.zeros((1, vocab), np.int64)]                        # the free state
        dead = [np.zeros(1, bool)]
        offset: dict[int, int] = {}
        start = []
        for c in constraints:
            if isinstance(c, TokenAutomaton):
                if id(c) not in offset:
                    offset[id(c)] = sum(len(t) for t in tables)
                    tables.append(np.where(c.next >= 0, c.next + offset[id(c)], -1))
                    dead.append(c.dead)
                start.append(offset[id(c)] + c.start)
            else:
                start.append(0)
        table = np.concatenate(tables).astype(np.int32)
        allow = (table >= 0) | np.concatenate(dead)[:, None]
        generic = tuple(c is not None and not isinstance(c, TokenAutomaton) for c in constraints)
        ever = np.ones((len(constraints), vocab), bool)
        for i, c in enumerate(constraints):
            if isinstance(c, TokenAutomaton) and (c.next >= 0).any():
                ever[i] = (c.next >= 0).any(0)
        return ConstraintBatch(
            torch.from_numpy(table).to(device), torch.from_numpy(allow).to(device),
            torch.tensor(start, dtype=torch.int64, device=device),
            torch.ones(len(constraints), vocab, dtype=torch.bool, device=device)
            if any(generic) else None, generic, ever=torch.from_numpy(ever).to(device))

    def take(self, idx: Sequence[int]) -> "ConstraintBatch":
        """Rows ``idx`` (host-known)."""
        t = torch.tensor(list(idx), dtype=torch.int64, device=self.state.device)
        return replace(self, state=self.state[t],
                       host_mask=None if self.host_mask is None else self.host_mask[t],
                       generic=tuple(self.generic[i] for i in idx), host_block={},
                       ever=None if self.ever is None else self.ever[t])

    def mask(self, logits: torch.Tensor, draft: torch.Tensor | None = None) -> torch.Tensor:
        """Target logits [R, T, V] (T = γ+1 verify rows over [anchor, d_1..d_γ], or 1) with
        row j masked by the state after d_1..d_j (``block_states``)."""
        x = mask_rows(logits, self.allow, block_states(self.table, self.state, draft))
        if self.host_mask is not None:
            if x.shape[1] == 1:
                return x.masked_fill(~self.host_mask.unsqueeze(1), -torch.inf)
            rows = self.host_block.pop("rows", None)       # this step's, used once
            if rows is None or tuple(rows.shape) != tuple(x.shape):
                raise AssertionError("verify rows of generic constraint hooks need their host "
                                     "masks (set_host_block_) before the verify (engine bug)")
            x = x.masked_fill(~rows, -torch.inf)
        return x

    def draft_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [R, γ, V] → the candidate sets' logits: slot 0 masked with the
        committed state (and generic hooks' next-token masks), slots ≥ 1 with ``ever``
        (module docstring). A row left with no allowed token stays unmasked."""
        first = self.allow[self.state.clamp(min=0)]                          # [R, V]
        if self.host_mask is not None:
            first = first & self.host_mask
        ok = torch.cat([first.unsqueeze(1),
                        self.ever.unsqueeze(1).expand(-1, logits.shape[1] - 1, -1)], 1)
        ok = ok | ~ok.any(-1, keepdim=True)
        return logits.masked_fill(~ok, -torch.inf)

    def walk(self) -> "DraftWalk":
        """The selector walk's mask (``ops.selector.WalkMask``), from the committed states."""
        return DraftWalk(self.table, self.allow, self.state.clone())

    def set_host_block_(self, masks: np.ndarray) -> None:
        """The verify rows' masks of a speculative step, bool [R, γ+1, V] (all True for table
        rows: the device tables mask those), used by the next ``mask`` of that shape."""
        self.host_block["rows"] = torch.from_numpy(np.ascontiguousarray(masks)).to(
            self.state.device)

    def commit_(self, tokens: torch.Tensor, n: torch.Tensor) -> None:
        """Advance each row's state by its first ``n[r]`` tokens of tokens [R, T] (in place)."""
        s = self.state
        for j in range(tokens.shape[1]):
            s = torch.where(j < n, step_states(self.table, s, tokens[:, j]), s)
        self.state.copy_(s)

    def set_host_masks_(self, masks: Sequence[np.ndarray | None]) -> None:
        """Generic hooks' masks for the next token, one per row (None: a table row)."""
        host = torch.ones(tuple(self.host_mask.shape), dtype=torch.bool)
        for i, m in enumerate(masks):
            if m is not None:
                host[i] = torch.from_numpy(m)
        self.host_mask.copy_(host)


class DraftWalk:
    """``ops.selector.WalkMask`` over the batch's automata: each row's state along the walk's
    path (−1 after a forbidden token: read as the free state, nothing is masked)."""

    def __init__(self, table: torch.Tensor, allow: torch.Tensor, state: torch.Tensor) -> None:
        self.table, self.allow, self.state = table, allow, state

    def allowed(self, slot: int, cand: torch.Tensor) -> torch.Tensor:
        v = self.allow.shape[1]
        return self.allow.view(-1)[self.state.clamp(min=0).view(-1, 1) * v + cand]

    def advance(self, token: torch.Tensor) -> None:
        self.state = step_states(self.table, self.state, token)
