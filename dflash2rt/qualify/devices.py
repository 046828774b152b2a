"""``dflash2rt qualify --devices all|LIST``: qualify every device of a node at once, one
``dflash2rt qualify --backend NAME:INDEX`` process per device, running concurrently; then
``report merge`` of their reports into one matrix, and the devices whose results differ from
their peers' named.

Layout of ``--out DIR``: ``DIR/<name>-<index>/`` (each device's report.json, junit.xml,
report.html, and ``qualify.log``, its progress and errors), ``DIR/matrix.{html,md,json}``
(the merged matrix) and ``DIR/devices.json`` (each device's exit code and verdict, and the
outliers).

Results compared between peers: the verdict, completion, every conformance level and op, the
implementation, graph mode, fallbacks and the equality checks (greedy spec == target-only,
graph replay == eager); never timings (tok/s, tau, speedups and the block size chosen from
them differ by noise) nor the device's own name. A device is an outlier on a check when its
value differs from the value most devices have; with no majority (two devices, two values)
every device with a value other than the first device's is named.

On the CPU backend (one device), ``cpu:0,cpu:1`` runs two qualifications of the host CPU at
once, each with ``cores / N`` torch threads, which exercises the node-level flow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from ..errors import InvalidInputError
from ..registry import Registry, split_device
from .merge import _checks, merge

# _checks rows that are timings (or chosen from timings), or the device's own name
_NOT_RESULTS = ("target-only tok/s", "speculative tok/s", "tau ", "speedup vs target-only",
                "recommended block size", "device", "commit")
_Procs = dict[str, tuple[subprocess.Popen, Path, Any]]     # device → (process, its dir, its log)


def device_list(devices: str, backend: str | None, registry: Registry | None = None
                ) -> list[str]:
    """``all`` → every device of ``backend`` (its probe's ``device_count``; a backend without
    device indices: itself); a comma list of ``name:index`` or bare indices (of ``backend``)."""
    devices = devices.strip()
    if devices == "all":
        if not backend:
            raise InvalidInputError("--devices all needs --backend NAME")
        base, index = split_device(backend)
        if index is not None:
            raise InvalidInputError(f"--devices all takes a backend name without an index, "
                                    f"got {backend!r}")
        reg = registry or Registry.discover()
        entry = reg.entry(base)
        probe = reg.probe(base)
        if not probe.available:
            raise InvalidInputError(f"backend {base!r} is not available here: {probe.reason}")
        if entry.spec.probe_device is None:
            return [base]
        count = int(probe.details.get("device_count", "1") or 1)
        return [f"{base}:{i}" for i in range(count)]
    out = []
    for item in (x.strip() for x in devices.split(",")):
        if not item:
            continue
        if item.isdigit():
            if not backend:
                raise InvalidInputError(f"--devices {item}: a bare index needs --backend NAME")
            item = f"{split_device(backend)[0]}:{item}"
        elif split_device(item)[1] is None:
            raise InvalidInputError(f"--devices: {item!r} is not NAME:INDEX or an index")
        out.append(item)
    if not out:
        raise InvalidInputError("--devices names no device")
    if len(set(out)) != len(out):
        raise InvalidInputError(f"--devices names a device twice: {devices}")
    return out


def _dir_name(device: str) -> str:
    return device.replace(":", "-")


def outliers(reports: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """device → {check: {"value": its value, "peers": the majority's}} for the result checks
    on which it differs from its peers (module docstring)."""
    checks = {d: {k: v for k, v in _checks(r).items() if not k.startswith(_NOT_RESULTS)}
              for d, r in reports.items()}
    names = list(checks)
    keys = list(dict.fromkeys(k for c in checks.values() for k in c))
    out: dict[str, dict[str, Any]] = {}
    for k in keys:
        vals = {d: json.dumps(checks[d].get(k), default=str, sort_keys=True) for d in names}
        if len(set(vals.values())) < 2:
            continue
        (top, n), *rest = Counter(vals.values()).most_common()
        if rest and rest[0][1] == n:             # no majority: the first device is the peer
            top = vals[names[0]]
        for d in names:
            if vals[d] != top:
                out.setdefault(d, {})[k] = {"value": checks[d].get(k),
                                            "peers": json.loads(top)}
    return out


def qualify_devices(devices: list[str], out: str | Path, argv: list[str],
                    log: Callable[[str], None] | None = None,
                    timeout_s: float | None = None) -> dict[str, Any]:
    """Run ``dflash2rt qualify --backend DEVICE --out OUT/<device> ARGV`` for every device at
    once, merge the reports into OUT, name the outliers → the summary (also OUT/devices.json)."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    procs = _start(devices, out, argv, log)
    codes = _wait(procs, t0, timeout_s, log)
    reports, missing = {}, []
    for dev, (_, d, _) in procs.items():
        f = d / "report.json"
        if f.is_file():
            reports[dev] = json.loads(f.read_text(encoding="utf-8"))
        else:
            missing.append(dev)
    summary: dict[str, Any] = {
        "devices": devices,
        "exit_codes": codes,
        "verdicts": {dev: (r.get("verdict") or {}).get("result", "not recorded")
                     for dev, r in reports.items()},
        "no_report": missing,
        "outliers": outliers(reports) if len(reports) > 1 else {},
        "elapsed_s": round(time.monotonic() - t0, 1),
    }
    if reports:
        merge([procs[dev][1] for dev in reports], out)
    (out / "devices.json").write_text(json.dumps(summary, indent=2, default=str),
                                      encoding="utf-8")
    return summary


def _start(devices: list[str], out: Path, argv: list[str], log: Callable[[str], None]) -> _Procs:
    """One ``dflash2rt qualify`` process per device, writing into OUT/<device>/ (CPU runs share
    the host's cores: each gets ``cores / N`` threads)."""
    cpu_share = max(1, (os.cpu_count() or 1) // len(devices))
    procs: _Procs = {}
    for dev in devices:
        d = out / _dir_name(dev)
        d.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if split_device(dev)[0].startswith("cpu"):     # the runs share the host's cores
            env.update(OMP_NUM_THREADS=str(cpu_share), MKL_NUM_THREADS=str(cpu_share))
        logf = open(d / "qualify.log", "w", encoding="utf-8")
        cmd = [sys.executable, "-m", "dflash2rt", "qualify", "--backend", dev, "--out", str(d),
               *argv]
        procs[dev] = (subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env),
                      d, logf)
        log(f"qualify {dev}: started (pid {procs[dev][0].pid}, log {d / 'qualify.log'})")
    return procs


def _wait(procs: _Procs, t0: float, timeout_s: float | None,
          log: Callable[[str], None]) -> dict[str, int | str]:
    """Each process's exit code ("timed out": terminated, then killed, once ``timeout_s`` since
    ``t0`` has passed); none is left running, whatever happens."""
    codes: dict[str, int | str] = {}
    try:
        for dev, (p, d, logf) in procs.items():
            left = None if timeout_s is None else max(1.0, timeout_s - (time.monotonic() - t0))
            try:
                codes[dev] = p.wait(left)
            except subprocess.TimeoutExpired:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                codes[dev] = "timed out"
            logf.close()
            log(f"qualify {dev}: exit {codes[dev]} ({time.monotonic() - t0:.0f}s)")
    finally:
        for p, _, logf in procs.values():
            if p.poll() is None:
                p.terminate()
            logf.close()
    return codes


def summary_lines(s: dict[str, Any]) -> list[str]:
    lines = [f"{dev}: verdict {s['verdicts'].get(dev, 'no report')}, exit {s['exit_codes'].get(dev)}"
             for dev in s["devices"]]
    if s["no_report"]:
        lines.append(f"no report from: {', '.join(s['no_report'])}")
    if s["outliers"]:
        for dev, diffs in s["outliers"].items():
            lines.append(f"{dev} differs from its peers on {len(diffs)} check(s): " + "; ".join(
                f"{k} = {v['value']!r} (peers: {v['peers']!r})" for k, v in diffs.items()))
    else:
        lines.append("no device's results differ from its peers'")
    return lines
