"""The step-cost profiling pass: a separate, untimed pass (never inside a timed window) that
synchronises the device before and after every step body (draft + select, verify; each graph
replay with graphs), so its per-step split (draft, verify, host) is device time on GPUs too."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator, Sequence

from ..engine.engine import Engine
from ..engine.request import Request
from ..engine.runner import Runner
from ..engine.stats import RunStats
from . import measure
from .measure import Measurement, Sample


@contextlib.contextmanager
def synced_phases(runner: Runner,
                  clocks: dict[int, tuple[dict[str, float], dict[str, float]]]
                  ) -> Iterator[None]:
    """While active (the profiling pass only, never a timed run): every step body the
    ``runner`` runs (one eager body, or one graph replay: its ``timer`` hook) runs between two
    device syncs (:func:`sync`), and its seconds (graph capture left out) go to
    ``clocks[id(clock)][1]["draft"]`` (draft + select) or ``["verify"]`` (verify + accept +
    commit; target-only: forward + sample + commit), where ``clock`` is the time dict the body
    adds to: a run's ``RunStats.time`` for its decode steps, a scratch dict for anything else
    (adaptive calibration), so a run's part is told apart. A timer already set runs inside."""
    device, inner = runner.backend.device, runner.timer

    def timer(kind: str, block: int, clock: dict, run: Callable[[], Any]) -> Any:
        acc = clocks.setdefault(id(clock), (clock, dict.fromkeys(
            ("draft", "verify", "capture"), 0.0)))[1]
        measure.sync(device)
        cap, t0 = runner.capture_s(), time.perf_counter()
        out = run() if inner is None else inner(kind, block, clock, run)
        measure.sync(device)
        seconds, captured = time.perf_counter() - t0, runner.capture_s() - cap
        acc["capture"] += captured
        acc["draft" if kind == "draft" else "verify"] += seconds - captured
        return out

    runner.timer = timer
    try:
        yield
    finally:
        runner.timer = inner

def profile_steps(engine: Engine, batches: Sequence[Sequence[Request]], spec: bool,
                  block: int | None = None) -> dict[str, Any]:
    """The per-step cost split of one configuration, as a separate profiling pass (untimed;
    run it outside every timed window, as :func:`measure_rows` does, after its timed rounds):
    ``engine.generate`` of each of ``batches`` with the device synchronised before and after
    every step body (:func:`synced_phases`; a no-op on CPU, ``torch.accelerator.synchronize``
    elsewhere). → seconds per decode step of ``draft`` (draft + select; 0 for target-only),
    ``verify`` (verify + accept + commit; target-only: forward + sample + commit), ``host``
    (the run's ``RunStats.time["host"]``: the step's host work, after the device was drained),
    ``step`` (their sum), with ``steps``, ``tau`` and ``block_sizes``."""
    draft = verify = host = 0.0
    stats: list[RunStats] = []
    for b in batches:
        clocks: dict[int, tuple[dict[str, float], dict[str, float]]] = {}
        with synced_phases(engine.runner, clocks):
            st = engine.generate(list(b), spec=spec, block_size=block)[1]
        acc = next((a for c, a in clocks.values() if c is st.time), None)
        if acc is None and st.steps:
            raise RuntimeError("the profiling pass saw no step body of the run's decode steps: "
                               "the engine's step bodies no longer go through Runner.timer")
        draft += acc["draft"] if acc else 0.0
        verify += acc["verify"] if acc else 0.0
        host += st.time["host"]
        stats.append(st)
    n = max(sum(st.steps for st in stats), 1)
    req_steps = sum(st.request_steps for st in stats)
    sizes = Measurement("profile", [Sample([], 0.0, 0, st) for st in stats]).block_sizes
    return {"draft": draft / n, "verify": verify / n, "host": host / n,
            "step": (draft + verify + host) / n, "steps": sum(st.steps for st in stats),
            "tau": sum(st.committed for st in stats) / req_steps if req_steps else 0.0,
            "block_sizes": {str(k): v for k, v in sizes.items()}}
