"""Acceptance metrics: RunStats' speculation counters, recounted independently from each step's
outcome, and the Prometheus file (parsed back strictly) equal to them: fixed blocks, adaptive
block sizes, target-only runs, the API and the CLI, bad paths."""

from __future__ import annotations

import json
import math
import re

import pytest

import dflash2rt
from dflash2rt import get_backend
from dflash2rt.cli import main
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.engine.policy.adaptive import AdaptivePolicy
from dflash2rt.engine.policy.schedule import AdaptiveSchedule
from dflash2rt.engine.stats import RunStats
from dflash2rt.errors import InvalidInputError
from dflash2rt.metrics import prometheus_text, write_metrics

from tiny_models import oracle_pair, tiny_pair

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SAMPLE = re.compile(rf"^({NAME})(?:\{{(.*)\}})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')


def parse(text: str) -> dict[str, dict]:
    """Prometheus text → {name: {"type", "help", "samples": {labels tuple: value}}}, checking
    the grammar: HELP, then TYPE, then that family's samples; counters named ``_total``."""
    assert text.endswith("\n")
    fams: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, help_ = line[7:].split(" ", 1)
            assert re.fullmatch(NAME, name) and name not in fams and help_
            current = fams[name] = {"help": help_, "type": None, "samples": {}}
        elif line.startswith("# TYPE "):
            name, kind = line[7:].split(" ")
            assert current is fams[name] and current["type"] is None
            assert kind in ("counter", "gauge") and (kind != "counter") ^ name.endswith("_total")
            current["type"] = kind
        else:
            m = SAMPLE.match(line)
            assert m and current is fams.get(m.group(1)) and current["type"], line
            labels, rest = [], m.group(2) or ""
            while rest:
                lm = LABEL.match(rest)
                assert lm, line
                labels.append((lm.group(1), lm.group(2)))
                rest = rest[lm.end():]
            key = tuple(sorted(labels))
            assert key not in current["samples"]
            current["samples"][key] = float(m.group(3))
    return fams


def values(fams: dict, name: str, **labels) -> dict[int | None, float]:
    """A family's samples (with ``labels``) by position (None: no position label)."""
    out = {}
    for key, v in fams["dflash2rt:" + name]["samples"].items():
        d = dict(key)
        pos = d.pop("position", None)
        assert d == labels
        out[None if pos is None else int(pos)] = v
    return out


def assert_file_equals_stats(text: str, s: RunStats, **labels) -> None:
    fams = parse(text)
    one = lambda name: values(fams, name, **labels)[None]             # noqa: E731
    per_pos = lambda name: [v for _, v in sorted(values(fams, name, **labels).items())]  # noqa: E731
    assert one("spec_decode_num_drafts_total") == s.num_drafts
    assert one("spec_decode_num_draft_tokens_total") == s.num_draft_tokens
    assert one("spec_decode_num_accepted_tokens_total") == s.num_accepted_tokens
    assert one("generation_tokens_total") == s.generated
    assert per_pos("spec_decode_num_accepted_tokens_per_pos_total") == s.accepted_per_pos
    assert per_pos("spec_decode_num_reached_tokens_per_pos_total") == s.reached_per_pos
    assert one("spec_decode_mean_acceptance_length") == s.mean_acceptance_length
    assert one("spec_decode_acceptance_rate") == s.acceptance_rate
    assert per_pos("spec_decode_acceptance_rate_per_pos") == s.acceptance_rate_per_pos
    assert per_pos("spec_decode_conditional_acceptance_rate_per_pos") == \
        s.conditional_acceptance_rate_per_pos


class Recorder:
    """Every step outcome the engine records (accepted per row, block), for recounting."""

    def __init__(self, monkeypatch):
        self.steps: list[tuple[list[int], int]] = []
        real = RunStats.record_accepts

        def spy(stats, accepted, block):
            self.steps.append((list(accepted), block))
            return real(stats, accepted, block)
        monkeypatch.setattr(RunStats, "record_accepts", spy)

    def recount(self, positions: int) -> dict:
        drafts = [(a, b - 1) for acc, b in self.steps if b >= 2 for a in acc]
        return {"num_drafts": len(drafts), "num_draft_tokens": sum(g for _, g in drafts),
                "num_accepted_tokens": sum(a for a, _ in drafts),
                "accepted_per_pos": [sum(a > i for a, _ in drafts) for i in range(positions)],
                "reached_per_pos": [sum(a >= i and g > i for a, g in drafts)
                                    for i in range(positions)]}


def _reqs(prompts, n_new, **kw):
    return [Request(p, SamplingParams(max_new_tokens=n_new, ignore_eos=True, **kw), key=i)
            for i, p in enumerate(prompts)]


PROMPTS = [(1, 2, 3), (5, 9, 11, 13), (7,)]


@pytest.mark.parametrize("pair_kind, temperature", [("random", 1.0), ("oracle", 1.0)])
def test_fixed_block_counts_match_the_histogram_and_the_file(monkeypatch, pair_kind,
                                                              temperature):
    pair = tiny_pair("dflash2", block=4, seed=3) if pair_kind == "random" else oracle_pair(4)
    rec = Recorder(monkeypatch)
    _, s = Engine(pair, get_backend("cpu")).generate(
        _reqs(PROMPTS, 20, temperature=temperature, seed=2), block_size=4)
    assert {k: getattr(s, k) for k in rec.recount(3)} == rec.recount(3)
    h = s.accept_hist + [0] * (4 - len(s.accept_hist))
    assert s.num_drafts == s.request_steps == sum(h) and s.num_draft_tokens == 3 * sum(h)
    assert s.accepted_per_pos == [sum(h[i + 1:]) for i in range(3)]     # P(a > i)
    assert s.reached_per_pos == [sum(h[i:]) for i in range(3)]          # P(a >= i)
    assert s.num_accepted_tokens == sum(a * n for a, n in enumerate(h))
    assert math.isclose(s.mean_acceptance_length, s.tau)               # fixed block: τ
    assert 0 < s.num_accepted_tokens < s.num_draft_tokens              # partial acceptance
    rates = s.acceptance_rate_per_pos
    assert all(0 <= r <= 1 for r in rates) and rates[0] == s.accepted_per_pos[0] / s.num_drafts
    assert_file_equals_stats(prometheus_text(s), s)
    assert s.as_dict()["acceptance_rate_per_pos"] == rates


class Cycling(AdaptiveSchedule):
    """An adaptive schedule that cycles through given block sizes (1: target-only steps)."""

    def __init__(self, cycle):
        super().__init__((1, 2, 4, 8), {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0})
        self.cycle, self.n = cycle, 0

    def choose(self, rows, remaining=None):
        self.n += 1
        return self.cycle[(self.n - 1) % len(self.cycle)]


def test_adaptive_block_sizes_count_each_step_by_its_own_block(monkeypatch):
    """Positions a step's block lacks are neither drafted nor reached; target-only steps are
    not drafts; calibration steps of the measured schedule are not counted."""
    pair = oracle_pair(8)
    engine = Engine(pair, get_backend("cpu"))
    engine.policy = AdaptivePolicy.of(Cycling((8, 1, 2, 4, 1, 1, 8, 2)))
    rec = Recorder(monkeypatch)
    _, s = engine.generate(_reqs(PROMPTS, 40, temperature=1.0, seed=4))
    assert s.adaptive and set(s.block_sizes) == {1, 2, 4, 8}
    assert len(s.accepted_per_pos) == 7
    assert {k: getattr(s, k) for k in rec.recount(7)} == rec.recount(7)
    rows = {b: sum(len(acc) for acc, bb in rec.steps if bb == b) for b in (1, 2, 4, 8)}
    assert s.num_drafts == rows[2] + rows[4] + rows[8] == s.request_steps - rows[1]
    assert s.num_draft_tokens == rows[2] + 3 * rows[4] + 7 * rows[8]
    assert s.reached_per_pos[3] <= rows[8] < s.reached_per_pos[0]     # only block 8 has 3..6
    assert sum(s.accepted_per_pos) == s.num_accepted_tokens
    assert 0 < s.num_accepted_tokens < s.num_draft_tokens
    assert_file_equals_stats(prometheus_text(s, {"model_name": "oracle"}), s,
                             model_name="oracle")
    rec.steps.clear()
    measured = Engine(tiny_pair("dflash2", block=4, seed=1), get_backend("cpu"))
    _, m = measured.generate(_reqs(PROMPTS[:2], 12, temperature=0.8, seed=5))
    # A measured schedule chooses from this machine's timings: assert only what holds
    # whatever it chose (a call planned target-only included).
    assert m.calibration_steps > 0 and len(rec.steps) == m.steps       # calibration: unrecorded
    assert sum(m.block_sizes.values()) == m.steps
    positions = len(m.accepted_per_pos)
    assert positions == (0 if m.call_plan else 7) == len(m.reached_per_pos)  # candidates ≤ 8
    assert {k: getattr(m, k) for k in rec.recount(positions)} == rec.recount(positions)
    chosen = max(m.block_sizes) - 1                 # positions past the largest block chosen
    assert m.accepted_per_pos[chosen:] == m.reached_per_pos[chosen:] == [0] * (positions - chosen)


def test_target_only_run_writes_zeros(tmp_path):
    res = dflash2rt.run(oracle_pair(4), "cpu", prompts=[[1, 2]], max_new_tokens=6, spec=False,
                        metrics=tmp_path / "m.prom")
    s = res.stats
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (0, 0, 0)
    assert s.accepted_per_pos == [] and s.mean_acceptance_length == 0.0
    text = (tmp_path / "m.prom").read_text()
    fams = parse(text)
    for name, fam in fams.items():
        for v in fam["samples"].values():
            assert v == (6 if name == "dflash2rt:generation_tokens_total" else 0), name
    assert fams["dflash2rt:spec_decode_num_accepted_tokens_per_pos_total"]["samples"] == {}
    assert_file_equals_stats(text, s, backend="cpu")


def test_api_writes_the_run_stats(tmp_path):
    path = tmp_path / "run.prom"
    res = dflash2rt.run(oracle_pair(4), "cpu", prompts=[[1, 2], [3]], max_new_tokens=9,
                        temperature=1.0, seed=3, block_size=4, metrics=str(path))
    assert res.stats.num_drafts > 0
    assert_file_equals_stats(path.read_text(), res.stats, backend="cpu")
    assert not list(tmp_path.glob(".*tmp"))                            # renamed into place


@pytest.mark.parametrize("bad", ["dir", "missing/m.prom", "", 5])
def test_bad_metrics_paths_fail_before_decoding(tmp_path, monkeypatch, bad):
    path = {"dir": tmp_path, "missing/m.prom": tmp_path / "missing" / "m.prom"}.get(bad, bad)
    monkeypatch.setattr(Engine, "generate", lambda *a, **k: pytest.fail("decoded"))
    with pytest.raises(InvalidInputError, match="metrics"):
        dflash2rt.run(oracle_pair(4), "cpu", prompts=[[1]], max_new_tokens=2, metrics=path)


def test_unwritable_metrics_file_is_a_typed_error(tmp_path, monkeypatch):
    s = RunStats("spec", "cpu", "cpu", 4)
    monkeypatch.setattr("pathlib.Path.write_text",
                        lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "denied")))
    with pytest.raises(InvalidInputError, match="cannot write metrics file.*denied"):
        write_metrics(s, tmp_path / "m.prom")
    with pytest.raises(InvalidInputError, match="RunStats"):
        prometheus_text({"num_drafts": 1})
    with pytest.raises(InvalidInputError, match="label"):
        prometheus_text(s, {"position": "1"})


