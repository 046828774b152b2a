"""The K curve (dflash2rt.train.k_curve) on the bundled pair: two K values, one prompt, a few
tokens; sane fields and greedy tokens equal to target-only at every K. No timing asserted."""

from __future__ import annotations

import pytest

from dflash2rt.train.k_curve import k_curve, load_heldout, markdown_table, resolve_ks, \
    with_top_k
from dflash2rt.bench.measure import TEMPERATURES


@pytest.fixture(scope="module")
def heldout():
    return load_heldout("stdlib-code", 1)


def test_with_top_k_leaves_the_pair_alone(heldout):
    pair, _, _ = heldout
    k_pair = with_top_k(pair, 32)
    assert k_pair.draft.cfg.selector_top_k == 32
    assert pair.draft.cfg.selector_top_k == 16
    assert k_pair.target is pair.target
    assert k_pair.draft.fc.weight.data_ptr() == pair.draft.fc.weight.data_ptr()
    assert resolve_ks([16, "full", 16], 2048) == [16, 2048]


def test_two_ks_one_prompt(heldout, one_thread):
    pair, prompts, _ = heldout
    res = k_curve(pair, prompts, ks=(16, 32), temperatures=(TEMPERATURES[0], TEMPERATURES[2]),
                  max_new_tokens=12, timing_rounds=1, timing_steps=1)
    rows = res["rows"]
    assert [(r["temperature"], r["k"]) for r in rows] == [(0.0, 16), (0.0, 32), (1.0, 16),
                                                          (1.0, 32)]
    for r in rows:
        assert 1.0 <= r["tau"] <= res["block_size"]
        assert 0.0 <= r["topk_mass"] <= 1.0 + 1e-6
        assert 0.0 <= r["acceptance"] <= 1.0
        assert r["steps"] >= 1
        assert r["select_ms"] > 0 and r["verify_ms"] > 0
    greedy = [r for r in rows if r["temperature"] == 0]
    assert greedy[0]["outputs"] == greedy[1]["outputs"] == greedy[0]["target_only_outputs"]
    assert all(r["greedy_equal"] == 1 for r in greedy)
    assert len(greedy[0]["outputs"][0]) == 12
    # more candidates on the same text: the target's mass on them cannot fall
    assert greedy[1]["topk_mass"] >= greedy[0]["topk_mass"] - 1e-6
    assert "| 1 | 32 |" in markdown_table(res)
