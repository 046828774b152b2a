"""``dflash2rt qualify``'s run with every measuring part stood in for (the conformance suite,
micro-benchmarks, graphs, end-to-end rows, block sweep, model and engine) and a scripted
clock: the arguments each section gets in quick and full mode, the order and status of the
sections, an error or an interrupt in one of them, the report saved after each, the fallbacks
gathered, the recommended block size and the defaults of ``qualify``."""

from __future__ import annotations

import json
import types

import pytest

from dflash2rt import bundled
from dflash2rt.qualify import run as qrun
from fake_clock import Clock

NS = types.SimpleNamespace
STANDING = ("standing: attention in torch",)


def _pair(conv_kernel_size: int = 3, conv_group_size: int = 16) -> NS:
    arch = NS(hidden_size=64, vocab_size=100)
    return NS(draft=NS(cfg=NS(arch=arch, block_size=8, conv_kernel_size=conv_kernel_size,
                              conv_groups=4, conv_group_size=conv_group_size,
                              selector_top_k=5, selector_rank=2)))


class _Engine:
    def __init__(self, pair, backend) -> None:
        self.pair, self.backend, self.closed = pair, backend, False

    def close(self) -> None:
        self.closed = True


class Stage:
    """Every part ``Qualification.run`` calls, each recording its arguments; ``clock`` moves
    one second at each reading."""

    def __init__(self, monkeypatch, graph_adapter=None, pair=None, fail: dict | None = None):
        self.calls: dict[str, tuple] = {}
        self.fail = fail or {}
        self.logs: list[str] = []
        self.engines: list[_Engine] = []
        self.pair = pair or _pair()
        self.backend = NS(name="fake", device="cpu", graph_adapter=graph_adapter,
                          standing_fallbacks=STANDING)
        self.clock = Clock(now=100.0, tick=1.0).install(monkeypatch, qrun)
        reg = NS(select=lambda name: NS(backend=self.backend))
        monkeypatch.setattr(qrun, "Registry", NS(discover=lambda: reg))
        monkeypatch.setattr(qrun, "system", NS(describe=lambda r, name: {
            "device": "fake device", "graphs": "none here"}))
        monkeypatch.setattr(bundled, "model_dir", lambda m: f"/models/{m}")
        monkeypatch.setattr(qrun, "resolve_model", self._rec("resolve_model", self.pair))
        monkeypatch.setattr(qrun, "Engine", self._engine)
        monkeypatch.setattr(qrun, "heldout_prompts", self._rec(
            "heldout_prompts", [f"p{i}" for i in range(10)]))
        monkeypatch.setattr(qrun, "run_conformance", self._rec(
            "conformance", {"status": "pass", "result": "pass", "levels": {}}))
        monkeypatch.setattr(qrun, "op_benchmarks", self._rec("op_benchmarks", [{"op": "c"}]))
        monkeypatch.setattr(qrun, "graph_vs_eager", self._graph_vs_eager)
        monkeypatch.setattr(qrun, "requests", lambda prompts, new: ("requests", prompts, new))
        monkeypatch.setattr(qrun, "warm_caches", self._rec("warm_caches", 0.5))
        monkeypatch.setattr(qrun, "measure_rows", self._rec("measure_rows", {
            "compare": {1: {"tau": 2.0, "fallbacks": ["e2e: x"]}, 4: {"tau": 3.0}},
            "rows": [{"batch": 1}], "step_profile": {"rows": []}}))
        monkeypatch.setattr(qrun, "block_sweep", self._rec("block_sweep", [
            {"block_size": 2, "speedup_vs_target_only": 1.5},
            {"block_size": 4, "speedup_vs_target_only": 2.25},
            {"block_size": 8, "speedup_vs_target_only": 2.25},
            {"block_size": 16, "speedup_vs_target_only": 0.5}]))

    def _rec(self, name: str, value):
        def f(*args, **kw):
            self.calls[name] = (args, kw)
            if name in self.fail:
                raise self.fail[name]
            return value
        return f

    def _engine(self, pair, backend) -> _Engine:
        self.engines.append(_Engine(pair, backend))
        return self.engines[-1]

    def _graph_vs_eager(self, pair, backend, make):
        self.calls["graph_vs_eager"] = ((pair, backend, make()), {})
        return {"graph_step_ms": 1.5, "graph_capture_ms": 30.0, "graph_recapture_ms": 2.0,
                "eager_step_ms": 3.0, "equal": True, "other": "left out",
                "graph_fallbacks": ["g1", "both"], "eager_fallbacks": ["both", "e1"]}

    def run(self, tmp_path, quick: bool, **kw) -> dict:
        q = qrun.Qualification("fake", tmp_path, "tiny", quick, self.logs.append, **kw)
        return q.run()


