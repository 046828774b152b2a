"""The sections of ``scripts/device_check.py``, each a method of ``Check`` that runs bounded steps
(``device_check_lib.Runner.step``) and turns their reports into a status, figures and a reason;
and the smoke probe the float64-less lane and memcheck run (``--smoke``)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
from pathlib import Path

from device_check_lib import Runner, Section, conformance_verdict, load_json

ROOT = Path(__file__).resolve().parent.parent
DRIVER = str(Path(__file__).with_name("device_check.py"))


class Check:
    def __init__(self, args, runner: Runner, sizes: dict) -> None:
        self.a, self.r, self.w, self.sizes = args, runner, runner.work, sizes
        self.py = args.python
        self.system: dict = {}

    def dfl(self, *argv: str) -> list[str]:
        return [self.py, "-m", "dflash2rt", *argv]

    def run_conformance(self, sec: Section, backend: str, tag: str, keyword: str,
                        env: dict | None = None, prefix: str = "") -> None:
        report = self.w / f"conformance-{tag}.json"
        st = self.r.step(sec, tag, self.dfl(
            "conformance", "--backend", backend, "-k", keyword, *self.sizes["conformance"],
            "--json", str(report), "--junit", str(self.w / f"conformance-{tag}.xml"),
            "--markdown", str(self.w / f"conformance-{tag}.md")), 600, env, f"conformance-{tag}")
        data = load_json(report)
        if tag == "graphs" and data and st.rc != 0:      # no graphs here: every test skipped
            g = data.get("levels", {}).get("graphs", {})
            if g.get("result") == "skipped" and not (g.get("executed") or g.get("errors")):
                sec.status, sec.reason = "SKIPPED", f"{g['skipped']} tests skipped: {g['note']}"
                return
        conformance_verdict(sec, self.r, st, data, prefix)

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
        # Ops and L0-L4 in one process, graphs in another: a failed capture must not be able to
        # leave device state behind that fails unrelated tests.
        self.run_conformance(sec, self.a.backend, "ops", "not graphs")

    def graphs(self, sec: Section) -> None:
        self.run_conformance(sec, self.a.backend, "graphs", "graphs")

    def graph_replay(self, sec: Section) -> None:
        report = self.w / "graph-check.json"
        st = self.r.step(sec, "graph_check", [self.py, "scripts/graph_check.py", "--backend",
                                              self.a.backend, "--out", str(report)], 600)
        data = load_json(report)
        if data is None:
            sec.fail(f"{self.r.why(st)} (no JSON report)")
            return
        rows = data.get("rows", [])
        replays = sum(r.get("graph_replays", 0) for r in rows)
        eager = [b for r in rows for b in r.get("graph_eager_buckets", [])]
        sec.figures.update(adapter=data.get("adapter"), configurations=len(rows),
                           replays=replays, all_equal=data.get("all_equal"), eager_buckets=eager)
        if st.rc != 0:
            sec.fail(self.r.why(st))
        elif data.get("adapter") is None:
            sec.status = "SKIPPED"
            sec.reason = (f"backend {self.a.backend} has no graph adapter: graph_check.py ran "
                          f"eager against eager ({len(rows)} configurations, equal)")
        elif not replays:
            sec.fail("no graph was replayed: equality proves nothing")

    def nofp64(self, sec: Section) -> None:
        env = {"DFLASH2RT_FP64": "0"}
        out = self.w / "nofp64-smoke.json"
        st = self.r.step(sec, "smoke", [self.py, DRIVER, "--smoke", self.a.nofp64_backend,
                                        "--expect-fp64", "0"], 60, env, "nofp64-smoke", out)
        info = load_json(out)
        if info:
            sec.figures.update({k: info[k] for k in ("backend", "has_fp64", "probe_fp64",
                                                     "implementation", "kernel_fallbacks")})
        if st.rc != 0:
            sec.fail(f"smoke: {'; '.join(info['problems']) if info else self.r.why(st)}")
        self.run_conformance(sec, self.a.nofp64_backend, "nofp64-L1-L2", "L1 or L2", env,
                             prefix="conformance ")

    def memcheck(self, sec: Section) -> None:
        cs = shutil.which("compute-sanitizer")
        if cs is None:
            sec.status, sec.reason = "SKIPPED", "compute-sanitizer is not on PATH"
            return
        if self.a.dry_run:
            sec.status = "SKIPPED"
            sec.reason = f"dry run: backend {self.a.backend} launches no device kernels ({cs})"
            return
        st = self.r.step(sec, "memcheck", [cs, "--tool", "memcheck", "--error-exitcode", "9",
                                           self.py, DRIVER, "--smoke", self.a.backend], 600,
                         {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
        log = (self.w / st.log).read_text(errors="replace").splitlines()
        summary = [x.strip() for x in log if "ERROR SUMMARY" in x]
        sec.figures["memcheck"] = summary[-1] if summary else "no ERROR SUMMARY line"
        sec.figures["allocator"] = "PYTORCH_NO_CUDA_MEMORY_CACHING=1 (one allocation per tensor)"
        refused = [x.strip() for x in log if "Device not supported" in x]
        if refused:
            sec.status = "SKIPPED"
            sec.reason = f"compute-sanitizer cannot instrument this device here: {refused[0]}"
        elif st.rc != 0:
            sec.fail(self.r.why(st))

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
            b1 = data["batch1"]
            sec.figures[f"{dtype} batch 1"] = _fmt(
                prompts=b1["prompts"], tau=b1["tau"], spec_tok_s=b1["spec_tokens_per_s"],
                target_only_tok_s=b1["target_only_tokens_per_s"],
                speedup=b1["speedup_vs_target_only"], hf_tok_s=b1["hf_tokens_per_s"],
                vs_hf=b1["speedup_vs_hf"], fallbacks=b1["fallbacks"])
            if not data.get("greedy_equal_all"):
                sec.fail(f"{dtype}: greedy speculative tokens differ from target-only")

    def costs(self, sec: Section) -> None:
        ckpt = Path(tempfile.mkdtemp(prefix="dflash2rt-synth-"))     # never under $OUT
        try:
            synth = self.sizes["synth"]
            st = self.r.step(sec, "synth", self.dfl("synth", *synth, "--out", str(ckpt / "pair")),
                             sec.budget_s * 0.4)
            sec.figures["shape"] = " ".join(synth)
            if st.rc != 0:
                sec.fail(self.r.why(st))
                return
            report = self.w / "costs.json"
            st = self.r.step(sec, "costs", self.dfl(
                "bench", "--costs", "--backend", self.a.backend, "--model", str(ckpt / "pair"),
                *self.sizes["costs"], "--json-out", str(report)), sec.budget_s)
            data = load_json(report)
            if st.rc != 0 or data is None:
                sec.fail(self.r.why(st))
                return
            for row in data.get("rows", []):
                best = max(row["projected_speedup"].items(), key=lambda kv: kv[1])
                sec.figures[f"batch {row['batch']} context {row['context']}"] = _fmt(
                    target_ms=1e3 * row["t_target_s"], bandwidth=row["bandwidth_fraction"],
                    best_block=best[0], projected_speedup=best[1])
            if data.get("skipped_contexts"):
                sec.figures["skipped contexts"] = data["skipped_contexts"]
        finally:
            shutil.rmtree(ckpt, ignore_errors=True)


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


def _fmt(**kv) -> str:
    return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in kv.items())


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
