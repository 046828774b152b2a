"""The stages of the decode algorithm as plain functions, in the order of docs/design.md §1.

prefill, then per step draft_block → select_block → verify_block → commit_kv (bodies.py puts
them into step bodies). Nothing here reads a device value on the host: the Runner does exactly
one device→host transfer per step. ``ctx_len``: cache rows attention reads (None: all).

Optional features are the batch's row extensions (``st.extensions``, ``extensions.py``), whose
hooks each stage calls in list order (none: plain decoding): ``processed`` gives every target row
their processing the same way in each mode (prefill's first token and a target-only step with the
committed state, verify row j with the state after d_1..d_j: logit bias and penalties, then
constraint masks), before the backend's verify (so a kernel backend verifies processed logits
too); ``draft_logits`` shapes the proposals; a walk mask sends the selector's walk through the
torch ops; a draw source (the watermark's keyed draws, ``watermark.generate.KeyedDraws``) replaces
the block's noise in the backend's select / verify, and a next-token draw replaces the uniform of
``sample_next`` (target-only and first tokens, torch); rows that ask for block verification
(``verify_rows``) send verify through the torch ops (``ops.verify`` with ``block``); every
extension advances by the committed
tokens (``commit``). With logprobs requested, each step also returns the emitted tokens'
log-probabilities under the final law (``ops.procs.token_logprobs``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..backend import Backend
from ..models.pair import ModelPair
from ..models.target import TargetOutput
from ..ops.batch import BlockNoise
from ..ops.procs import token_logprobs
from ..ops import selector as ops_selector
from ..ops import verify as ops_verify
from ..ops.selector import SelectorOut, SelectorParams
from ..ops.staging import to_device
from ..ops.verify import VerifyOut, sample_next
from .state import BatchState


@dataclass(frozen=True)
class Prefilled:
    token: torch.Tensor   # [R] first generated token (the first anchor)
    bad: torch.Tensor     # [R] bool
    logprobs: torch.Tensor | None = None   # [R, 1 + 2n] packed (token_logprobs), if asked


def processed(st: BatchState, logits: torch.Tensor, draft: torch.Tensor | None = None
              ) -> torch.Tensor:
    """Target logits [R, T, V] through every extension's ``process`` in order: the logit
    processors, then the constraint masks (row j with the state after d_1..d_j; unchanged
    without any)."""
    for ext in st.extensions:
        logits = ext.process(logits, draft)
    return logits


def commit(st: BatchState, tokens: torch.Tensor, count: torch.Tensor) -> None:
    """Every extension's state advanced by the first ``count`` [R] of tokens [R, T]."""
    for ext in st.extensions:
        ext.commit_(tokens, count)


def _only(hooks, what: str):
    """The one extension's result of a hook at most one extension answers (None: none)."""
    got = [h for h in hooks if h is not None]
    assert len(got) <= 1, f"two row extensions give the {what}"
    return got[0] if got else None


def logprobs_of(st: BatchState, logits: torch.Tensor, tokens: torch.Tensor,
                raw: torch.Tensor) -> torch.Tensor | None:
    """Packed log-probabilities of tokens [R, T] under processed logits [R, T, V] (or, for the
    rows whose ``logprobs_mode`` is "raw", the model's ``raw`` logits), or None when no request
    of the batch asked for logprobs."""
    if st.procs is None or st.procs.logprobs is None:
        return None
    return token_logprobs(logits, st.sampling, tokens, st.procs.logprobs,
                          raw if st.procs.any_raw else None, st.procs.raw)


def prefill(pair: ModelPair, st: BatchState, backend: Backend, prompts: list[tuple[int, ...]]
            ) -> Prefilled:
    """Run the prompts through the target (it writes their K/V), commit the draft context,
    sample token 1."""
    dev = st.lens.device
    r, t = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros(r, t, dtype=torch.int64)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = torch.tensor(p)
    ids, n = to_device(dev, ids, torch.tensor([len(p) for p in prompts]))  # [R, T] padded, [R]
    pos = torch.arange(t, device=dev).expand(r, t)                       # [R, T]
    out = pair.target(ids, pos, st.target_cache, st.lens, ctx_len=0, logits_at=n - 1,
                      attn=backend.attention)                           # writes the target K/V
    if st.draft_cache is not None:       # every row, as the target's: padding lies past n
        pair.draft.write_context_kv(pair.draft.context_hidden(out.taps), pos, st.draft_cache)
    last = processed(st, out.logits[:, :1])                               # row n - 1 only
    u = backend.token_uniforms(st.seed, st.key, n) if st.sampling.any_sampled else None
    token, bad = sample_next(last[:, 0], st.sampling, u, marks=_next_draw(st))  # position n
    st.lens.copy_(n)
    st.anchor.copy_(token)
    commit(st, token.view(-1, 1), torch.ones_like(n))
    return Prefilled(token, bad, logprobs_of(st, last, token.view(-1, 1), out.logits[:, :1]))


