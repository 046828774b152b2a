"""``train.heldout`` against its definitions: ``per_slot`` from accept histograms counted by
hand, and ``evaluate_heldout`` with ``measure`` replaced by a recorder: the three recipe
settings in order, what each is measured with, and every logged line written out by hand."""

from __future__ import annotations

import pytest

from dflash2rt.train import heldout


@pytest.mark.parametrize("hist, block, want", [
    ([0, 0, 3], 3, [1.0, 1.0]),                     # every step accepted both drafts
    ([5, 0, 0, 0], 4, [0.0, 0.0, 0.0]),             # none accepted: slot 1 reached, never won
    ([], 3, [0.0, 0.0]),                            # no step at all
    ([1, 1, 2], 3, [3 / 4, 2 / 3]),
    ([6, 0, 2], 5, [2 / 8, 1.0, 0.0, 0.0]),         # padded to the block; slot 3 unreached
    ((4, 4), 2, [4 / 8]),
])
def test_per_slot_is_reached_and_won_over_reached(hist, block, want):
    assert heldout.per_slot(hist, block) == pytest.approx(want, rel=1e-15)


SETTINGS = [("eval_greedy", 0.0, 1.0), ("eval_t07_p095", 0.7, 0.95), ("eval_t1", 1.0, 1.0)]


def test_evaluate_heldout_measures_each_setting_and_logs_it(monkeypatch):
    calls, lines = [], []

    def measure(pair, backend, prompts, new_tokens, temp, baseline=True, top_p=1.0):
        calls.append((pair, backend, prompts, new_tokens, temp, baseline, top_p))
        r = {"tau": 2.0 + temp, "block_size": 4, "steps_per_block": {4: 7},
             "accept_hist": [1, 2, 0, 4], "topk_mass": 0.5 + temp / 10}
        if baseline:
            r["greedy_mismatches"] = [2]
        return r

    monkeypatch.setattr(heldout, "measure", measure)
    out = heldout.evaluate_heldout("PAIR", "cpu", [[1, 2]], 16, log=lines.append)
    assert calls == [("PAIR", "cpu", [[1, 2]], 16, t, t == 0.0, p) for _, t, p in SETTINGS]
    assert list(out) == [k for k, _, _ in SETTINGS]
    for key, temp, _ in SETTINGS:
        assert out[key]["per_slot_acceptance"] == [6 / 7, 4 / 6, 1.0]
        assert out[key]["tau"] == 2.0 + temp
    assert lines == [
        "T=0 top-p 1: tau 2.000 at block 4 (steps per block {4: 7}), top-K mass 0.500, "
        "greedy mismatches [2]; per slot 0.857 0.667 1.000",
        "T=0.7 top-p 0.95: tau 2.700 at block 4 (steps per block {4: 7}), top-K mass 0.570; "
        "per slot 0.857 0.667 1.000",
        "T=1 top-p 1: tau 3.000 at block 4 (steps per block {4: 7}), top-K mass 0.600; "
        "per slot 0.857 0.667 1.000",
    ]
