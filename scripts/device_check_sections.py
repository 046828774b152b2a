"""The sections of ``scripts/device_check.py``, each a method of ``Check`` that runs bounded steps
(``device_check_lib.Runner.step`` / ``steps``: several side by side) and turns their reports into
a status, figures and a reason; and the smoke probe the float64-less lane and memcheck run
(``--smoke``). memcheck lives in device_check_memcheck."""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

from device_check_lib import Runner, Section, Step
from device_check_memcheck import memcheck_section
from device_check_probe import INSTALLED, VERSIONS
from device_check_report import (bench_figures, conformance_figures, costs_figures,
                                 graph_replay_figures, load_json, merge_reports,
                                 unexecuted_only)

ROOT = Path(__file__).resolve().parent.parent
DRIVER = str(Path(__file__).with_name("device_check.py"))
SUITES = ROOT / "conformance" / "dflash2rt_conformance" / "suites"
GRAPH_SHARDS = 3                  # graph_check.py processes side by side


# Modules cut into pieces (a -k expression each, within the module) that run in separate
# processes: the long tests apart, l1_ops by dtype.
PIECES = {"test_l1_ops": (("f32", "float32"), ("bf16", "bfloat16"),
                          ("rest", "not float32 and not bfloat16")),
          "test_l4_end_to_end": (("long", "test_sampled_law_of_first_tokens"),
                                 ("rest", "not test_sampled_law_of_first_tokens")),
          "test_l3_procs": (("long", "test_joint_law_with_processors"),
                            ("rest", "not test_joint_law_with_processors"))}


def suite_shards(prefixes: tuple[str, ...] = ("test_",)) -> list[tuple[str, str]]:
    """(tag, -k expression) per piece of the conformance suite's modules whose names start with
    one of ``prefixes`` (the graphs level's excepted: a section of its own), the modules of
    PIECES cut. A level is its modules (each module marks its level)."""
    out = []
    for m in sorted(p.stem for p in SUITES.glob("test_*.py") if p.stem != "test_graphs"):
        if not m.startswith(prefixes):
            continue
        tag = m.removeprefix("test_")
        out += [(f"{tag}-{name}", f"{m} and ({kw})") for name, kw in PIECES[m]] \
            if m in PIECES else [(tag, m)]
    return out


DEFAULT_EXPECT = 12.0             # seconds of a step not in the expected-seconds table


def pack(pieces: list[tuple[str, str]], expect: dict, bins: int) -> list[tuple[float, list]]:
    """The pieces in ``bins`` groups of about equal expected seconds (longest first, each into
    the least loaded group) → (expected seconds, pieces) per group, the longest first."""
    groups: list[tuple[float, list]] = [(0.0, []) for _ in range(max(1, min(bins, len(pieces))))]
    for p in sorted(pieces, key=lambda p: -expect.get(p[0], DEFAULT_EXPECT)):
        i = min(range(len(groups)), key=lambda i: groups[i][0])
        groups[i] = (groups[i][0] + expect.get(p[0], DEFAULT_EXPECT), groups[i][1] + [p])
    return sorted(groups, key=lambda g: -g[0])


def _run_reasons(report: dict) -> list[str]:
    """A report's reasons that are not its levels' (import errors, refused fallbacks, ...)."""
    return [r for r in report.get("reasons", [])
            if not any(r.startswith(f"{lv}: ") for lv in report.get("levels", {}))]


