"""``dflash2rt bench ablation``: its structure on a tiny pair with ``--quick`` (every contender
at every temperature × batch, × target-only paired with target-only of the same row, each
adaptive contender built with its ``without`` on a fresh table). Nothing here reads a timing's
value: only that it was measured and how ratios are formed."""

from __future__ import annotations

import collections
import json
import statistics

import pytest
import torch

from dflash2rt.bench import ablation
from dflash2rt.bench.measure import TARGET_ONLY, TEMPERATURES
from dflash2rt.cli import main
from dflash2rt.engine.policy.adaptive import AdaptivePolicy
from dflash2rt.engine.policy.schedule import ABLATIONS

from tiny_models import save_pair_dir, tiny_pair


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = save_pair_dir(tmp_path_factory.mktemp("ablation") / "model",
                         tiny_pair(dtype=torch.float32))
    (root / "heldout_prompts.json").write_text(json.dumps(["def f(x):", "import os", "x = 1"]))
    return root


def test_the_contenders_switch_off_every_mechanism_once():
    assert set(ablation.MECHANISMS) == ABLATIONS and len(ablation.MECHANISMS) == len(ABLATIONS)
    specs = ablation.contender_specs((4, 8))
    assert [s.name for s in specs] == [
        TARGET_ONLY, "adaptive", *(f"without_{m}" for m in ablation.MECHANISMS),
        "block_4", "block_8"]
    assert [s.without for s in specs if s.without is not None] == [
        frozenset(), *(frozenset({m}) for m in ablation.MECHANISMS)]
    assert [(s.spec, s.block) for s in specs if s.without is None] == [
        (False, None), (True, 4), (True, 8)]


def test_batch_prompts_cycle_to_fill_a_batch():
    p = [(1,), (2,), (3,)]
    assert ablation.batch_prompts(p, 1, 2) == [(1,), (2,)]
    assert ablation.batch_prompts(p, 4, 2) == [(1,), (2,), (3,), (1,)]


def test_quick_ablation_command_on_a_tiny_pair(model_dir, tmp_path, monkeypatch, capsys):
    built: list[AdaptivePolicy] = []

    class Spy(AdaptivePolicy):
        """AdaptivePolicy, recording each one built and how many calls it began."""

        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.begun = 0
            built.append(self)

        def begin(self, requests):
            self.begun += 1
            return super().begin(requests)

    monkeypatch.setattr(ablation, "AdaptivePolicy", Spy)
    out = tmp_path / "ablation.json"
    assert main(["bench", "ablation", "--quick", "--model", str(model_dir), "--backend", "cpu",
                 "--repeats", "2", "--temperatures", "0,1", "--batches", "1,3",
                 "--json-out", str(out)]) == 0
    res = json.loads(out.read_text())
    names = [c["name"] for c in res["contenders"]]
    assert res["quick"] and res["max_new_tokens"] == ablation.QUICK["max_new_tokens"]
    assert [(r["temperature"], r["batch"]) for r in res["rows"]] == [
        (t.label, b) for b in (1, 3) for t in (TEMPERATURES[0], TEMPERATURES[2])]
    for r in res["rows"]:
        assert list(r["contenders"]) == names
        base = r["contenders"][TARGET_ONLY]
        assert len(base["rounds_tokens_per_s"]) == 2
        for name, c in r["contenders"].items():
            assert c["tokens_per_s"] > 0
            # × target-only: the rounds paired with target-only's rounds of this very row
            assert c["speedup_vs_target_only"] == pytest.approx(statistics.median(
                a / b for a, b in zip(c["rounds_tokens_per_s"], base["rounds_tokens_per_s"])))
            if name.startswith("without_"):
                assert c["without"] == [name.removeprefix("without_")]
            elif name == "adaptive":
                assert c["without"] == []
            else:
                assert "without" not in c
        assert r["contenders"]["block_8"]["block_size"] == 8
        assert r["tokens"] == ablation.QUICK["max_new_tokens"] * r["prompts"]
        assert r["prompts"] == (1 if r["batch"] == 1 else 3)
        assert (r["greedy_equal"] is None) == (r["temperature_value"] > 0)
    assert res["greedy_equal_all"] is True
    # one policy per adaptive contender × temperature × batch, each with its switch, each on
    # its own table, each the one its engine decoded with (warm-up + 2 timed calls)
    rows = len(res["rows"])
    assert collections.Counter(p.without for p in built) == {
        frozenset(): rows, **{frozenset({m}): rows for m in ABLATIONS}}
    assert len({id(p.table) for p in built}) == len(built)
    assert all(p.begun == 3 for p in built)
    text = capsys.readouterr().out
    for c in res["contenders"]:
        assert c["title"] in text
    assert "T=1, b3" in text


def test_step_profile_refuses_a_backend_without_graphs(capsys):
    assert main(["bench", "step-profile", "--backend", "cpu"]) == 1
    assert "captures no graphs" in capsys.readouterr().err


def test_mixed_lengths_end_a_batch_s_rows_at_different_steps(model_dir, tmp_path):
    assert [ablation.mixed_length(8, i) for i in range(6)] == [2, 4, 6, 8, 2, 4]
    assert [ablation.mixed_length(2, i) for i in range(4)] == [1, 1, 1, 2]
    out = tmp_path / "mixed.json"
    assert main(["bench", "ablation", "--quick", "--mixed-lengths", "--model", str(model_dir),
                 "--backend", "cpu", "--temperatures", "0", "--batches", "3",
                 "--json-out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["mixed_lengths"] is True and "mod 4" in res["requests"]
    (row,) = res["rows"]
    assert row["tokens"] == sum(ablation.mixed_length(ablation.QUICK["max_new_tokens"], i)
                                for i in range(3))
    assert row["greedy_equal"] is True
