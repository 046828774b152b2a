"""A request's candidate count: how many candidates per draft slot the selector offers it.

``SamplingParams.num_candidates`` sets it per request; None (the default) is the draft's
trained ``selector_top_k``, the count its selector learnt its law over. What the runtime
chooses follows the measured curve (docs/benchmarks/k-curve.md): on the bundled pair more
candidates raise the target's mass on them but not the acceptance, which the draft's law over
them limits, while the selector's work grows with K², so the trained count stays the default at
every temperature. Any count is lossless: it only shapes the proposal, and q is the law each
draft was drawn from.

A batch selects at one width W, the largest count among its rows. A row whose count K_r is
below W has every draft logit outside its own top K_r at −inf before the selector takes the
top W. Its top K_r are the first K_r of the top W (descending logit, lowest id on ties:
``ops.selector.topk_lowest_index``), so the rest of its W candidates are −inf: they take no mass
in the walk, whose law is then the row's K_r-candidate law, and the row's drafts are those it
would draw alone at width K_r. A row holding NaN or +inf is left as it is, so the selector still
flags it. A batch carries its rows' counts as a row extension (``extensions.Candidates``) only
where some request sets one; such a batch runs eagerly on graph backends, reported
(``EAGER_PROCS``).
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import torch

from ..errors import InvalidInputError
from ..ops.sampling import bad_rows
from ..ops.selector import topk_lowest_index


def count_of(requested: int | None, trained: int) -> int:
    """A row's candidate count: its request's, else the draft's trained one."""
    return trained if requested is None else requested


def counts(requests: Sequence, trained: int) -> dict[int, int]:
    """How many of ``requests`` (engine Requests) select at each candidate count."""
    return dict(sorted(Counter(count_of(q.params.num_candidates, trained)
                               for q in requests).items()))


def check_no_counts(requests: Sequence) -> None:
    """Target-only decoding draws no drafts: a request that sets a candidate count is refused
    (it would have no effect) with what to change."""
    asked = sorted({q.params.num_candidates for q in requests} - {None})
    if asked:
        raise InvalidInputError(f"num_candidates={asked[0]} shapes speculative drafts, and this "
                                f"run decodes target-only: leave it None, or speculate")


def width(requested: Sequence[int | None], trained: int) -> int:
    """A batch's select width: its rows' largest count."""
    return max(count_of(k, trained) for k in requested)


def limit(logits: torch.Tensor, requested: Sequence[int | None], per_row: torch.Tensor,
          trained: int) -> tuple[int, torch.Tensor]:
    """Draft logits [R, γ, V] of rows with these requested counts (``per_row``: the same on
    the device, 0 for None) → (the select width W, the logits with every entry outside each
    row's own top K_r at −inf; the same tensor when every row takes W)."""
    w = width(requested, trained)
    if all(count_of(k, trained) == w for k in requested):
        return w, logits
    k_r = torch.where(per_row == 0, trained, per_row)                          # [R]
    vals, ids = topk_lowest_index(logits, w)                                   # [R, γ, W]
    drop = torch.arange(w, device=logits.device) >= k_r.view(-1, 1, 1)
    kept = torch.full_like(logits, float("-inf")).scatter_(
        -1, ids, vals.masked_fill(drop, float("-inf")))                        # its top K_r only
    return w, torch.where(bad_rows(logits).unsqueeze(-1), logits, kept)       # flagged as is
