"""Watermarked generation: a batch's watermark state on the device, and the keyed draws the decode
ops take as their draw source (``KeyedDraws``, an ``ops.draws.DrawSource``: its
``ops.draws.WalkDraw`` and ``EmitDraw``).

The token at a position with context c (the hash of the ``width`` tokens before it, prompt
included) is drawn from its law p by Gumbel-max over keyed values (``sampler``):

* the draft walk's candidate at slot j: ``draw_sparse`` under subkey A, c = committed tokens +
  d_1..d_{j-1} (the walk's q stays the law the draw is from: Gumbel-max over q has law q);
* the acceptance coin of slot j: ``coin`` under subkey C (in place of the accept uniform);
* the residual and bonus draws, target-only steps and the first token after prefill:
  ``draw_dense`` under subkey B.

Over keys every value is a fresh uniform independent of everything drawn before, so each step
is a chain speculative sampling step with independent noise: the output law is the target's
(distortion-free). That holds only while a context's values are not reused: a position whose
context was already used by this request (a committed position, or an earlier slot of the same
block, which a later slot is only reached after accepting) draws with the ordinary uniforms of
``ops.batch.BlockNoise`` instead (the literature's deduplication; the detector skips repeats).
The record of used contexts lives on the device (``record`` / ``used``): no host sync. Greedy
rows never read a draw: greedy output is unchanged and unmarked.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import torch

from ..ops.batch import BlockNoise
from ..ops.draws import DrawSource
from .keys import KeyWords, WatermarkKey, words_of
from .sampler import coin, draw_dense, draw_sparse, require_fp64
from .values import context_hash


@dataclass(frozen=True)
class Marks:
    """The keyed draws of one step's positions: ``ctx`` [R, S] context hashes, ``fresh`` [R, S]
    (context not used before: the keyed values apply). Slot s decides the step's s-th token."""

    key: WatermarkKey
    ctx: torch.Tensor
    fresh: torch.Tensor
    has_fp64: bool | None = None           # the device's (None: ``exact32.fp64_enabled()``)

    def emit(self, law: torch.Tensor, slot: torch.Tensor, plain: torch.Tensor) -> torch.Tensor:
        """``ops.draws.EmitDraw``: Gumbel-max under subkey B at the emitting slot's context
        where it is fresh, else ``plain`` (the ordinary uniform's draw)."""
        s = slot.view(-1, 1)
        drawn = draw_dense(self.key.target, self.ctx.gather(1, s)[:, 0], law, self.has_fp64)
        return torch.where(self.fresh.gather(1, s)[:, 0], drawn, plain)

    def noise(self, noise: BlockNoise) -> BlockNoise:
        """The block's noise with the acceptance coins of fresh slots keyed (subkey C)."""
        g = noise.accept.shape[1]
        keyed = coin(self.key.coin, self.ctx[:, :g])
        return replace(noise, accept=torch.where(self.fresh[:, :g], keyed, noise.accept))


