"""The device check's memcheck section: ``compute-sanitizer --tool memcheck`` counting memory-access
errors only (CUDA API errors, such as a refused allocation during a graph capture, are counted
apart and do not fail it), over three processes side by side:

- ``planted``: ``tests/planted_oob.py``, a kernel that writes past the end of its tensor (it runs
  here and in its test, never in the product). It must be caught: a sanitizer that misses it
  here proves nothing by finding no error elsewhere, and the section fails.
- ``smoke-graphs``: the backend's smoke launch (its creation: kernel smoke launch and graph
  self-test) with torch's caching allocator, under which graph capture works.
- ``smoke-exact``: the same with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (one allocation per tensor,
  so a read one element past a tensor is outside its allocation) and graphs off
  (``DFLASH2RT_GRAPHS=0``: capture would allocate, which the sanitizer refuses), said so.

Standard library only."""

from __future__ import annotations

import re
import shutil

PLANTED = "tests/planted_oob.py"
# The first line of each memory-access error memcheck reports (its "Address ... is out of
# bounds" and backtrace lines follow and are not counted again).
MEMORY_ERROR = re.compile(
    r"^=+\s+(Invalid __(global|shared|local)__ (read|write|atomic)|Misaligned|Out-of-range|"
    r"Warp (Illegal|Misaligned|Out-of-range) Address|Malloc/Free Error|Invalid __global__ free)",
    re.IGNORECASE)
API_ERROR = re.compile(r"^=+\s+Program hit \w+ \(error \d+\)")
# "ERROR SUMMARY: 130 errors" (a second line may say how many "were not printed")
SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+) errors?\s*$")
REFUSED = "Device not supported"


def classify(text: str) -> dict:
    """A sanitizer log → memory-access errors (count and first lines), CUDA API errors (count),
    the ERROR SUMMARY's total, and the tool's refusal of the device if it refused."""
    lines = text.splitlines()
    mem = [x.strip("= ").strip() for x in lines if MEMORY_ERROR.match(x)]
    total = [int(m.group(1)) for x in lines if (m := SUMMARY.search(x))]
    return {"memory_errors": len(mem), "first": mem[:3],
            "api_errors": sum(bool(API_ERROR.match(x)) for x in lines),
            "summary_total": total[-1] if total else None,
            "refused": next((x.strip("= ").strip() for x in lines if REFUSED in x), "")}


def memcheck_section(check, sec) -> None:
    cs = shutil.which("compute-sanitizer")
    if cs is None:
        sec.status, sec.reason = "SKIPPED", "compute-sanitizer is not on PATH"
        return
    if check.a.dry_run:
        sec.status = "SKIPPED"
        sec.reason = f"dry run: backend {check.a.backend} launches no device kernels ({cs})"
        return
    smoke = [check.py, check.driver, "--smoke", check.a.backend]
    runs = {"planted": ([check.py, PLANTED], {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}),
            "smoke-graphs": (smoke, {}),
            "smoke-exact": (smoke, {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1",
                                    "DFLASH2RT_GRAPHS": "0"})}
    logs = {n: check.w / "logs" / f"memcheck-{n}.sanitizer.log" for n in runs}
    specs = [{"label": n, "cmd": [cs, "--tool", "memcheck", "--log-file", str(logs[n]), *cmd],
              "cap_s": 600, "env": env, "log": f"memcheck-{n}",
              "expect_s": check.expect.get("memcheck", 12.0)}
             for n, (cmd, env) in runs.items()]
    steps = dict(zip(runs, check.r.steps(sec, specs)))
    found = {n: classify(p.read_text(errors="replace") if p.exists() else "")
             for n, p in logs.items()}
    refused = next((f["refused"] for f in found.values() if f["refused"]), "")
    if refused:
        sec.status = "SKIPPED"
        sec.reason = f"compute-sanitizer cannot instrument this device here: {refused}"
        return
    sec.figures["settings"] = ("smoke-graphs: caching allocator, graphs on; smoke-exact: "
                               "PYTORCH_NO_CUDA_MEMORY_CACHING=1, graphs off (DFLASH2RT_GRAPHS=0)")
    for n, f in found.items():
        sec.figures[n] = (f"{f['memory_errors']} memory-access errors printed"
                          + (f" (first: {f['first'][0]})" if f["first"] else "")
                          + f", {f['api_errors']} CUDA API errors (not counted), ERROR SUMMARY "
                          f"{f['summary_total']}, exit {steps[n].rc}")
    verdict(sec, steps, found, check.r.why)


def verdict(sec, steps: dict, found: dict, why) -> None:
    """FAIL when the planted write was not caught, when the product's smoke launches show a
    memory-access error, or when a smoke launch itself failed or no sanitizer summary came."""
    planted = found["planted"]
    if planted["summary_total"] is None or steps["planted"].timed_out:
        sec.fail(f"planted: no ERROR SUMMARY from the sanitizer ({why(steps['planted'])})")
    elif not planted["memory_errors"]:
        sec.fail("the planted out-of-bounds write was NOT caught: a clean memcheck here "
                 "proves nothing")
    for n in ("smoke-graphs", "smoke-exact"):
        f, st = found[n], steps[n]
        if f["memory_errors"]:
            sec.fail(f"{n}: {f['memory_errors']} memory-access error(s): {f['first'][0]}")
        if st.rc != 0:
            sec.fail(f"{n}: {why(st)}")
        elif f["summary_total"] is None:
            sec.fail(f"{n}: no ERROR SUMMARY line from the sanitizer")