def _next_draw(st: BatchState):
    """An extension's draw of each row's next token (the watermark's keyed draw), else None."""
    return _only((e.next_draw(st.lens) for e in st.extensions), "next token's draw")


def block_positions(st: BatchState, block: int) -> torch.Tensor:
    """[R, B] absolute positions n .. n+γ of the block rows."""
    return st.lens.view(-1, 1) + torch.arange(block, device=st.lens.device)


def draft_block(pair: ModelPair, st: BatchState, backend: Backend, pos: torch.Tensor,
                ctx_len: int | None) -> torch.Tensor:
    """One draft forward over [anchor, MASK × γ] → draft hidden of rows 1..γ: [R, γ, H]."""
    cfg = pair.draft.cfg
    r, b = pos.shape
    ids = torch.full((r, b), cfg.mask_token_id, dtype=torch.int64, device=pos.device)
    ids[:, 0] = st.anchor
    emb = pair.draft.embed(ids, pair.target)                              # [R, B, H]
    h = pair.draft(emb, pos, st.draft_cache, st.lens, backend, ctx_len)
    return h[:, 1:]


def selector_params(pair: ModelPair) -> SelectorParams:
    cfg = pair.draft.cfg
    if cfg.variant == "dflash1":                                         # per-slot argmax
        return SelectorParams(1, cfg.output_multiplier, cfg.final_logit_softcapping)
    return SelectorParams(cfg.selector_top_k, cfg.output_multiplier, cfg.final_logit_softcapping)


def draft_logits(pair: ModelPair, st: BatchState, h_e: torch.Tensor) -> torch.Tensor:
    """Draft hidden [R, γ, H] → draft logits [R, γ, V] through the target's LM head (or the
    draft's own; a reduced draft vocabulary placed at its target ids, −inf elsewhere), through
    every extension's ``draft_logits`` in order: logit bias and penalties with the committed
    counts where the batch has any (the block's own drafts are not known before the walk), then
    the constraint's candidate masks (``ConstraintBatch.draft_logits``). Proposals only: the
    selector's q is the law of what it draws from these, so any processing stays lossless."""
    logits = pair.draft.logits(h_e, pair.target)                          # [R, γ, V]
    for ext in st.extensions:
        logits = ext.draft_logits(logits)
    return logits


def select_block(pair: ModelPair, st: BatchState, backend: Backend, h_e: torch.Tensor,
                 noise: BlockNoise) -> SelectorOut:
    """Draft logits (``draft_logits``), then the candidate selector's walk with the block's
    draws (an extension's draw source, else the walk uniforms); an extension's walk mask (a
    constraint) walks with the torch ops (``ops.selector``). Rows with candidate counts of
    their own select at the batch's width, each limited to its count (``candidates.py``)."""
    logits = draft_logits(pair, st, h_e)                                 # [R, γ, V]
    params = selector_params(pair)
    if st.candidates is not None:                                        # rows' own counts
        k, logits = st.candidates.limit(logits, params.top_k)
        params = dataclasses.replace(params, top_k=k)
    sel = pair.draft.candidate_selector
    if sel is None:                                                      # DFlash v1: no lattice
        zero = logits.new_zeros(logits.shape[-1], 0)
        args = (logits, logits.new_zeros(*logits.shape[:2], 0), st.anchor, zero, zero)
    else:
        args = (logits, sel.hidden_projection(h_e), st.anchor, sel.predecessor_codebook,
                sel.successor_codebook)
    draws = _only((e.draws(noise) for e in st.extensions), "block's draws") or noise.walk
    mask = _only((e.walk_mask() for e in st.extensions), "walk's mask")
    if mask is not None:                                                 # masked walk: torch ops
        return ops_selector.select(*args, params, st.sampling, draws, backend.has_fp64,
                                   mask=mask)
    return backend.select(*args, params, st.sampling, draws)


