"""The step bodies: one decode step, the same bodies whether run eagerly or replayed as graphs.

Speculative: ``draft`` (draft_block → select_block) then ``verify`` (verify_block → accept →
commit KV). Target-only: ``target_only`` (forward → sample → commit KV). A body reads its
inputs (the live rows' device state, plus the draft's outputs for ``verify``) and returns
tensors; the last body of a step returns the ``StepOut`` fields, flags packed (``pack_flags``)
and the new lengths and anchor, which the Runner copies into the batch state in one place.
Rows whose ``live`` input is False (graph padding) commit nothing. An eager body runs with the
batch's own sampling and row extensions (``host``); a captured body reads its graphed
extensions (the watermark) from its inputs. A batch with min-p or an extension graphs do not
take (``BatchState.eager_only``: logit processors, logprobs, constraints) runs eagerly.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from typing import Mapping

import torch

from ..backend import Backend
from ..errors import InvalidInputError, NonFiniteLogitsError
from ..models.kv_cache import KVCache
from ..models.pair import ModelPair
from ..ops.batch import BlockNoise, SamplingBatch
from ..ops.selector import SelectorOut
from . import stages
from .extensions import RowExtension
from .state import BatchState

Tensors = dict[str, torch.Tensor]
# Flag bits of the one per-step host transfer: one byte each of a 32-bit word (``pack_flags``).
BAD_TARGET, BAD_Q, BAD_DRAFT, BAD_LATTICE = (
    1 << 8 * (i if sys.byteorder == "little" else 3 - i) for i in range(4))
NOISE = ("walk", "accept", "residual", "bonus")          # BlockNoise's fields, as body tensors


def pack_flags(target: torch.Tensor, q: torch.Tensor | None = None,
               draft: torch.Tensor | None = None, lattice: torch.Tensor | None = None
               ) -> torch.Tensor:
    """[R] bool conditions → [R] int64 BAD_* bits: the four as the bytes of one 32-bit word
    (two launches: the stack and the widening)."""
    conds = (target, q, draft, lattice)
    if all(c is None for c in conds[1:]):
        flags = target.long()
        return flags if BAD_TARGET == 1 else flags * BAD_TARGET
    none = torch.zeros_like(target, dtype=torch.bool) if any(c is None for c in conds) \
        else None
    word = torch.stack([none if c is None else c.bool() for c in conds], -1)   # [R, 4] bytes
    return word.view(torch.uint8).view(torch.int32).view(-1).long()


def raise_flags(flags: list[int], rows: list[int]) -> None:
    """Raise for the first bad source among the host's copy of the flags (``rows``: each
    row's request index). Nothing of the step was returned; the engine stays usable."""
    for bit, what in ((BAD_TARGET, "target logits"), (BAD_DRAFT, "draft logits"),
                      (BAD_LATTICE, "candidate selector scores")):
        bad = [rows[i] for i, f in enumerate(flags) if f & bit]
        if bad:
            raise NonFiniteLogitsError(
                f"{what} of request(s) {bad} are not a finite law (NaN/+inf, or no finite "
                "entry); check the model weights and dtype (the step was abandoned, no "
                "token returned)")
    bad = [rows[i] for i, f in enumerate(flags) if f & BAD_Q]
    if bad:
        raise InvalidInputError(f"request(s) {bad}: a draft token has q = 0 (or q is not "
                                "finite) under the law it was drawn from (selector bug)")


@dataclass(frozen=True)
class StepOut:
    """What one decode step returns to the engine (device tensors, R live rows)."""

    accept_len: torch.Tensor   # [R] int64 draft tokens accepted (0 for target-only)
    tokens: torch.Tensor       # [R, B] int64; tokens[:, :accept_len + 1] are committed ([R, 1])
    flags: torch.Tensor        # [R] int64 BAD_* bits
    lens: torch.Tensor         # [R] int64 committed lengths after the step
    anchor: torch.Tensor       # [R] int64 the next anchor (the last committed token)
    logprobs: torch.Tensor | None = None   # [R, B·(1+2n)] packed (ops.procs.token_logprobs)

    @staticmethod
    def of(out: Mapping[str, torch.Tensor]) -> "StepOut":
        return StepOut(**{f.name: out[f.name] for f in fields(StepOut) if f.name in out})

    def for_host(self) -> torch.Tensor:
        """[R, 2 + B (+ B·(1+2n))] int64: accept_len, flags, tokens (then the packed
        logprobs): the step's one device→host transfer."""
        parts = [self.accept_len.view(-1, 1), self.flags.view(-1, 1), self.tokens]
        return torch.cat(parts + ([self.logprobs] if self.logprobs is not None else []), 1)


def live_inputs(st: BatchState) -> Tensors:
    """A batch's per-row device state as body inputs; every row live."""
    s = st.sampling
    return {"anchor": st.anchor, "lens": st.lens, "seed": st.seed, "key": st.key,
            "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
            "greedy": s.greedy,
            "live": st.live,
            **{n: t for e in st.extensions for n, t in e.graph_inputs().items()}}  # graphed


