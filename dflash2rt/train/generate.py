"""Distillation data: target continuations (engine, target-only, large batches), their tap features
and the target's own next-token distribution (top-M at temperature 1) at every row."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..backend import Backend
from ..engine.engine import Engine
from ..engine.request import Request, SamplingParams
from ..models.pair import ModelPair
from ..models.target import TargetModel
from .progress import Progress


@dataclass
class DistillData:
    """Sequences packed end to end: row i of ``tokens`` / ``feats`` belongs to one sequence.

    Sequence s spans rows [starts[s], starts[s] + lengths[s]); its generated part (where anchors
    are drawn) starts ``prompt_lens[s]`` rows in. ``feats`` are the target taps [N, n_taps, H].
    ``soft_ids`` / ``soft_p`` (optional) are the target's M most likely next tokens after each row
    and their probabilities at temperature 1 (row i: the law of token i + 1), descending.
    """

    tokens: torch.Tensor        # [N] int64
    feats: torch.Tensor         # [N, n_taps, H] float32
    starts: torch.Tensor        # [S] int64
    lengths: torch.Tensor       # [S] int64
    prompt_lens: torch.Tensor   # [S] int64
    soft_ids: torch.Tensor | None = None   # [N, M] int64
    soft_p: torch.Tensor | None = None     # [N, M] float32

    @property
    def num_sequences(self) -> int:
        return int(self.starts.numel())

    def subset(self, idx: list[int]) -> "DistillData":
        seqs = [(int(self.starts[i]), int(self.lengths[i])) for i in idx]
        rows = torch.cat([torch.arange(s, s + n) for s, n in seqs])
        lengths = torch.tensor([n for _, n in seqs], dtype=torch.int64)
        starts = torch.cumsum(lengths, 0) - lengths
        soft = (None, None) if self.soft_ids is None else (self.soft_ids[rows], self.soft_p[rows])
        return DistillData(self.tokens[rows], self.feats[rows], starts, lengths,
                           self.prompt_lens[idx], *soft)


def continuations(pair: ModelPair, backend: Backend, prompts: list[list[int]], new_tokens: int,
                  temperatures: list[float], batch: int, seed: int, phase: str = "generate",
                  top_ps: list[float] | None = None) -> list[list[int]]:
    """Target-only decoding of every prompt (temperature and top-p per prompt); returns the new
    tokens. A request's tokens depend on (prompt, params, seed, its index), never on the batch."""
    engine = Engine(pair, backend)
    out: list[list[int]] = []
    top_ps = [1.0] * len(prompts) if top_ps is None else top_ps
    prog = Progress(phase, (len(prompts) + batch - 1) // batch, every=1)
    for b0 in range(0, len(prompts), batch):
        reqs = [Request(tuple(p), SamplingParams(max_new_tokens=new_tokens, temperature=t,
                                                 top_p=tp, seed=seed), key=b0 + i)
                for i, (p, t, tp) in enumerate(zip(prompts[b0:b0 + batch],
                                                   temperatures[b0:b0 + batch],
                                                   top_ps[b0:b0 + batch]))]
        outputs, stats = engine.generate(reqs, spec=False)
        out.extend(list(o.token_ids) for o in outputs)
        prog.step(b0 // batch + 1, stats.generated)
    return out


@torch.no_grad()
def tap_features(target: TargetModel, seqs: list[list[int]], batch: int, soft_top: int = 0
                 ) -> list[torch.Tensor] | tuple[list[torch.Tensor], list[tuple[torch.Tensor,
                                                                                 torch.Tensor]]]:
    """Target taps of every full sequence (one causal forward each): per sequence [L, n_taps, H].

    With ``soft_top`` = M > 0 also the target's top-M next-token law at temperature 1 of every
    row, per sequence (ids [L, M] int64, probabilities [L, M] float32): returns (feats, soft).
    """
    from .target import lm_forward

    feats: list[torch.Tensor] = []
    soft: list[tuple[torch.Tensor, torch.Tensor]] = []
    for b0 in range(0, len(seqs), batch):
        chunk = seqs[b0:b0 + batch]
        out = lm_forward(target, chunk)
        taps = out.taps                                                    # [R, T, n_taps, H]
        feats.extend(taps[i, :len(s)].clone() for i, s in enumerate(chunk))
        if soft_top > 0:
            p, ids = torch.topk(torch.softmax(out.logits.float(), dim=-1), soft_top, dim=-1)
            soft.extend((ids[i, :len(s)].clone(), p[i, :len(s)].clone())
                        for i, s in enumerate(chunk))
    return (feats, soft) if soft_top > 0 else feats


def pack(seqs: list[list[int]], feats: list[torch.Tensor], prompt_lens: list[int],
         soft: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> DistillData:
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
    return DistillData(
        tokens=torch.tensor([t for s in seqs for t in s], dtype=torch.int64),
        feats=torch.cat(feats), starts=torch.cumsum(lengths, 0) - lengths, lengths=lengths,
        prompt_lens=torch.tensor(prompt_lens, dtype=torch.int64),
        soft_ids=torch.cat([i for i, _ in soft]) if soft else None,
        soft_p=torch.cat([p for _, p in soft]) if soft else None)


def build_distill_data(pair: ModelPair, backend: Backend, prompts: list[list[int]], new_tokens: int,
                       temperatures: list[float], batch: int, seed: int,
                       top_ps: list[float] | None = None, soft_top: int = 0) -> DistillData:
    """Continue every prompt with the target (temperature / top-p per prompt), then compute the
    taps of prompt + continuation (and, with ``soft_top`` > 0, the target's top-M law per row)."""
    conts = continuations(pair, backend, prompts, new_tokens, temperatures, batch, seed,
                          top_ps=top_ps)
    seqs = [list(p) + c for p, c in zip(prompts, conts)]
    if soft_top > 0:
        feats, soft = tap_features(pair.target, seqs, batch, soft_top)
    else:
        feats, soft = tap_features(pair.target, seqs, batch), None
    return pack(seqs, feats, [len(p) for p in prompts], soft)