class Walk:
    """``ops.draws.WalkDraw`` for one block: the walk's contexts follow the path it takes."""

    def __init__(self, wm: "WatermarkBatch", has_fp64: bool | None = None) -> None:
        self.wm, self.window, self.ctxs, self.has_fp64 = wm, wm.window, [], has_fp64

    def pick(self, slot: int, law: torch.Tensor, cand: torch.Tensor, plain: torch.Tensor,
             greedy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx = context_hash(self.window)                                   # [R]
        fresh = ~self.wm.in_record(ctx.view(-1, 1))[:, 0]
        for earlier in self.ctxs:
            fresh = fresh & (ctx != earlier)
        self.ctxs.append(ctx)
        drawn = draw_sparse(self.wm.key.draft, ctx, cand, law, self.has_fp64)  # -1: no law
        use = fresh & ~greedy
        pos = torch.where(use, drawn.clamp(min=0), plain)
        token = cand.gather(1, pos.view(-1, 1))
        self.window = torch.cat([self.window[:, 1:], token], 1)
        return pos, use & (drawn < 0)


CAPACITY_STEP = 256     # record capacities round up to this: later calls fit the same graphs
INPUTS = ("wm_words", "wm_window", "wm_record", "wm_used")   # a step body's watermark inputs
PADS = {"wm_words": 0, "wm_window": -1, "wm_record": 0, "wm_used": 0}   # inert padded rows


def capacity_for(positions: int) -> int:
    """The record capacity for ``positions`` committed positions, rounded up to the step."""
    return -(-max(positions, 1) // CAPACITY_STEP) * CAPACITY_STEP


@dataclass
class WatermarkBatch:
    """One batch's watermark state (device): ``window`` [R, h] the last h committed tokens (-1
    before the start), ``record`` [R, M] the contexts of the committed generated positions in
    order, ``used`` [R] how many of them there are, ``words`` [R, 9] the key's subkey words
    (``keys.words_of``; every row the same: the graph input the key is read from). The key is
    never printed (its repr is a fingerprint, or no bits at all) and is not part of any stats.
    ``key``: the ``WatermarkKey``, or in a captured step the ``KeyWords`` of ``words``."""

    key: "WatermarkKey | KeyWords"
    width: int
    window: torch.Tensor
    record: torch.Tensor
    used: torch.Tensor
    # the subkey words: key material, so out of the repr (None: made from the key)
    words: torch.Tensor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.words is None:
            r = self.used.shape[0]
            self.words = words_of(self.key, self.used.device).expand(r, 9).contiguous()

    @staticmethod
    def build(key: WatermarkKey, prompts: Sequence[Sequence[int]], capacity: int,
              width: int, device: torch.device | str) -> "WatermarkBatch":
        """``capacity``: positions a request may commit (max_new_tokens + one block + 1)."""
        win = torch.full((len(prompts), width), -1, dtype=torch.int64)
        for i, p in enumerate(prompts):
            tail = list(p)[-width:]
            if tail:
                win[i, width - len(tail):] = torch.tensor(tail, dtype=torch.int64)
        r = len(prompts)
        return WatermarkBatch(key, width, win.to(device),
                              torch.zeros(r, capacity, dtype=torch.int64, device=device),
                              torch.zeros(r, dtype=torch.int64, device=device))

    def take(self, idx: Sequence[int]) -> "WatermarkBatch":
        t = torch.tensor(list(idx), dtype=torch.int64, device=self.used.device)
        return WatermarkBatch(self.key, self.width, self.window[t], self.record[t], self.used[t],
                              self.words[t])

    @property
    def shape(self) -> tuple[int, int]:
        """(window width, record capacity): what a captured step's static inputs are sized by."""
        return self.width, self.record.shape[1]

    def inputs(self) -> dict[str, torch.Tensor]:
        """The state as a step body's inputs (``INPUTS``), per row."""
        return dict(zip(INPUTS, (self.words, self.window, self.record, self.used)))

    @staticmethod
    def of_inputs(inp: dict[str, torch.Tensor]) -> "WatermarkBatch":
        """The batch a step body reads from its inputs: the key from row 0's words (every live
        row holds the batch's key, and row 0 is always live), nothing from the host."""
        words, window = inp["wm_words"], inp["wm_window"]
        return WatermarkBatch(KeyWords(words[0]), window.shape[1], window, inp["wm_record"],
                              inp["wm_used"], words)

    def contexts(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [R, T] following the window → [R, T + 1]: column s is the context of the
        position after the window and tokens[:, :s]."""
        ext = torch.cat([self.window, tokens.to(torch.int64)], 1)          # [R, h + T]
        return context_hash(ext.unfold(1, self.width, 1))

    def in_record(self, ctx: torch.Tensor) -> torch.Tensor:
        """ctx [R, S] → bool [R, S]: the context is one of the request's committed positions'."""
        m = self.record.shape[1]
        valid = torch.arange(m, device=ctx.device).view(1, 1, m) < self.used.view(-1, 1, 1)
        return ((ctx.unsqueeze(-1) == self.record.unsqueeze(1)) & valid).any(-1)

    def marks(self, tokens: torch.Tensor, has_fp64: bool | None = None) -> Marks:
        """Marks of the positions after the window and each prefix of tokens [R, T] (a block's
        drafts: slots 0..γ; T = 0: the next token). A slot is fresh when its context is neither
        recorded nor an earlier slot's. ``has_fp64``: the device's, for the keyed draws."""
        ctx = self.contexts(tokens)                                        # [R, S]
        s = ctx.shape[1]
        earlier = torch.ones(s, s, dtype=torch.bool, device=ctx.device).tril(-1)  # [j, i]: i < j
        repeat = ((ctx.unsqueeze(-1) == ctx.unsqueeze(1)) & earlier).any(-1)
        return Marks(self.key, ctx, ~(self.in_record(ctx) | repeat), has_fp64)

    def walk(self, has_fp64: bool | None = None) -> Walk:
        return Walk(self, has_fp64)

    def commit_(self, tokens: torch.Tensor, count: torch.Tensor) -> None:
        """Record the contexts of the first ``count`` [R] of tokens [R, T] (committed in order
        after the window) and advance the window over them. Entries past ``count`` are left as
        they are. A block that runs past the record's end writes its tail onto the last entry:
        every write to an index carries the value that index ends up with (the committed
        token's context there, else the entry as it was), so their order does not matter."""
        t = tokens.shape[1]
        ctx = self.contexts(tokens)[:, :t]                                 # [R, T]
        m = self.record.shape[1]
        used = self.used.view(-1, 1)
        idx = (used + torch.arange(t, device=ctx.device)).clamp(max=m - 1)
        src = (idx - used).clamp(min=0, max=t - 1)            # the token whose context lands there
        kept = src < count.view(-1, 1)
        value = torch.where(kept, ctx.gather(1, src), self.record.gather(1, idx))
        self.record.scatter_(1, idx, value)
        ext = torch.cat([self.window, tokens.to(torch.int64)], 1)
        shift = count.view(-1, 1) + torch.arange(self.width, device=ctx.device)
        self.window = ext.gather(1, shift)
        self.used = self.used + count


@dataclass(frozen=True)
class KeyedDraws(DrawSource):
    """The watermark as a draw source (``ops.draws``) for one block: ``select`` walks with the
    keyed walk (``Walk``, subkey A), ``verify`` decides with the keyed coins (subkey C) and
    draws the residual / bonus keyed by B at the block's contexts; ``noise`` (the block's
    ordinary uniforms) wherever a context was used before, and for greedy rows' unread draws.
    Without float64 both raise ``WatermarkUnsupportedError`` before any float64 tensor exists."""

    wm: WatermarkBatch
    noise: BlockNoise

    def walker(self, has_fp64: bool | None = None) -> Walk:
        require_fp64(has_fp64)
        return self.wm.walk(has_fp64)

    def verify_draws(self, draft: torch.Tensor, has_fp64: bool | None = None
                     ) -> tuple[BlockNoise, Marks]:
        require_fp64(has_fp64)
        marks = self.wm.marks(draft, has_fp64)
        return marks.noise(self.noise), marks
