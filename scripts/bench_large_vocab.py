"""Logit processing, verify and the selector's top-K at a real vocabulary size, before vs after
the host-fact fast paths, side by side in one process (milliseconds and ratios; not a test).

"before" is what every batch ran until the fast paths: no host facts, so every row takes the
stable full-vocabulary sort (``target_probs`` without ``top_k_max`` / ``top_p_rows``, which
graph bodies still use), and the old cumsum/scatter top-K (copied here). "after" is a batch
built by ``SamplingBatch.build``::

    OMP_NUM_THREADS=1 python scripts/bench_large_vocab.py [--vocab 151936] [--device cpu]
"""

from __future__ import annotations

import argparse

import torch

from dflash2rt.bench.measure import mean_ms
from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.ops.sampling import target_probs
from dflash2rt.ops.selector import topk_lowest_index
from dflash2rt.ops.verify import verify

CONFIGS = {"plain T=1": (1.0, 0, 1.0), "top_k=50": (0.8, 50, 1.0), "top_p=0.9": (1.0, 0, 0.9)}


def old_topk_lowest_index(logits: torch.Tensor, k: int):
    """The previous implementation: int64 cumsums and a scatter over [..., V]."""
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    above, tied = logits > kth, logits == kth
    room = k - above.sum(dim=-1, keepdim=True)
    take = above | (tied & (torch.cumsum(tied.to(torch.int64), dim=-1) <= room))
    slot = torch.where(take, torch.cumsum(take.to(torch.int64), dim=-1) - 1, k)
    ids = torch.arange(logits.shape[-1], device=logits.device).expand_as(logits)
    picked = torch.zeros(*logits.shape[:-1], k + 1, dtype=torch.int64, device=logits.device)
    picked.scatter_(-1, slot, ids)
    vals = logits.gather(-1, picked[..., :k])
    order = torch.sort(vals, dim=-1, descending=True, stable=True).indices
    return vals.gather(-1, order), picked[..., :k].gather(-1, order)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--rows", type=int, default=9, help="T: verify rows per request (γ + 1)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    dev = torch.device(a.device)
    sync = (lambda: torch.cuda.synchronize()) if dev.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    print(f"V={a.vocab} T={a.rows} device={dev} torch={torch.__version__} "
          f"threads={torch.get_num_threads()}")
    print(f"{'op':<26}{'R':>3}  {'before ms':>10}  {'after ms':>9}  {'ratio':>6}")
    for r in a.batch:
        logits = (torch.randn(r, a.rows, a.vocab, generator=g) * 3).to(dev)
        gamma, k = a.rows - 1, 16
        cand = logits[:, :gamma].topk(k, dim=-1).indices
        q = torch.softmax(torch.randn(r, gamma, k, generator=g), -1).to(dev)
        noise = BlockNoise.draw(torch.arange(r, device=dev), torch.arange(r, device=dev),
                                torch.full((r,), 100, device=dev), gamma)
        for name, (t, topk, topp) in CONFIGS.items():
            s = SamplingBatch.build([t] * r, [topk] * r, [topp] * r, dev)
            bare = SamplingBatch(s.temperature, s.top_k, s.top_p, s.greedy, True)
            rows = [(f"target_probs {name}",
                     lambda b: target_probs(logits, b.temperature, b.top_k, b.top_p,
                                            top_k_max=b.top_k_max, top_p_rows=b.top_p_rows)),
                    (f"verify sampled {name}",
                     lambda b: verify(logits, cand[..., 0], cand, q, b, noise, check=False))]
            for label, fn in rows:
                before = mean_ms(lambda: fn(bare), sync, a.repeat)
                after = mean_ms(lambda: fn(s), sync, a.repeat)
                print(f"{label:<26}{r:>3}  {before:>10.1f}  {after:>9.1f}  {before / after:>5.1f}x")
        sel = logits[:, 1:].contiguous()                                   # [R, γ, V]
        before = mean_ms(lambda: old_topk_lowest_index(sel, k), sync, a.repeat)
        after = mean_ms(lambda: topk_lowest_index(sel, k), sync, a.repeat)
        print(f"{'selector top-K (K=16)':<26}{r:>3}  {before:>10.1f}  {after:>9.1f}  "
              f"{before / after:>5.1f}x")


if __name__ == "__main__":
    main()
