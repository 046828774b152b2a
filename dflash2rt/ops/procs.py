"""Logit processors on raw target logits: logit bias, then repetition / frequency / presence
penalties (vLLM's definitions and order), applied per verify row with the in-block state.

Definitions (as in vLLM; the repetition penalty as in transformers, over prompt + output):
- ``logit_bias``: ``l[t] += bias[t]`` (token id → bias, applied first).
- ``repetition_penalty`` r (1 = off): every token that occurs in the prompt or the output so far
  has ``l / r`` where ``l > 0`` and ``l · r`` where ``l <= 0``.
- ``frequency_penalty`` f, ``presence_penalty`` s (0 = off): over the *output* tokens only,
  ``l[t] -= f · count[t] + s · [count[t] > 0]``.
Temperature, top-k, top-p and min-p follow on the processed logits (``ops.sampling``).

Under speculation, row j of the verify logits [R, γ+1, V] is the target's law after the anchor
and the drafts d_1..d_j, so it is processed with the counts of the committed output *plus*
d_1..d_j (row 0, the anchor's row, with the committed counts): ``block_counts`` builds them on
the device with a cumulative one-hot of the drafts, so nothing is read on the host. The draft
logits are processed too, with the committed counts only (``engine.stages.draft_logits``: the
block's drafts are not known before the walk): that only shapes the proposals, whose q stays
the law they were actually drawn from, so verification stays lossless.

A batch in which no request uses a processor has no ``ProcBatch`` at all (a host fact), so such
requests cost nothing; in a mixed batch the others' rows go through ``l / 1``, ``l · 1``,
``l − 0`` and ``l + 0``, which leave every float unchanged.
"""

from __future__ import annotations

import math
import numbers
import struct
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import torch

from ..errors import SamplingParamsError
from .sampling import target_logprobs

BIAS_LIMIT = 100.0          # |logit_bias| bound, as the OpenAI API and vLLM clamp it
PENALTY_LIMIT = 2.0         # |frequency_penalty|, |presence_penalty| bound (OpenAI / vLLM)
MAX_LOGPROBS = 20           # top-n alternatives a request may ask for (vLLM's default cap)


def _real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def check_proc_params(repetition_penalty: float, frequency_penalty: float,
                      presence_penalty: float, min_p: float, logit_bias: Mapping,
                      logprobs: int | None) -> None:
    """Raise SamplingParamsError for values a request may not carry (what to fix in the text)."""
    if not _real(repetition_penalty) or not 1e-6 <= repetition_penalty <= 1e6:
        raise SamplingParamsError(f"repetition_penalty must be a number in [1e-6, 1e6] "
                                  f"(1 = off), got {repetition_penalty!r}")
    for name, v in (("frequency_penalty", frequency_penalty),
                    ("presence_penalty", presence_penalty)):
        if not _real(v) or not -PENALTY_LIMIT <= v <= PENALTY_LIMIT:
            raise SamplingParamsError(f"{name} must be a number in [-2, 2] (0 = off), got {v!r}")
    if not _real(min_p) or not 0.0 <= min_p <= 1.0:
        raise SamplingParamsError(f"min_p must be a number in [0, 1] (0 = off), got {min_p!r}")
    if not isinstance(logit_bias, Mapping):
        raise SamplingParamsError(f"logit_bias must be a mapping token id → bias, got "
                                  f"{type(logit_bias).__name__}")
    for t, b in logit_bias.items():
        if not isinstance(t, numbers.Integral) or isinstance(t, bool) or not 0 <= t < 2**31:
            raise SamplingParamsError(f"logit_bias keys must be token ids (integers >= 0), "
                                      f"got {t!r}")
        if not _real(b) or not -BIAS_LIMIT <= b <= BIAS_LIMIT:
            raise SamplingParamsError(f"logit_bias[{t}] must be a number in [-100, 100], "
                                      f"got {b!r}")
    if logprobs is not None and (not isinstance(logprobs, numbers.Integral)
                                 or isinstance(logprobs, bool)
                                 or not 0 <= logprobs <= MAX_LOGPROBS):
        raise SamplingParamsError(f"logprobs must be None (off) or an integer in [0, "
                                  f"{MAX_LOGPROBS}] (top-n alternatives), got {logprobs!r}")


