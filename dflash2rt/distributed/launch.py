"""Spawning the ranks of a tensor-parallel run on one host (``dflash2rt.run(tp=N)``,
``dflash2rt run --tp N``); under torchrun the ranks exist already (group.join).

``spawn(fn, tp, args)`` starts ``tp`` processes (torch.multiprocessing, "spawn" start method),
each with RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT set (a free port on
127.0.0.1), calls ``fn(*args)`` in each and returns rank 0's return value. A rank that raises
or dies (a signal, an exit) makes the run raise ``DistributedError`` naming every rank's end;
the ranks still alive end themselves when their next collective fails or times out (the
group's timeout), and whatever is still alive ``grace_s`` after that is terminated, so a run
never hangs.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import time
import traceback
from typing import Any, Callable

import torch.multiprocessing as mp

from ..errors import DistributedError
from .group import default_timeout

GRACE_S = 10.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, timeout_s: float, fn: Callable, args: tuple,
           results) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "DFLASH2RT_TP_TIMEOUT": str(timeout_s)})
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))   # the ranks share the host
    try:
        out = fn(*args)
        results.put((rank, "ok", out if rank == 0 else None))
    except BaseException as exc:     # noqa: BLE001 — reported to the parent, which raises
        results.put((rank, "error", _describe(exc)))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:        # noqa: BLE001 — a broken group is torn down best-effort
                pass


def _describe(exc: BaseException) -> str:
    """An exception in one line, with the innermost dflash2rt frame it passed through."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "dflash2rt" in f.filename]
    where = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {str(exc).strip()}{where}"


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def spawn(fn: Callable, tp: int, args: tuple = (), timeout_s: float | None = None,
          grace_s: float = GRACE_S) -> Any:
    """Run ``fn(*args)`` on ``tp`` spawned ranks → rank 0's result (module docstring)."""
    timeout_s = default_timeout() if timeout_s is None else float(timeout_s)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, tp, port, timeout_s, fn, args, results),
                         name=f"dflash2rt-tp-rank{r}", daemon=True) for r in range(tp)]
    for p in procs:
        p.start()
    ends: dict[int, tuple[str, Any]] = {}
    failed_at: float | None = None
    try:
        while len(ends) < tp:
            try:
                rank, kind, value = results.get(timeout=0.2)
                ends[rank] = (kind, value)
                if kind == "error" and failed_at is None:
                    failed_at = time.monotonic()
                continue
            except queue.Empty:
                pass
            for r, p in enumerate(procs):
                if r not in ends and p.exitcode is not None:
                    try:     # its message may still be in flight
                        rank, kind, value = results.get(timeout=1.0)
                        ends[rank] = (kind, value)
                        if kind == "error" and failed_at is None:
                            failed_at = time.monotonic()
                    except queue.Empty:
                        ends[r] = ("died", _exit_reason(p.exitcode))
                        failed_at = failed_at or time.monotonic()
                    break
            if failed_at is not None and time.monotonic() - failed_at > timeout_s + grace_s:
                for r, p in enumerate(procs):
                    if r not in ends:
                        ends[r] = ("terminated", f"still running {timeout_s + grace_s:.0f}s after "
                                           "another rank failed: terminated")
                break
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(5)
    bad = {r: e for r, e in ends.items() if e[0] != "ok"}
    if bad:
        # the cause: a rank that died by itself, else the first to report an error
        order = {r: i for i, r in enumerate(ends)}
        first = min(bad, key=lambda r: (("died", "error", "terminated").index(bad[r][0]),
                                        order[r]))
        lines = [f"rank {r}: {'died, ' if k == 'died' else ''}{v}" for r, (k, v) in sorted(bad.items())]
        raise DistributedError(f"tensor-parallel run failed (tp={tp}; rank {first} first):\n"
                               + "\n".join(lines))
    return ends[0][1]