class StepBodies:
    """The step bodies of one mode over fixed cache storage (the engine's static caches for
    graphs, the run's caches eagerly). ``sampled``: any row samples (greedy-only batches skip
    the noise); ``ctx_len``: cache rows to read (None: all, as graphs do)."""

    def __init__(self, pair: ModelPair, backend: Backend, target: KVCache,
                 draft: KVCache | None, block: int | None) -> None:
        self.pair, self.backend, self.storage = pair, backend, (target, draft)
        self.block = block                                   # None: target-only decoding

    def _state(self, inp: Mapping[str, torch.Tensor], sampled: bool,
               host: BatchState | None = None,
               graphed: tuple[type[RowExtension], ...] = ()) -> BatchState:
        """The body's batch state from its inputs; ``host`` (every eager run): that batch's
        sampling parameters with their host facts (which rows need top-k / top-p / min-p, so
        the ops skip the work no row needs) and its row extensions. Graph bodies (``host``
        None) know no host fact and do every row's work; their ``graphed`` extensions (the
        watermark's state and key words) come from the inputs (``of_inputs``)."""
        r = inp["anchor"].shape[0]
        sampling = SamplingBatch(inp["temperature"], inp["top_k"], inp["top_p"], inp["greedy"],
                                 any_sampled=sampled) if host is None else host.sampling
        exts = host.extensions if host is not None else \
            tuple(cls.of_inputs(inp) for cls in graphed)
        return BatchState(*self.storage, inp["lens"], inp["anchor"], inp["seed"], inp["key"],
                          sampling, [0] * r, list(range(r)), exts)

    def draft(self, inp: Tensors, sampled: bool, ctx_len: int | None,
              host: BatchState | None = None, graphed: tuple = ()) -> Tensors:
        """draft → select: the block's draft tokens, their laws, the step's noise."""
        st, gamma = self._state(inp, sampled, host, graphed), self.block - 1
        pos = stages.block_positions(st, self.block)                      # [R, B]
        h_e = stages.draft_block(self.pair, st, self.backend, pos, ctx_len)  # [R, γ, H]
        noise = self.backend.noise(st.seed, st.key, st.lens, gamma) if sampled \
            else BlockNoise.unused(st.size, gamma, st.lens.device)
        sel = stages.select_block(self.pair, st, self.backend, h_e, noise)
        return {"draft": sel.draft, "cand": sel.candidates, "q": sel.q,    # [R, γ], [R, γ, K] ×2
                "draft_bad": sel.bad, "lattice_bad": sel.bad_lattice,
                **{n: getattr(noise, n) for n in NOISE},
                "pos": pos, "lens": inp["lens"], "anchor": inp["anchor"]}  # verify's: as read

    def verify(self, inp: Tensors, sampled: bool, ctx_len: int | None,
               host: BatchState | None = None, graphed: tuple = ()) -> Tensors:
        """verify → accept → commit KV of the accepted rows; the StepOut fields."""
        st = self._state(inp, sampled, host, graphed)
        pos = inp["pos"]                                  # [R, B]: the draft's, as it read them
        sel = SelectorOut(inp["draft"], inp["cand"], inp["q"], inp["draft_bad"],
                          inp["lattice_bad"])
        noise = BlockNoise(*(inp[n] for n in NOISE))
        tgt, ver, lp = stages.verify_block(self.pair, st, self.backend, sel, noise, pos, ctx_len)
        acc = ver.accept_len                                             # [R]
        count = torch.where(inp["live"], acc + 1, 0)                     # padded rows: inert
        stages.commit_kv(self.pair, st, tgt, pos, count)                  # inputs stay unmodified
        return {"accept_len": acc, "tokens": ver.tokens,                 # [R], [R, B]
                "flags": pack_flags(ver.bad, ver.bad_q, inp["draft_bad"], inp["lattice_bad"]),
                "lens": st.lens + count, "anchor": ver.tokens.gather(1, acc.view(-1, 1))[:, 0],
                **({} if lp is None else {"logprobs": lp})}

    def target_only(self, inp: Tensors, sampled: bool, ctx_len: int | None,
                    host: BatchState | None = None, graphed: tuple = ()) -> Tensors:
        """One target token per row: forward → sample → commit KV; the StepOut fields."""
        st = self._state(inp, sampled, host, graphed)
        token, bad, out, pos, lp = stages.target_only_forward(self.pair, st, self.backend,
                                                             ctx_len)           # [R], [R]
        count = torch.where(inp["live"], 1, 0)                           # padded rows: inert
        stages.commit_kv(self.pair, st, out, pos, count, defer_draft=True)  # draft: side buffer
        return {"accept_len": torch.zeros_like(token), "tokens": token.view(-1, 1),
                "flags": pack_flags(bad), "lens": st.lens + count, "anchor": token,
                **({} if lp is None else {"logprobs": lp})}
