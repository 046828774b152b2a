"""Held-out acceptance of a draft, teacher-forced on target continuations: greedy ones walked like the
engine (τ at T=0), sampled ones with the target's law (expected acceptance at T=1)."""

from __future__ import annotations

import torch

from ..backend import TorchOpsBackend
from ..models.draft import DraftModel
from ..models.target import TargetModel
from . import distill
from .generate import DistillData


@torch.no_grad()
def accept_lengths(draft: DraftModel, target: TargetModel, data: DistillData, seq: int,
                   backend: TorchOpsBackend) -> list[int]:
    """Greedy accepted drafts at every anchor of sequence ``seq``'s generated part (full blocks)."""
    b = draft.cfg.block_size
    gamma = b - 1
    n, p, st = int(data.lengths[seq]), int(data.prompt_lens[seq]), int(data.starts[seq])
    if n - gamma <= p:
        return []
    anchors = torch.arange(p, n - gamma).view(1, -1)                        # [1, N]
    toks = data.tokens[st:st + n]
    block = toks[anchors.unsqueeze(-1) + torch.arange(b)]                   # [1, N, B]
    ids = torch.full_like(block, draft.cfg.mask_token_id)
    ids[..., 0] = block[..., 0]
    batch = distill.Batch(data.feats[st:st + n].unsqueeze(0), torch.tensor([n]), anchors, ids,
                          block[..., 1:])
    h = distill.draft_hidden(draft, target, batch, backend)[:, :, 1:]       # [1, N, γ, H]
    logits = target.lm_head(h)
    prev = torch.cat([block[..., :1], block[..., 1:-1]], dim=-1)            # true previous tokens
    scores, cand = distill.selector_scores(draft, h, logits, prev, draft.cfg.selector_top_k)
    pick = cand.gather(-1, scores.argmax(-1, keepdim=True))[..., 0]         # [1, N, γ]
    ok = (pick == batch.labels)[0].long()
    return torch.cumprod(ok, dim=-1).sum(-1).tolist()


def engine_tau(draft: DraftModel, target: TargetModel, data: DistillData) -> float:
    """τ at T=0 as the engine would measure it: walk each sequence from its first generated token,
    committing accepted + 1 tokens per step (anchors land where the walk takes them)."""
    was_training = draft.training
    draft.eval()
    backend = TorchOpsBackend("cpu", "cpu", (torch.float32,))
    committed = steps = 0
    for s in range(data.num_sequences):
        acc = accept_lengths(draft, target, data, s, backend)
        i = 0
        while i < len(acc):
            committed += acc[i] + 1
            steps += 1
            i += acc[i] + 1
    draft.train(was_training)
    return committed / steps if steps else 0.0


@torch.no_grad()
def soft_metrics(draft: DraftModel, target: TargetModel, data: DistillData) -> dict[str, float]:
    """Teacher-forced sampling figures at every anchor of sampled continuations that carry the
    target's law (``soft_ids``): ``mass`` (target mass on the K candidates, per slot), ``acc1``
    (Σ_k min(p_k, q_k) with the selector's law after the true previous token) and ``tau1``
    (1 + Σ_e Π_{j≤e} acc1_j), each averaged over anchors."""
    was_training = draft.training
    draft.eval()
    backend = TorchOpsBackend("cpu", "cpu", (torch.float32,))
    b = draft.cfg.block_size
    gamma = b - 1
    sums = {"mass": 0.0, "acc1": 0.0, "tau1": 0.0}
    count = 0
    for s in range(data.num_sequences):
        n, p, st = int(data.lengths[s]), int(data.prompt_lens[s]), int(data.starts[s])
        if n - gamma <= p:
            continue
        anchors = torch.arange(p, n - gamma).view(1, -1)                    # [1, N]
        toks = data.tokens[st:st + n]
        block = toks[anchors.unsqueeze(-1) + torch.arange(b)]               # [1, N, B]
        ids = torch.full_like(block, draft.cfg.mask_token_id)
        ids[..., 0] = block[..., 0]
        rows = st + anchors.unsqueeze(-1) + torch.arange(gamma)             # [1, N, γ]
        batch = distill.Batch(data.feats[st:st + n].unsqueeze(0), torch.tensor([n]), anchors, ids,
                              block[..., 1:], data.soft_ids[rows], data.soft_p[rows])
        _, m = distill.distill_loss(draft, target, batch, backend, 7.0, 1.0)
        for k in sums:
            sums[k] += m[k] * anchors.shape[1]
        count += anchors.shape[1]
    draft.train(was_training)
    return {k: v / max(count, 1) for k, v in sums.items()}