class Check:
    def __init__(self, args, runner: Runner, sizes: dict, expect: dict) -> None:
        self.a, self.r, self.w, self.sizes, self.expect = args, runner, runner.work, sizes, expect
        self.py, self.driver = args.python, DRIVER
        self.system: dict = {}

    def dfl(self, *argv: str) -> list[str]:
        return [self.py, "-m", "dflash2rt", *argv]

    def conformance_step(self, backend: str, tag: str, keyword: str, env: dict | None = None,
                         expect_s: float = 0.0) -> dict:
        """The keyword arguments of one ``dflash2rt conformance`` step writing its reports as
        conformance-<tag>.{json,xml,md}."""
        return {"label": tag, "cmd": self.dfl(
            "conformance", "--backend", backend, "-k", keyword, *self.sizes["conformance"],
            "--json", str(self.w / f"conformance-{tag}.json"),
            "--junit", str(self.w / f"conformance-{tag}.xml"),
            "--markdown", str(self.w / f"conformance-{tag}.md")),
            "cap_s": 600, "env": env, "log": f"conformance-{tag}", "expect_s": expect_s}

    def verdict(self, sec: Section, steps: list[Step], tags: list[str], prefix: str = "") -> None:
        """PASS needs every part's exit 0 and passing report, or a part whose only failure is
        a level none of its tests ran in (all skipped) that other parts executed; the merged
        figures go under ``prefix``."""
        reports = [load_json(self.w / f"conformance-{t}.json") for t in tags]
        got = [r for r in reports if r is not None]
        merged = merge_reports(got) if got else {}
        for st, rep in zip(steps, reports):
            if rep is None:
                sec.fail(f"{self.r.why(st)} (no JSON report)")
            elif st.rc != 0 or rep.get("result") != "pass":
                lv = rep.get("levels", {})
                if all(unexecuted_only(d) or d.get("result") != "fail" for d in lv.values()) \
                        and merged.get("result") == "pass" and not _run_reasons(rep):
                    continue                    # excused: see the merged report's "excused"
                sec.fail(f"{self.r.why(st)}; " + "; ".join(rep.get("reasons", [])[:5]))
        if got:
            for k, v in conformance_figures(merged).items():
                sec.figures[prefix + k] = v
        sec.figures[prefix + "process seconds"] = {t: st.seconds for t, st in zip(tags, steps)}

    def setup(self, sec: Section) -> None:
        plugin = f"backends/{self.a.backend}"
        dists = [".", "conformance"] + ([plugin] if (ROOT / plugin).is_dir() else [])
        st = self.r.step(sec, "installed", [self.py, "-c", INSTALLED, *dists], 30)
        if st.rc == 0:
            sec.figures["install"] = "already installed (editable) from this working tree"
        else:
            st = self.r.step(sec, "install", [
                self.py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                "--no-build-isolation", "--no-index", *(x for d in dists for x in ("-e", d))], 120)
            sec.figures["install"] = (f"installed {', '.join(dists)} (editable, offline)"
                                      if st.rc == 0 else f"FAILED, output in {st.log}")
            if st.rc != 0:
                sec.fail(f"install failed: {self.r.why(st)}")
        if shutil.which("nvidia-smi"):
            st = self.r.step(sec, "nvidia-smi", ["nvidia-smi", "--query-gpu=name,driver_version,"
                                                 "memory.total", "--format=csv,noheader"], 20)
            self.system["gpu"] = self.r.tail(st, 8) if st.rc == 0 else self.r.why(st)
        else:
            self.system["gpu"] = (f"none: nvidia-smi is not on PATH "
                                  f"({platform.machine()} CPU, {os.cpu_count()} cores)")
        st = self.r.step(sec, "versions", [self.py, "-c", VERSIONS], 60)
        self.system["software"] = self.r.tail(st) if st.rc == 0 else self.r.why(st)
        out = self.w / "backends.json"
        st = self.r.step(sec, "backends", self.dfl("backends", "--json"), 120, stdout=out)
        rows = load_json(out)
        if st.rc != 0 or rows is None:
            sec.fail(f"dflash2rt backends --json: {self.r.why(st)}")
            return
        sec.figures["available"] = ", ".join(r["name"] for r in rows if r.get("available"))
        for r in (r for r in rows if r.get("name") == self.a.backend):
            if r.get("available") and not r.get("opt_in"):
                sec.figures[f"{r['name']} runs"] = r.get("implementation")
                sec.figures[f"{r['name']} fallbacks"] = r.get("fallbacks")
            else:
                sec.figures[r["name"]] = r.get("reason") or "opt-in: created by each section"
        self.compile_ahead(sec)

    def compile_ahead(self, sec: Section) -> None:
        """One short sampled run per dtype, side by side: each engine compiles every kernel
        variant it may launch on a thread pool before its first step, into Triton's cache that
        the later processes share (a CPU backend compiles nothing)."""
        specs = [{"label": f"compile-{d}", "cmd": self.dfl(
            "run", "--backend", self.a.backend, "--dtype", d, "--prompt", "def f(x):\n",
            "--max-new-tokens", "4", "--temperature", "1.0", "--json"), "cap_s": 90,
            "stdout": self.w / f"compile-{d}.json", "expect_s": 40}
            for d in ("float32", "bfloat16")]
        for spec, st in zip(specs, self.r.steps(sec, specs)):
            stats = (load_json(spec["stdout"]) or {}).get("stats", {})
            v = stats.get("compile_variants")
            sec.figures[spec["label"]] = (
                f"{sum(v.values()) if isinstance(v, dict) else v} variants {v} in "
                f"{stats.get('compile_s', float('nan')):.1f} s, run exit {st.rc} in {st.seconds} s")
            if st.rc != 0:
                sec.fail(f"{spec['label']}: {self.r.why(st)}")

    def conformance(self, sec: Section) -> None:
        # Ops and L0-L4, one process per suite module side by side (the graphs level runs in
        # its own section: a failed capture must not leave device state that fails others).
        # Two processes per slot: a slot left idle by a short one takes the next.
        groups = pack(suite_shards(), self.expect, 2 * self.r.slots.n)
        specs = [self.conformance_step(self.a.backend, f"part{i}",
                                       " or ".join(f"({kw})" for _, kw in pieces), expect_s=t)
                 for i, (t, pieces) in enumerate(groups)]
        steps = self.r.steps(sec, specs)
        self.verdict(sec, steps, [s["label"] for s in specs])
        sec.figures["parts"] = {f"part{i}": [tag for tag, _ in pieces]
                                for i, (_, pieces) in enumerate(groups)}

    def graphs(self, sec: Section) -> None:
        long = "test_replay_equals_eager_across_buckets"      # its longest test apart
        specs = [self.conformance_step(self.a.backend, f"graphs-{tag}", f"test_graphs and {kw}",
                                       expect_s=self.expect.get(f"graphs-{tag}", DEFAULT_EXPECT))
                 for tag, kw in (("long", long), ("rest", f"not {long}"))]
        steps = self.r.steps(sec, specs)
        data = [load_json(self.w / f"conformance-{s['label']}.json") for s in specs]
        if all(data) and all(st.rc for st in steps):    # no graphs here: every test skipped
            g = [d.get("levels", {}).get("graphs", {}) for d in data]
            if all(x.get("result") == "skipped" and not (x.get("executed") or x.get("errors"))
                   for x in g):
                sec.status = "SKIPPED"
                sec.reason = f"{sum(x['skipped'] for x in g)} tests skipped: {g[0]['note']}"
                return
        self.verdict(sec, steps, [s["label"] for s in specs])

    def graph_replay(self, sec: Section) -> None:
        n = GRAPH_SHARDS
        specs = [{"label": f"graph_check-{i}", "cmd": [
            self.py, "scripts/graph_check.py", "--backend", self.a.backend, "--shard", f"{i}/{n}",
            *self.sizes["graph_check"], "--out", str(self.w / f"graph-check-{i}.json")],
            "cap_s": 600,
            "expect_s": self.expect.get("graph_check", DEFAULT_EXPECT)} for i in range(n)]
        steps = self.r.steps(sec, specs)
        parts = [load_json(self.w / f"graph-check-{i}.json") for i in range(n)]
        for st, data in zip(steps, parts):
            if data is None:
                sec.fail(f"{self.r.why(st)} (no JSON report)")
            elif st.rc != 0:
                sec.fail(self.r.why(st))
        parts = [p for p in parts if p]
        if not parts:
            return
        graph_replay_figures(sec, parts, self.a.backend)

    def nofp64(self, sec: Section) -> None:
        env = {"DFLASH2RT_FP64": "0"}
        out = self.w / "nofp64-smoke.json"
        be = self.a.nofp64_backend
        smoke = {"label": "smoke", "cmd": [self.py, DRIVER, "--smoke", be, "--expect-fp64", "0"],
                 "cap_s": 120, "env": env, "log": "nofp64-smoke", "stdout": out,
                 "expect_s": self.expect.get("smoke", DEFAULT_EXPECT)}
        groups = pack(suite_shards(("test_l1_", "test_l2_")), self.expect, self.r.slots.n)
        levels = [self.conformance_step(be, f"nofp64-part{i}",
                                        " or ".join(f"({kw})" for _, kw in pieces), env, t)
                  for i, (t, pieces) in enumerate(groups)]
        sec.figures["parts"] = {f"nofp64-part{i}": [tag for tag, _ in pieces]
                                for i, (_, pieces) in enumerate(groups)}
        st, *steps = self.r.steps(sec, [smoke, *levels])
        info = load_json(out)
        if info:
            sec.figures.update({k: info[k] for k in ("backend", "has_fp64", "probe_fp64",
                                                     "implementation", "kernel_fallbacks")})
        if st.rc != 0:
            sec.fail(f"smoke: {'; '.join(info['problems']) if info else self.r.why(st)}")
        self.verdict(sec, steps, [s["label"] for s in levels], prefix="conformance ")

    def memcheck(self, sec: Section) -> None:
        memcheck_section(self, sec)

    def bench(self, sec: Section) -> None:
        for dtype in ("float32", "bfloat16"):
            report = self.w / f"bench-{dtype}.json"
            st = self.r.step(sec, dtype, self.dfl(
                "bench", "--backend", self.a.backend, "--dtype", dtype, *self.sizes["bench"],
                "--json-out", str(report)), sec.budget_s / 2, None, f"bench-{dtype}")
            data = load_json(report)
            if st.rc != 0 or data is None:
                sec.fail(self.r.why(st))
                continue
            bench_figures(sec, dtype, data)

    def costs(self, sec: Section) -> None:
        report = self.w / "costs.json"
        st = self.r.step(sec, "costs", self.dfl(
            "bench", "--costs", "--backend", self.a.backend, *self.sizes["costs"],
            "--json-out", str(report)), sec.budget_s)
        sec.figures["sizes"] = " ".join(self.sizes["costs"])
        data = load_json(report)
        if st.rc != 0 or data is None:
            sec.fail(self.r.why(st))
            return
        costs_figures(sec, data)
