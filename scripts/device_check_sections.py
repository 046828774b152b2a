"""The sections of ``scripts/device_check.py``, each a method of ``Check`` that runs bounded steps
(``device_check_lib.Runner.step`` / ``steps``: several side by side) and turns their reports into
a status, figures and a reason; and the smoke probe the float64-less lane and memcheck run
(``--smoke``). memcheck lives in device_check_memcheck."""

from __future__ import annotations

import json
import os
import platform
import shutil
from pathlib import Path

from device_check_lib import Runner, Section, Step
from device_check_memcheck import memcheck_section
from device_check_report import (bench_figures, conformance_figures, costs_figures,
                                 graph_replay_figures, load_json, merge_reports)

ROOT = Path(__file__).resolve().parent.parent
DRIVER = str(Path(__file__).with_name("device_check.py"))
SUITES = ROOT / "conformance" / "dflash2rt_conformance" / "suites"
GRAPH_SHARDS = 3                  # graph_check.py processes side by side


# Modules whose one long test gets a process of its own (the rest of the module another).
SPLIT = {"test_l4_end_to_end": "test_sampled_law_of_first_tokens",
         "test_l4_tensor_parallel": "test_tp2_sampled_law_of_first_tokens_and_ranks_agree",
         "test_l3_procs": "test_joint_law_with_processors"}


def suite_shards() -> list[tuple[str, str]]:
    """(tag, -k expression) per piece of the conformance suite: its modules but the graphs
    level's (a section of its own), the modules of SPLIT in two."""
    out = []
    for m in sorted(p.stem for p in SUITES.glob("test_*.py") if p.stem != "test_graphs"):
        tag = m.removeprefix("test_")
        if m in SPLIT:
            out += [(f"{tag}-long", f"{m} and {SPLIT[m]}"),
                    (f"{tag}-rest", f"{m} and not {SPLIT[m]}")]
        else:
            out.append((tag, m))
    return out


def pack(pieces: list[tuple[str, str]], expect: dict, bins: int) -> list[tuple[float, list]]:
    """The pieces in ``bins`` groups of about equal expected seconds (longest first, each into
    the least loaded group) → (expected seconds, pieces) per group, the longest first."""
    groups: list[tuple[float, list]] = [(0.0, []) for _ in range(max(1, min(bins, len(pieces))))]
    for p in sorted(pieces, key=lambda p: -expect.get(p[0], 5.0)):
        i = min(range(len(groups)), key=lambda i: groups[i][0])
        groups[i] = (groups[i][0] + expect.get(p[0], 5.0), groups[i][1] + [p])
    return sorted(groups, key=lambda g: -g[0])


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
        """PASS needs every step's exit 0 and every report passing; the merged figures go
        under ``prefix``."""
        reports = [load_json(self.w / f"conformance-{t}.json") for t in tags]
        for st, rep in zip(steps, reports):
            if rep is None:
                sec.fail(f"{self.r.why(st)} (no JSON report)")
            elif st.rc != 0 or rep.get("result") != "pass":
                sec.fail(f"{self.r.why(st)}; " + "; ".join(rep.get("reasons", [])[:5]))
        got = [r for r in reports if r is not None]
        if got:
            for k, v in conformance_figures(merge_reports(got)).items():
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
        spec = self.conformance_step(self.a.backend, "graphs", "graphs", expect_s=30)
        st = self.r.step(sec, **spec)
        data = load_json(self.w / "conformance-graphs.json")
        if data and st.rc != 0:      # no graphs here: every test skipped
            g = data.get("levels", {}).get("graphs", {})
            if g.get("result") == "skipped" and not (g.get("executed") or g.get("errors")):
                sec.status, sec.reason = "SKIPPED", f"{g['skipped']} tests skipped: {g['note']}"
                return
        self.verdict(sec, [st], ["graphs"])

    def graph_replay(self, sec: Section) -> None:
        n = GRAPH_SHARDS
        specs = [{"label": f"graph_check-{i}", "cmd": [
            self.py, "scripts/graph_check.py", "--backend", self.a.backend, "--shard", f"{i}/{n}",
            *self.sizes["graph_check"], "--out", str(self.w / f"graph-check-{i}.json")],
            "cap_s": 600,
            "expect_s": self.expect.get("graph_check", 40.0)} for i in range(n)]
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
                 "cap_s": 120, "env": env, "log": "nofp64-smoke", "stdout": out, "expect_s": 15}
        levels = [self.conformance_step(be, f"nofp64-{lv}", lv, env,
                                        self.expect.get(f"nofp64-{lv}", 40.0))
                  for lv in ("L1", "L2")]
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


def smoke(name: str, expect_fp64: bool | None) -> int:
    """Create backend ``name`` (a kernel backend's creation runs its smoke launch) and print
    what runs; exit 1 on a kernel fallback or when float64 is not as expected."""
    from dflash2rt.registry import Registry

    reg = Registry.discover()
    status = next((s for s in reg.statuses() if s.name == name), None)
    backend = reg.select(name).backend
    problems = [f"kernel fallback: {f}" for f in backend.kernel_fallbacks]
    if expect_fp64 is not None and backend.has_fp64 != expect_fp64:
        problems.append(f"has_fp64 is {backend.has_fp64}, expected {expect_fp64}"
                        + (" (DFLASH2RT_FP64=0 was not honoured)"
                           if os.environ.get("DFLASH2RT_FP64") == "0" else ""))
    print(json.dumps({"backend": name, "device": str(backend.device),
                      "probe_fp64": getattr(status, "fp64", None), "has_fp64": backend.has_fp64,
                      "implementation": backend.implementation_summary(),
                      "kernel_fallbacks": list(backend.kernel_fallbacks),
                      "standing_fallbacks": list(backend.standing_fallbacks),
                      "graphs": getattr(backend.graph_adapter, "name", None),
                      "problems": problems}))
    return 1 if problems else 0


# Exit 0 when every named folder (relative to the current one) is installed from here (PEP 610).
INSTALLED = """import json, sys
from importlib.metadata import distributions
from pathlib import Path
want = {str(Path(d).resolve()) for d in sys.argv[1:]}
have = set()
for d in distributions():
    url = json.loads(d.read_text("direct_url.json") or "{}").get("url", "")
    if url.startswith("file://"):
        have.add(str(Path(url[7:]).resolve()))
missing = sorted(want - have)
print("not installed from this tree: " + ", ".join(missing) if missing else "installed")
sys.exit(1 if missing else 0)
"""
VERSIONS = """import platform, torch
from importlib.metadata import version
try:
    triton = version("triton")
except Exception as exc:
    triton = "none (" + type(exc).__name__ + ")"
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}; {gpu}); triton {triton}; "
      f"python {platform.python_version()}")
"""
