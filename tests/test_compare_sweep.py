"""``graph_vs_eager`` over scripted engines: which backend each engine runs on, the policy
replica the eager engine decides with, the milliseconds, capture table, replay count, eager
buckets and the equality verdict, all written out here by hand."""

from __future__ import annotations

import types

import pytest

from dflash2rt.engine import compare


class Policy:
    def __init__(self, name):
        self.name = name

    def replica(self):
        return Policy(f"replica of {self.name}")


def _stats(step_s, capture_s, graphs, fallbacks=()):
    return types.SimpleNamespace(step_s=step_s, capture_s=capture_s, graphs=graphs,
                                 fallbacks=list(fallbacks))


GRAPHS_FIRST = {"draft": {4: {"capture_ms": 2.5, "replays": 0, "eager": 0, "refused": ""},
                          8: {"capture_ms": 0, "replays": 0, "eager": 0, "refused": ""}},
                "verify": {4: {"replays": 0, "eager": 0, "refused": ""}}}
GRAPHS_SECOND = {"draft": {4: {"replays": 3, "eager": 0, "refused": ""},
                           8: {"replays": 0, "eager": 2, "refused": "differed"}},
                 "verify": {4: {"replays": 5, "eager": 0, "refused": ""}}}


class Script:
    """Engine stand-in: the graph backend's engine returns ``graph_tokens``, the eager twin's
    ``eager_tokens``; an engine without a policy makes one (as an adaptive run does)."""

    def __init__(self, graph_tokens, eager_tokens, makes_policy=True):
        self.tokens = {"graph": graph_tokens, "eager": eager_tokens}
        self.makes_policy, self.log = makes_policy, []

    def __call__(self, pair, be):
        script = self
        kind = "graph" if be.graph_adapter is not None else "eager"

        class Eng:
            policy = "unset"

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def generate(self, reqs, spec, watermark):
                n = sum(1 for k, *_ in script.log if k == kind)
                script.log.append((kind, pair, be, self.policy, list(reqs), spec, watermark))
                if self.policy is None and script.makes_policy:
                    self.policy = Policy(kind)
                outs = [types.SimpleNamespace(token_ids=t) for t in script.tokens[kind]]
                if kind == "graph":
                    stats = (_stats(0.5, 0.25, GRAPHS_FIRST) if n == 0
                             else _stats(0.002, 0.0, GRAPHS_SECOND, ["fb"]))
                else:
                    stats = _stats(0.25, 0.125, {}) if n == 0 else _stats(0.004, 0.003, {})
                return outs, stats

        return Eng()


def _backend():
    return types.SimpleNamespace(name="gpu", graph_adapter="adapter", device="dev")


def test_eager_twin_is_a_copy_without_graphs():
    be = _backend()
    twin = compare.eager_twin(be)
    assert twin is not be and twin.graph_adapter is None and be.graph_adapter == "adapter"
    assert (twin.name, twin.device) == ("gpu", "dev")


def test_the_row(monkeypatch):
    script = Script([[1, 2], [3]], [[1, 2], [3]])
    monkeypatch.setattr(compare, "Engine", script)
    be = _backend()
    n = iter(range(100))
    row = compare.graph_vs_eager("PAIR", be, lambda: [next(n)])
    assert row == {
        "mode": "spec",
        "graph_step_ms": 2.0, "graph_capture_ms": 250.0, "graph_recapture_ms": 0.0,
        "graph_fallbacks": ["fb"], "graph_captures_ms": {"draft": {4: 2.5}, "verify": {}},
        "eager_step_ms": 4.0, "eager_capture_ms": 125.0, "eager_recapture_ms": 3.0,
        "eager_fallbacks": [],
        "graph_replays": 8, "graph_eager_buckets": ["draft @8: differed"], "equal": True}
    kinds = [(k, p, b is be, reqs, spec, wm) for k, p, b, _, reqs, spec, wm in script.log]
    assert kinds == [("graph", "PAIR", True, [0], True, None),
                     ("graph", "PAIR", True, [1], True, None),
                     ("eager", "PAIR", False, [2], True, None),
                     ("eager", "PAIR", False, [3], True, None)]
    # the graph engine starts without a policy; the eager one with a replica of the policy the
    # graph engine's calls made (the one its second call decided with)
    policies = [p for _, _, _, p, *_ in script.log]
    assert policies[0] is None and policies[1].name == "graph"
    assert policies[2].name == "replica of graph" and policies[3] is policies[2]


def test_different_tokens_are_not_equal_and_target_only_is_named(monkeypatch):
    script = Script([[1, 2]], [[1, 3]], makes_policy=False)
    monkeypatch.setattr(compare, "Engine", script)
    row = compare.graph_vs_eager("PAIR", _backend(), lambda: ["r"], spec=False, watermark="K")
    assert row["equal"] is False and row["mode"] == "target-only"
    assert [(spec, wm) for *_, spec, wm in script.log] == [(False, "K")] * 4
    assert [p for _, _, _, p, *_ in script.log] == [None] * 4


@pytest.mark.parametrize("graph, eager, equal", [
    ([[1]], [[1]], True), ([[1]], [[1], [2]], False), ([[1], [2]], [[2], [1]], False),
])
def test_equal_compares_every_requests_tokens_in_order(monkeypatch, graph, eager, equal):
    monkeypatch.setattr(compare, "Engine", Script(graph, eager))
    assert compare.graph_vs_eager("P", _backend(), lambda: ["r"])["equal"] is equal