def block_counts(counts: torch.Tensor, draft: torch.Tensor | None) -> torch.Tensor:
    """Output-token counts per verify row: counts [R, V] (committed) and draft [R, γ] →
    int32 [R, γ+1, V], row j = counts + one-hot(d_1) + … + one-hot(d_j) (row 0: counts).
    ``draft`` None: a target-only row → [R, 1, V]."""
    if draft is None or draft.shape[1] == 0:
        return counts.unsqueeze(1)
    r, gamma = draft.shape
    hot = torch.zeros(r, gamma + 1, counts.shape[1], dtype=counts.dtype, device=counts.device)
    hot[:, 1:].scatter_(2, draft.unsqueeze(-1), 1)                        # row j+1 ← d_{j+1}
    return counts.unsqueeze(1) + torch.cumsum(hot, dim=1, dtype=counts.dtype)


def penalize(logits: torch.Tensor, counts: torch.Tensor, prompt: torch.Tensor,
             rep: torch.Tensor, freq: torch.Tensor, pres: torch.Tensor) -> torch.Tensor:
    """float32 logits [R, T, V] with counts [R, T, V] (output tokens per row), prompt [R, V]
    bool, rep / freq / pres [R] → the penalized logits (vLLM's ``apply_penalties``)."""
    r = logits.shape[0]
    seen = counts > 0                                                     # [R, T, V]
    r_ = torch.where(prompt.unsqueeze(1) | seen, rep.view(r, 1, 1), 1.0)
    x = torch.where(logits > 0, logits / r_, logits * r_)
    return x - freq.view(r, 1, 1) * counts.float() - pres.view(r, 1, 1) * seen.float()


@dataclass(frozen=True)
class ProcBatch:
    """The device state of R requests' logit processors and logprobs, with its host facts.

    ``counts`` [R, V] int32: output tokens committed so far (updated by ``commit_``, on the
    device); ``prompt`` [R, V] bool: tokens of the prompt; ``bias`` [R, V] float32 or None
    (no row has a bias); ``penalized``: some row has a penalty (else the penalty step is
    skipped). ``logprobs``: the largest top-n any row asks for (None: no row wants logprobs);
    ``wants``: each row's own request (None / n), on the host; ``raw`` [R] bool: the rows
    whose logprobs are of the raw logits (``logprobs_mode`` "raw"), ``any_raw`` on the host."""

    counts: torch.Tensor
    prompt: torch.Tensor
    rep: torch.Tensor
    freq: torch.Tensor
    pres: torch.Tensor
    bias: torch.Tensor | None
    penalized: bool
    logprobs: int | None
    wants: tuple[int | None, ...]
    raw: torch.Tensor | None = None
    any_raw: bool = False

    @staticmethod
    def build(params: Sequence, prompts: Sequence[Sequence[int]], vocab: int,
              device: torch.device | str) -> "ProcBatch | None":
        """From requests' SamplingParams and prompts; None when no request uses a processor
        or logprobs (such a batch does no processing work at all)."""
        pen = [p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0
               or p.presence_penalty != 0.0 for p in params]
        wants = tuple(p.logprobs for p in params)
        biased = any(p.logit_bias for p in params)
        if not any(pen) and not biased and all(w is None for w in wants):
            return None
        r = len(params)
        f32 = lambda xs: torch.tensor(xs, dtype=torch.float32, device=device)  # noqa: E731
        prompt = torch.zeros(r, vocab, dtype=torch.bool)
        for i, ids in enumerate(prompts):
            prompt[i, list(ids)] = True
        bias = None
        if biased:
            bias = torch.zeros(r, vocab, dtype=torch.float32)
            for i, p in enumerate(params):
                for t, b in p.logit_bias.items():
                    bias[i, t] = float(b)
            bias = bias.to(device)
        return ProcBatch(
            counts=torch.zeros(r, vocab, dtype=torch.int32, device=device),
            prompt=prompt.to(device), rep=f32([p.repetition_penalty for p in params]),
            freq=f32([p.frequency_penalty for p in params]),
            pres=f32([p.presence_penalty for p in params]), bias=bias, penalized=any(pen),
            logprobs=max((w for w in wants if w is not None), default=None), wants=wants,
            raw=torch.tensor([p.logprobs_mode == "raw" for p in params], device=device),
            any_raw=any(p.logprobs_mode == "raw" and p.logprobs is not None for p in params))

    def take(self, idx: Sequence[int]) -> "ProcBatch":
        """Rows ``idx`` (host-known; the host facts stay true as upper bounds)."""
        t = torch.tensor(list(idx), dtype=torch.int64, device=self.counts.device)
        return replace(self, counts=self.counts[t], prompt=self.prompt[t], rep=self.rep[t],
                       freq=self.freq[t], pres=self.pres[t],
                       bias=None if self.bias is None else self.bias[t],
                       raw=None if self.raw is None else self.raw[t],
                       wants=tuple(self.wants[i] for i in idx))

    def process(self, logits: torch.Tensor, draft: torch.Tensor | None = None) -> torch.Tensor:
        """Raw logits [R, T, V] (T = γ+1 verify rows over [anchor, d_1..d_γ], or T = 1) →
        float32 processed logits: bias, then the penalties with row j's counts (committed +
        d_1..d_j, ``block_counts``)."""
        x = logits.float()
        if self.bias is not None:
            x = x + self.bias.unsqueeze(1)
        if self.penalized:
            x = penalize(x, block_counts(self.counts, draft), self.prompt, self.rep, self.freq,
                         self.pres)
        return x

    def commit_(self, tokens: torch.Tensor, n: torch.Tensor) -> None:
        """Count the first ``n[r]`` of tokens [R, T] as output (in place, on the device)."""
        col = torch.arange(tokens.shape[1], device=tokens.device).view(1, -1)
        take = (col < n.view(-1, 1)) & (tokens >= 0)
        self.counts.scatter_add_(1, tokens.clamp(min=0), take.to(self.counts.dtype))


