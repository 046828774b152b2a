"""Large vocabularies (V = 151,936): the host-fact fast paths of logit processing give the law of
the full sorted path bit for bit, and the selector's top-K, verify and sample_next agree with
their definitions there."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.ops.sampling import target_probs
from dflash2rt.ops.selector import topk_lowest_index
from dflash2rt.ops.verify import sample_next, verify

V = 151_936
HALF_UP = float(np.nextafter(np.float32(0.5), np.float32(1)))


def _logits(g: torch.Generator, shape, ties: bool) -> torch.Tensor:
    x = torch.randn(*shape, generator=g) * 2
    if ties:                              # a ½ grid: the k-th value is tied many times
        x = torch.round(x * 2) / 2
    x[..., -100:] = float("-inf")         # a padded tail
    return x


def _full_law(x: torch.Tensor, s: SamplingBatch) -> torch.Tensor:
    """No host facts: every row through the stable full sort (the definition)."""
    return target_probs(x, s.temperature, s.top_k, s.top_p)


def _fast_law(x: torch.Tensor, s: SamplingBatch) -> torch.Tensor:
    return target_probs(x, s.temperature, s.top_k, s.top_p, top_k_max=s.top_k_max,
                        top_p_rows=s.top_p_rows)


PARAMS = [  # (temperatures, top_k, top_p) per request: mixed greedy / sampled / filters
    ([1.0, 0.0, 0.7, 1.3], [0, 0, 0, 0], [1.0, 1.0, 1.0, 1.0]),         # softmax only
    ([1.0, 0.8, 0.0, 2.0], [1, 40, 7, 0], [1.0, 1.0, 1.0, 1.0]),         # top-k, k = 1, ties
    ([1.0, 0.9, 1.0, 0.5], [V, V + 7, 2**40, 3], [1.0, 1.0, 1.0, 1.0]),  # top_k ≥ V keeps all
    ([1.0, 1.0, 0.0, 0.6], [0, 16, 0, 0], [1e-6, 0.9, 1.0, HALF_UP]),    # tiny top_p: one token
    ([0.7, 1.0, 1.0, 1.0], [0, 5, 0, 0], [1.0, 0.3, 1.0 - 1e-9, 1.0]),   # 1 - 1e-9 stages to 1
]


@pytest.mark.parametrize("case", range(len(PARAMS)))
@pytest.mark.parametrize("ties", [False, True])
def test_fast_paths_give_the_full_law_bit_for_bit(case, ties):
    g = torch.Generator().manual_seed(10 * case + ties)
    temps, ks, ps = PARAMS[case]
    s = SamplingBatch.build(temps, ks, ps)
    x = _logits(g, (4, 2, V), ties)
    assert torch.equal(_fast_law(x, s), _full_law(x, s))


def test_host_facts_are_staged_and_survive_take():
    s = SamplingBatch.build([1.0, 0.0, 1.0, 0.5], [0, 9, 3, 0], [0.9, 1.0, 1.0 - 1e-9, 0.5])
    assert s.top_k_max == 9 and s.top_p_rows == (0, 3)   # 1 - 1e-9 is 1.0 in float32
    t = s.take([3, 2, 0])
    assert t.top_p_rows == (0, 2) and t.top_k_max == 9
    assert t.top_p.tolist() == [0.5, 1.0, pytest.approx(0.9)]
    x = _logits(torch.Generator().manual_seed(1), (3, 1, V), ties=True)
    assert torch.equal(_fast_law(x, t), _full_law(x, t))


def test_facts_that_lie_change_the_law():
    """The facts are the contract: a row left out of top_p_rows is not truncated (so the test
    above would catch a batch whose facts drop a row)."""
    s = SamplingBatch.build([1.0], [0], [0.5])
    x = _logits(torch.Generator().manual_seed(2), (1, 1, V), ties=False)
    lying = target_probs(x, s.temperature, s.top_k, s.top_p, top_k_max=0, top_p_rows=())
    assert not torch.equal(lying, _full_law(x, s))


def _topk_definition(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = x.reshape(-1, x.shape[-1]).double().numpy()
    ids = np.stack([np.lexsort((np.arange(r.size), -r))[:k] for r in rows])
    ids_t = torch.from_numpy(ids).view(*x.shape[:-1], k)
    return x.gather(-1, ids_t), ids_t


@pytest.mark.parametrize("k", [1, 16, 97])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_selector_topk_lowest_index_at_large_v(k, dtype):
    x = _logits(torch.Generator().manual_seed(k), (2, 3, V), ties=True).to(dtype)
    x[1, 2] = float("-inf")
    x[1, 2, [V - 1, 77]] = 0.0                 # two finite entries: k-th value is −inf for k ≥ 3
    vals, ids = topk_lowest_index(x, k)
    want_vals, want_ids = _topk_definition(x, k)
    assert torch.equal(ids, want_ids) and torch.equal(vals, want_vals)


def test_verify_and_sample_next_agree_with_and_without_host_facts():
    """The ops read the facts from the SamplingBatch: the same tokens as a batch without them
    (graph bodies build those), on a mixed greedy / sampled / filtered batch."""
    g = torch.Generator().manual_seed(5)
    r, gamma, k = 5, 3, 4
    logits = _logits(g, (r, gamma + 1, V), ties=True)
    s = SamplingBatch.build([0.0, 1.0, 0.8, 1.0, 1.2], [0, 0, 20, 3, 0],
                            [1.0, 1.0, 1.0, 0.6, 0.95])
    bare = SamplingBatch(s.temperature, s.top_k, s.top_p, s.greedy, True)
    p = _full_law(logits, s)
    cand = p.topk(k, dim=-1).indices[:, :gamma]                 # drafts the target likes
    q = torch.softmax(torch.randn(r, gamma, k, generator=g), -1)
    draft = cand[..., 0]
    for seed in range(4):
        noise = BlockNoise.draw(torch.full((r,), seed), torch.arange(r), torch.arange(r) * 9,
                                gamma)
        a = verify(logits, draft, cand, q, s, noise, check=False)
        b = verify(logits, draft, cand, q, bare, noise, check=False)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.bad, b.bad)
        ta, _ = sample_next(logits[:, 0], s, noise.bonus)
        tb, _ = sample_next(logits[:, 0], bare, noise.bonus)
        assert torch.equal(ta, tb)
        assert bool((p[:, 0].gather(1, ta.view(-1, 1)) > 0).all())    # never a p = 0 token