def test_label_values_are_escaped():
    s = RunStats("spec", "cpu", "cpu", 3)
    s.record_accepts([2, 0, 1], 3)
    fams = parse(prometheus_text(s, {"model_name": 'a"b\\c\nd'}))
    key = (("model_name", 'a\\"b\\\\c\\nd'), ("position", "1"))
    assert fams["dflash2rt:spec_decode_num_reached_tokens_per_pos_total"]["samples"][key] == 2


def test_cli_writes_metrics_and_shows_them(tmp_path, capsys):
    path = tmp_path / "cli.prom"
    args = ["run", "--backend", "cpu", "--model", "stdlib-code", "--prompt", "def f(x):",
            "--max-new-tokens", "12", "--block-size", "4", "--metrics", str(path)]
    assert main([*args, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    s = RunStats(**{k: v for k, v in stats.items() if k in RunStats.__dataclass_fields__})
    assert s.num_drafts > 0 and s.accepted_per_pos == stats["accepted_per_pos"]
    assert s.mean_acceptance_length == stats["mean_acceptance_length"]
    assert_file_equals_stats(path.read_text(), s, model_name="stdlib-code", backend="cpu")
    assert main(args) == 0
    err = capsys.readouterr().err
    assert re.search(r"\d+ drafts, \d+/\d+ draft tokens accepted, mean acceptance length "
                     r"[\d.]+, per position \[[\d. ]+\]", err), err
    rc = main([*args[:-1], str(tmp_path / "nope" / "m.prom")])
    assert rc == 2 and "InvalidInputError" in capsys.readouterr().err


def test_every_metric_of_a_scripted_run_computed_by_hand():
    """Six request-steps written out (block 4 twice, block 2, two target-only, block 8) and
    every number worked out by hand, with vLLM's definitions where the name is vLLM's
    (vllm/v1/spec_decode/metrics.py: per-position rate = accepted_per_pos / drafts)."""
    s = RunStats("spec", "cpu", "cpu", 8)
    for accepted, block in (([3, 0], 4), ([1], 2), ([0, 0], 1), ([7], 8)):
        s.record_accepts(accepted, block)
    s.generated = 17
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (4, 14, 11)
    assert s.accepted_per_pos == [3, 2, 2, 1, 1, 1, 1]
    assert s.reached_per_pos == [4, 2, 2, 1, 1, 1, 1]
    assert s.accept_hist == [3, 1, 0, 1, 0, 0, 0, 1] and s.request_steps == 6
    assert s.block_sizes == {4: 1, 2: 1, 1: 1, 8: 1}
    assert s.committed == 17 and math.isclose(s.tau, 17 / 6)
    assert s.mean_acceptance_length == 3.75 and s.acceptance_rate == 11 / 14
    assert s.acceptance_rate_per_pos == [0.75, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25]
    assert s.conditional_acceptance_rate_per_pos == [0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    fams = parse(prometheus_text(s, {"model_name": "m"}))
    v = lambda name: values(fams, name, model_name="m")                # noqa: E731
    assert v("spec_decode_num_drafts_total") == {None: 4}
    assert v("spec_decode_num_draft_tokens_total") == {None: 14}
    assert v("spec_decode_num_accepted_tokens_total") == {None: 11}
    assert v("generation_tokens_total") == {None: 17}
    assert v("spec_decode_num_accepted_tokens_per_pos_total") == dict(enumerate([3, 2, 2, 1, 1,
                                                                                1, 1]))
    assert v("spec_decode_num_reached_tokens_per_pos_total") == dict(enumerate([4, 2, 2, 1, 1,
                                                                               1, 1]))
    assert v("spec_decode_mean_acceptance_length") == {None: 3.75}
    assert v("spec_decode_acceptance_rate") == {None: 11 / 14}
    assert v("spec_decode_acceptance_rate_per_pos") == dict(enumerate(
        [0.75, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25]))
    assert v("spec_decode_conditional_acceptance_rate_per_pos") == dict(enumerate(
        [0.75] + [1.0] * 6))


@pytest.mark.parametrize("name", ["modèle", "名前", "a-b", "1x", "a b", "__x", "position", ""])
def test_label_names_follow_the_prometheus_grammar(name):
    s = RunStats("spec", "cpu", "cpu", 4)
    with pytest.raises(InvalidInputError, match=r"\[a-zA-Z_\]"):
        prometheus_text(s, {name: "v"})
    assert "model_name_2" in prometheus_text(s, {"model_name_2": "ünïcode value ok"})