@pytest.mark.parametrize("quick", [True, False])
def test_each_section_gets_the_arguments_of_its_mode(monkeypatch, tmp_path, quick):
    st = Stage(monkeypatch)
    st.run(tmp_path, quick, conformance_select="L2", conformance_small=True,
           allow_fallback=True)
    prompts = [f"p{i}" for i in range(10)]
    (engine,) = st.engines
    assert engine.pair is st.pair and engine.backend is st.backend and engine.closed
    assert st.calls["resolve_model"] == (("/models/tiny", "cpu"), {})
    assert st.calls["heldout_prompts"] == (("/models/tiny", st.pair), {})
    assert st.calls["conformance"] == (("fake", tmp_path, quick, "L2", True),
                                       {"allow_fallback": True})
    shapes = {"hidden": 64, "vocab": 100, "block": 8, "taps": 3, "groups": 4, "top_k": 5,
              "rank": 2}
    assert st.calls["op_benchmarks"] == ((st.backend, shapes, (1,) if quick else (1, 8),
                                          "fake device", 3 if quick else 10), {})
    new = 16 if quick else 64
    assert st.calls["warm_caches"] == ((engine, prompts[:4], new, 8), {})
    args, kw = st.calls["measure_rows"]
    assert args == (engine, {1: prompts[:1], 4: prompts[:4]}, new, 8, 1, None,
                    qrun.TEMPERATURES, ("fixed",) if quick else ("target_only", "fixed",
                                                                 "adaptive"))
    assert kw == {"log": st.logs.append}
    n_p, new, blocks = (2, 32, (2, 4, 8)) if quick else (8, 64, (2, 4, 8, 16))
    assert st.calls["block_sweep"] == ((prompts[:n_p], engine, new, blocks, 1,
                                        st.logs.append), {})


def test_the_conformance_options_default_to_off(monkeypatch, tmp_path):
    st = Stage(monkeypatch)
    qrun.Qualification("fake", tmp_path, "tiny", True, st.logs.append).run()
    assert st.calls["conformance"] == (("fake", tmp_path, True, None, False),
                                       {"allow_fallback": False})


def test_the_report_of_a_finished_run(monkeypatch, tmp_path):
    st = Stage(monkeypatch)
    tmp_path = tmp_path / "not" / "yet"                     # made, with its parents
    r = st.run(tmp_path, True)
    assert list(r["sections"]) == ["conformance", "op_microbench", "graphs", "end_to_end",
                                   "block_sweep"]
    assert [(s["status"], s["seconds"]) for s in r["sections"].values()] == \
        [("pass", 1.0)] + [("done", 1.0)] * 4          # the suite's own status stays
    assert r["sections"]["op_microbench"]["rows"] == [{"op": "c"}]
    assert r["sections"]["graphs"] == {
        "status": "done", "seconds": 1.0, "applicable": False,
        "reason": "backend fake captures no graphs (none here)"}
    e2e = r["sections"]["end_to_end"]
    assert (e2e["batch1"]["tau"], e2e["batch4"]["tau"], e2e["rows"], e2e["step_profile"],
            e2e["cache_sizing_capture_s"]) == (2.0, 3.0, [{"batch": 1}], {"rows": []}, 0.5)
    sweep = r["sections"]["block_sweep"]
    assert sweep["recommended_block_size"] == 4          # the first of two equal best
    assert sweep["fit"] == "speedup = tau * T_target / (T_draft + T_verify)"
    assert r["fallbacks"] == ["standing: attention in torch", "e2e: x"]
    assert r["known_deviations"] == qrun.KNOWN_DEVIATIONS
    assert r["complete"] is True and r["verdict"] == {"result": "pass", "reasons": []}
    assert (r["schema"], r["backend"], r["quick"], r["model"]) == (
        "dflash2rt-qualify/1", "fake", True, "tiny")
    text = (tmp_path / "report.json").read_text(encoding="utf-8")
    assert text == json.dumps(r, indent=2, default=str)
    saved = json.loads(text)
    assert saved["elapsed_s"] == r["elapsed_s"] > 0
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert 'class="big pass">PASS<' in page and "INCOMPLETE" not in page


def test_the_log_and_the_elapsed_seconds_follow_the_clock(monkeypatch, tmp_path):
    """One clock reading a second: start 101; the system save 102; each section logs, starts,
    ends and saves (4 readings); then the last save and the two closing lines."""
    st = Stage(monkeypatch)
    r = st.run(tmp_path, True)
    assert st.logs == ["[1/5] conformance ... (2s)", "[2/5] op_microbench ... (6s)",
                       "[3/5] graphs ... (10s)", "[4/5] end_to_end ... (14s)",
                       "[5/5] block_sweep ... (18s)", "verdict: PASS", f"done in 23s: "
                       f"{tmp_path}/report.html"]
    assert r["elapsed_s"] == 22.0


