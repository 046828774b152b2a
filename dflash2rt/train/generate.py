"""Distillation data: target continuations (engine, target-only, large batches) and their tap features."""

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
    """

    tokens: torch.Tensor        # [N] int64
    feats: torch.Tensor         # [N, n_taps, H] float32
    starts: torch.Tensor        # [S] int64
    lengths: torch.Tensor       # [S] int64
    prompt_lens: torch.Tensor   # [S] int64

    @property
    def num_sequences(self) -> int:
        return int(self.starts.numel())

    def subset(self, idx: list[int]) -> "DistillData":
        seqs = [(int(self.starts[i]), int(self.lengths[i])) for i in idx]
        rows = torch.cat([torch.arange(s, s + n) for s, n in seqs])
        lengths = torch.tensor([n for _, n in seqs], dtype=torch.int64)
        starts = torch.cumsum(lengths, 0) - lengths
        return DistillData(self.tokens[rows], self.feats[rows], starts, lengths,
                           self.prompt_lens[idx])


def continuations(pair: ModelPair, backend: Backend, prompts: list[list[int]], new_tokens: int,
                  temperatures: list[float], batch: int, seed: int, phase: str = "generate"
                  ) -> list[list[int]]:
    """Target-only decoding of every prompt (temperature per prompt); returns the new tokens."""
    engine = Engine(pair, backend)
    out: list[list[int]] = []
    prog = Progress(phase, (len(prompts) + batch - 1) // batch, every=1)
    for b0 in range(0, len(prompts), batch):
        reqs = [Request(tuple(p), SamplingParams(max_new_tokens=new_tokens, temperature=t,
                                                 seed=seed), key=b0 + i)
                for i, (p, t) in enumerate(zip(prompts[b0:b0 + batch], temperatures[b0:b0 + batch]))]
        outputs, stats = engine.generate(reqs, spec=False)
        out.extend(list(o.token_ids) for o in outputs)
        prog.step(b0 // batch + 1, stats.generated)
    return out


@torch.no_grad()
def tap_features(target: TargetModel, seqs: list[list[int]], batch: int) -> list[torch.Tensor]:
    """Target taps of every full sequence (one causal forward each): per sequence [L, n_taps, H]."""
    from .target import lm_taps

    feats: list[torch.Tensor] = []
    for b0 in range(0, len(seqs), batch):
        chunk = seqs[b0:b0 + batch]
        taps = lm_taps(target, chunk)                                      # [R, T, n_taps, H]
        feats.extend(taps[i, :len(s)].clone() for i, s in enumerate(chunk))
    return feats


def pack(seqs: list[list[int]], feats: list[torch.Tensor], prompt_lens: list[int]) -> DistillData:
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
    return DistillData(
        tokens=torch.tensor([t for s in seqs for t in s], dtype=torch.int64),
        feats=torch.cat(feats), starts=torch.cumsum(lengths, 0) - lengths, lengths=lengths,
        prompt_lens=torch.tensor(prompt_lens, dtype=torch.int64))


def build_distill_data(pair: ModelPair, backend: Backend, prompts: list[list[int]], new_tokens: int,
                       temperatures: list[float], batch: int, seed: int) -> DistillData:
    """Continue every prompt with the target, then compute the taps of prompt + continuation."""
    conts = continuations(pair, backend, prompts, new_tokens, temperatures, batch, seed)
    seqs = [list(p) + c for p, c in zip(prompts, conts)]
    feats = tap_features(pair.target, seqs, batch)
    return pack(seqs, feats, [len(p) for p in prompts])
