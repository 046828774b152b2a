"""Does a tensor-parallel run decode what the unsharded model decodes? ``tp_equivalence``
measures it on one host (spawned ranks, gloo on the CPU):

- greedy tokens of TP=N speculative and TP=N target-only runs against TP=1 target-only;
- the largest logit difference TP=N vs TP=1, teacher-forced on TP=1's sequences (the sharded
  target's ``forward_full`` on every rank; rank 0's logits are compared);
- each token that differs from TP=1 (the first difference of a request: after it the
  sequences differ) must be **explained by a near-tie**: the unsharded target in float64 after
  the common prefix scores the two tokens within ``tol`` = 4 × (the largest TP=N vs TP=1 logit
  difference + the TP=1 logits' distance from float64 at those two tokens) of each other. The
  row-parallel all-reduces add partial sums in another order than one matmul does, which moves
  a logit by about that much, and can flip only a choice that close.

Used by tests/test_tp.py and ``dflash2rt bench tp-equivalence``.
"""

from __future__ import annotations

import copy
import os
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch


@dataclass
class Divergence:
    run: str                  # "spec" or "target_only"
    request: int
    position: int             # index into the generated tokens
    tp1_token: int
    tp_token: int
    margin64: float           # |logit_a - logit_b| of the unsharded float64 target
    tol: float
    explained: bool


@dataclass
class Equivalence:
    tp: int
    tokens_tp1: list[list[int]]
    tokens_spec: list[list[int]]
    tokens_target_only: list[list[int]]
    max_logit_diff: float     # max |logits TP=N - logits TP=1|, teacher-forced
    max_logit: float          # max |logits TP=1| over the same rows (the scale)
    divergences: list[Divergence] = field(default_factory=list)
    tensor_parallel: str = ""

    @property
    def equal(self) -> bool:
        return self.tokens_spec == self.tokens_target_only == self.tokens_tp1

    @property
    def ok(self) -> bool:
        """Equal, or every difference explained by a float64 near-tie."""
        return all(d.explained for d in self.divergences)

    def summary(self) -> str:
        n = sum(map(len, self.tokens_tp1))
        head = (f"tp={self.tp}: {len(self.tokens_tp1)} requests, {n} TP=1 tokens; spec == "
                f"target-only == TP=1: {self.equal}; max |Δlogit| TP={self.tp} vs TP=1 = "
                f"{self.max_logit_diff:.3g} (max |logit| {self.max_logit:.3g})")
        return "\n".join([head] + [
            f"  {d.run} request {d.request} token {d.position}: TP=1 {d.tp1_token}, TP="
            f"{self.tp} {d.tp_token}; float64 margin {d.margin64:.3g} vs tol {d.tol:.3g}: "
            f"{'near-tie' if d.explained else 'NOT EXPLAINED'}" for d in self.divergences])

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "equal": self.equal, "ok": self.ok}


def _rows(target, prompt: Sequence[int], generated: Sequence[int]) -> torch.Tensor:
    """The logits [len(generated), V] predicting each generated token, teacher-forced."""
    seq = list(prompt) + list(generated)
    ids = torch.tensor([seq], device=target.lm_head.weight.device)
    pos = torch.arange(len(seq), device=ids.device)[None]
    with torch.no_grad():
        logits = target.forward_full(ids, pos, torch.ones_like(ids, dtype=torch.bool)).logits
    return logits[0, len(prompt) - 1:len(seq) - 1].float().cpu()


def _ranks(model, ids, ref, max_new_tokens, block_size, dtype, out_dir):
    """On each rank: greedy spec and target-only tokens (hash check on), then the sharded
    target's teacher-forced logits on TP=1's sequences; rank 0 saves them."""
    import dflash2rt
    from dflash2rt.distributed.rank_setup import rank_setup
    from dflash2rt.registry import Registry

    tp = int(os.environ["WORLD_SIZE"])
    kw = dict(prompts=ids, max_new_tokens=max_new_tokens, tp=tp, tp_check=True,
              block_size=block_size, dtype=dtype)
    spec = dflash2rt.run(model, "cpu", **kw)
    tonly = dflash2rt.run(model, "cpu", spec=False, **kw)
    a = dict(model=model, draft=None, revision=None, draft_revision=None, dtype=dtype,
             tp=tp, tp_check=False, backend="cpu")
    _, group, pair = rank_setup(a, Registry.discover().select("cpu").backend)
    logits = [_rows(pair.target, p, g) for p, g in zip(ids, ref)]
    if group.is_main:
        path = os.path.join(out_dir, "logits.pt")
        torch.save(logits, path)
        return {"spec": spec.tokens, "target_only": tonly.tokens, "logits": path,
                "tensor_parallel": spec.stats.tensor_parallel}
    return None


def tp_equivalence(model: Any, prompts, max_new_tokens: int = 64, tp: int = 2,
                   block_size: int | None = None, timeout_s: float | None = None,
                   dtype: torch.dtype | str = "auto") -> Equivalence:
    """Measure TP=``tp`` against TP=1 on the CPU (module docstring). ``model``: what
    ``dflash2rt.run`` takes (a bundled name, a directory, a picklable ModelPair), loaded in
    ``dtype`` ("auto": float32 on the CPU) unless it is a ModelPair."""
    import dflash2rt
    from dflash2rt.api import resolve_model
    from dflash2rt.prompts import encode_prompts

    from ..distributed import launch

    pair = resolve_model(model, "cpu", dtype)
    ids = [list(p) for p in encode_prompts(pair, prompts)]
    ref = dflash2rt.run(pair, "cpu", prompts=ids, max_new_tokens=max_new_tokens,
                        spec=False, dtype=dtype).tokens
    with tempfile.TemporaryDirectory() as tmp:
        out = launch.spawn(_ranks, tp, (model, ids, ref, max_new_tokens, block_size, dtype, tmp),
                           timeout_s=timeout_s)
        tp_logits = torch.load(out["logits"])
    diff = scale = 0.0
    dev_rows = []
    for p, g, l2 in zip(ids, ref, tp_logits):
        l1 = _rows(pair.target, p, g)
        diff = max(diff, float((l2 - l1).abs().max()))
        scale = max(scale, float(l1.abs().max()))
        dev_rows.append(l1)
    res = Equivalence(tp, ref, out["spec"], out["target_only"], diff, scale,
                      tensor_parallel=out["tensor_parallel"])
    target64 = None
    for run in ("spec", "target_only"):
        for i, (got, want) in enumerate(zip(out[run], ref)):
            j = next((k for k, (x, y) in enumerate(zip(got, want)) if x != y), None)
            if j is None:
                if len(got) != len(want):           # one stopped where the other did not
                    res.divergences.append(Divergence(run, i, min(len(got), len(want)), -1, -1,
                                                      float("inf"), 0.0, False))
                continue
            if target64 is None:                     # only when needed: a float64 copy
                target64 = copy.deepcopy(pair.target).double()
            a, b = want[j], got[j]
            l64 = _rows(target64, ids[i], want[:j + 1])[j].double()
            l1 = dev_rows[i][j].double()
            margin = float((l64[a] - l64[b]).abs())
            dev = float(max((l1[a] - l64[a]).abs(), (l1[b] - l64[b]).abs()))
            tol = 4 * (diff + dev)
            res.divergences.append(Divergence(run, i, j, a, b, margin, tol, margin <= tol))
    return res
