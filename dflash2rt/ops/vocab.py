"""A reduced draft vocabulary placed in the target's: draft id ``i`` is target id ``i + d2t[i]``
(the EAGLE-3 / speculators convention; vLLM's ``compute_logits`` builds ``arange + d2t`` the
same way). The draft's logits go to their target ids and every other id gets −inf, so no
stage after the draft (logit processors, top-K, the selector's lattice, verification) needs to
know about the mapping: a token the draft cannot propose is never a finite candidate, and its
proposal probability q is exactly 0."""

from __future__ import annotations

import torch


def target_ids(d2t: torch.Tensor) -> torch.Tensor:
    """d2t [Vd] int64 offsets → [Vd] the target id of each draft id."""
    return torch.arange(d2t.shape[0], device=d2t.device) + d2t


def place_draft_logits(own: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Draft logits [..., Vd] and their target ids [Vd] → logits over the target's vocabulary
    [..., V]: ``own`` at ``ids``, −inf elsewhere (no device→host transfer; graph-safe)."""
    out = own.new_full((*own.shape[:-1], vocab), float("-inf"))
    return out.index_copy_(-1, ids, own)