def test_a_failed_section_is_reported_and_the_others_go_on(monkeypatch, tmp_path):
    st = Stage(monkeypatch, fail={"op_benchmarks": RuntimeError("no <timer>")})
    r = st.run(tmp_path, True)
    assert r["sections"]["op_microbench"] == {"status": "error", "seconds": 1.0,
                                              "error": "RuntimeError: no <timer>"}
    assert r["sections"]["block_sweep"]["status"] == "done" and r["complete"] is True
    assert r["verdict"] == {"result": "fail",
                            "reasons": ["section op_microbench: error RuntimeError: no <timer>"]}
    assert st.logs[-2:-1] == ["verdict: FAIL\n  - section op_microbench: error RuntimeError: "
                              "no <timer>"]


def test_an_interrupt_keeps_the_finished_sections_and_does_not_complete(monkeypatch, tmp_path):
    st = Stage(monkeypatch, fail={"measure_rows": KeyboardInterrupt()})
    r = st.run(tmp_path, True)
    assert list(r["sections"]) == ["conformance", "op_microbench", "graphs", "end_to_end"]
    assert r["sections"]["end_to_end"] == {"status": "interrupted"}
    assert "block_sweep" not in st.calls and st.engines[0].closed
    assert r["complete"] is False and "fallbacks" not in r
    assert r["verdict"]["result"] == "fail"
    assert r["verdict"]["reasons"] == ["section end_to_end: interrupted",
                                       "the qualification did not complete"]
    saved = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert saved["sections"]["end_to_end"] == {"status": "interrupted"}
    assert saved["complete"] is False and saved["verdict"]["result"] == "fail"
    assert st.logs[-1] == "interrupted: report.json / report.html keep the finished sections"


def test_graphs_with_an_adapter_compare_replay_and_eager(monkeypatch, tmp_path):
    st = Stage(monkeypatch, graph_adapter=NS(name="cudagraph"))
    r = st.run(tmp_path, True)
    assert r["sections"]["graphs"] == {
        "status": "done", "seconds": 1.0, "applicable": True, "adapter": "cudagraph",
        "graph_step_ms": 1.5, "graph_capture_ms": 30.0, "graph_recapture_ms": 2.0,
        "eager_step_ms": 3.0, "replay_equals_eager": True, "fallbacks": ["g1", "both", "e1"]}
    (pair, backend, reqs), _ = st.calls["graph_vs_eager"]
    assert (pair, backend, reqs) == (st.pair, st.backend, ("requests", ["p0", "p1"], 32))
    assert r["fallbacks"] == ["standing: attention in torch", "g1", "both", "e1", "e2e: x"]


@pytest.mark.parametrize("kernel, group_size, taps, groups", [(0, 16, 1, 4), (1, 0, 1, 64),
                                                              (5, 0, 5, 64)])
def test_the_micro_benchmark_shapes_from_the_draft(monkeypatch, tmp_path, kernel, group_size,
                                                   taps, groups):
    st = Stage(monkeypatch, pair=_pair(kernel, group_size))
    st.run(tmp_path, True)
    shapes = st.calls["op_benchmarks"][0][1]
    assert (shapes["taps"], shapes["groups"]) == (taps, groups)


def test_run_fallbacks_standing_first_then_each_recorded_once():
    report = {"sections": {
        "a": {"fallbacks": ["x", "y", "x"], "nested": [{"fallbacks": ["z", "y"]}, "fallbacks"]},
        "b": {"fallbacks": {"fallbacks": ["w"]}, "rows": [[{"fallbacks": ["v", 3, None]}]]},
        "c": {"fallbacks": "not a list", "other": ["fallbacks", {"k": {"fallbacks": ["u"]}}]}}}
    assert qrun.run_fallbacks(("s", "x"), report) == ["s", "x", "y", "z", "w", "v", "u"]
    assert qrun.run_fallbacks([], {"fallbacks": ["top"]}) == ["top"]
    assert qrun.run_fallbacks(["s"], {"sections": {}}) == ["s"]


def test_qualify_defaults(monkeypatch, tmp_path, capsys):
    seen = []

    class Fake:
        def __init__(self, *args):
            seen.append(args)

        def run(self):
            seen[-1][4]("said through the default log")
            return {"ok": True}

    monkeypatch.setattr(qrun, "Qualification", Fake)
    assert qrun.qualify("cpu", str(tmp_path), "m") == {"ok": True}
    (args,) = seen
    assert args[:4] == ("cpu", tmp_path, "m", False) and args[5:] == (None, False, False)
    assert capsys.readouterr().err == "said through the default log\n"
    log = []
    qrun.qualify("cpu", tmp_path, "m", True, log.append, "L1", True, True)
    assert seen[1][3:] == (True, log.append, "L1", True, True)
    assert log == ["said through the default log"]


def test_the_verdict_keeps_the_last_300_characters_of_why_conformance_did_not_run():
    why = "a" * 100 + "b" * 300
    v = qrun.verdict({"sections": {"conformance": {"status": "error", "error": why}},
                      "complete": True})
    assert v == {"result": "fail", "reasons": [f"conformance did not run (error): {'b' * 300}"]}
    v = qrun.verdict({"sections": {"conformance": {"status": "fail"}}, "complete": True})
    assert v == {"result": "fail", "reasons": ["conformance: failed"]}