def verify_block(pair: ModelPair, st: BatchState, backend: Backend, sel: SelectorOut,
                 noise: BlockNoise, pos: torch.Tensor, ctx_len: int | None
                 ) -> tuple[TargetOutput, VerifyOut, torch.Tensor | None]:
    """Target forward over [anchor, d_1..d_γ] (causal), its rows processed (row j with the
    state after d_1..d_j), then lossless acceptance → (target output, verdict, packed
    logprobs of the block's tokens or None)."""
    ids = torch.cat([st.anchor.view(-1, 1), sel.draft], dim=1)           # [R, B]
    out = pair.target(ids, pos, st.target_cache, st.lens, ctx_len=ctx_len,
                      attn=backend.attention)                           # writes all B rows' K/V
    logits = processed(st, out.logits, sel.draft)
    draws = _only((e.draws(noise) for e in st.extensions), "block's draws") or noise
    block = _only((e.verify_rows() for e in st.extensions), "block verification")
    if block is not None:                                  # block verification: torch ops
        ver = ops_verify.verify(logits, sel.draft, sel.candidates, sel.q, st.sampling, draws,
                                check=False, has_fp64=backend.has_fp64, block=block)
    else:
        ver = backend.verify(logits, sel.draft, sel.candidates, sel.q, st.sampling, draws,
                             check=False)
    return out, ver, logprobs_of(st, logits, ver.tokens, out.logits)


def commit_kv(pair: ModelPair, st: BatchState, out: TargetOutput, pos: torch.Tensor,
              count: torch.Tensor, defer_draft: bool = False) -> None:
    """Write the draft context KV of the rows at ``pos`` (``st.lens`` + t), every row, as the
    target's forward wrote its own: the rows past ``count`` lie past the new length, scratch
    that the next step overwrites before anything reads it (the draft's forward writes its
    block there first).
    ``defer_draft``: keep only the draft's context hidden (its side buffer); the K/V projection
    waits for ``catch_up_draft`` before the next speculative step (target-only steps of an
    adaptive run: most of them are followed by more target-only steps).
    Idempotent for the same inputs (graph warm-up runs the step more than once)."""
    if st.draft_cache is None:
        return
    ctx = pair.draft.context_hidden(out.taps)                              # [R, T, H]
    if defer_draft:
        st.draft_cache.commit_side(0, ctx, st.lens, count)
    else:
        pair.draft.write_context_kv(ctx, pos, st.draft_cache)


def catch_up_draft(pair: ModelPair, st: BatchState, pending: int) -> None:
    """Project the draft context K/V of the last ``pending`` committed positions of every row
    (written deferred, by target-only steps) from the side buffer, in one batch: the draft
    cache then holds what ``commit_kv`` without deferral would have written (the same
    projection, batched over the positions)."""
    start = st.lens - pending                                             # [R]
    pos = start.view(-1, 1) + torch.arange(pending, device=st.lens.device)  # [R, m]
    ctx = st.draft_cache.read_side(0, pos)                                # [R, m, H]
    pair.draft.write_context_kv(ctx, pos, st.draft_cache)


def target_only_forward(pair: ModelPair, st: BatchState, backend: Backend,
                        ctx_len: int | None):
    """One target row per request at position n (its K/V written) and the sampled token n+1
    → (token [R], bad [R], target output, positions [R, 1], packed logprobs or None)."""
    pos = st.lens.view(-1, 1)
    ids = st.anchor.view(-1, 1)
    out = pair.target(ids, pos, st.target_cache, st.lens, ctx_len=ctx_len,
                      attn=backend.attention)
    u = backend.token_uniforms(st.seed, st.key, st.lens, lead=1) \
        if st.sampling.any_sampled else None                              # decides position n+1
    logits = processed(st, out.logits)
    token, bad = sample_next(logits[:, 0], st.sampling, u, marks=_next_draw(st))
    return token, bad, out, pos, logprobs_of(st, logits, token.view(-1, 1), out.logits)