def token_logprobs(logits: torch.Tensor, sampling, tokens: torch.Tensor, n: int,
                   raw_logits: torch.Tensor | None = None, raw: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """Processed logits [R, T, V], tokens [R, T] (−1: none) → int64 [R, T·(1+2n)]: per row
    the float32 log-probability of each token under the final law (temperature / top-k /
    top-p / min-p of ``sampling``; greedy rows at temperature 1; log_softmax over the kept
    tokens, finite wherever the law keeps one), or for the ``raw`` rows [R] bool under the
    model's own law (log_softmax of ``raw_logits``, before any processing: vLLM's default),
    then the top-n log-probabilities and their ids, the floats' bits as integers so that they
    travel in the step's one int64 device→host transfer (``unpack_logprobs`` reads them)."""
    lp = target_logprobs(logits, sampling.temperature, sampling.top_k, sampling.top_p,
                         top_k_max=sampling.top_k_max, top_p_rows=sampling.top_p_rows,
                         min_p=sampling.min_p)
    if raw_logits is not None and raw is not None:
        r = lp.shape[0]
        lp = torch.where(raw.view(r, 1, 1), torch.log_softmax(raw_logits.float(), -1), lp)
    r, t, _ = lp.shape
    own = lp.gather(-1, tokens.clamp(min=0).unsqueeze(-1))                # [R, T, 1]
    top = torch.topk(lp, n, dim=-1)                                       # [R, T, n]
    vals = torch.cat([own, top.values], -1).view(torch.int32).long()      # [R, T, 1+n]
    return torch.cat([vals.reshape(r, -1), top.indices.reshape(r, -1)], 1)


def unpack_logprobs(row: Sequence[int], t: int, n: int, keep: int | None
                    ) -> list[tuple[float, dict[int, float]]]:
    """One row of ``token_logprobs`` (host ints) → per token (log-prob, {id: log-prob} of its
    top-``keep`` alternatives); [] for a request that asked for none (``keep`` None)."""
    if keep is None:
        return []
    m = t * (1 + n)
    floats = struct.unpack(f"{m}f", struct.pack(f"{m}i", *row[:m]))
    ids = row[m:]
    out = []
    for j in range(t):
        f = floats[j * (1 + n):(j + 1) * (1 + n)]
        out.append((f[0], {int(ids[j * n + i]): f[1 + i] for i in range(keep)}))
    return out
