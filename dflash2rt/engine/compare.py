"""Graph replay vs eager on one backend: the same requests through both, tokens compared bit for
bit, step latency side by side (``dflash2rt qualify`` and ``scripts/graph_check.py``)."""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

from ..backend import Backend
from ..models.pair import ModelPair
from ..watermark import WatermarkKey
from .engine import Engine
from .request import Request


def eager_twin(backend: Backend) -> Backend:
    """The same backend (kernels, dtypes, device) without its graph adapter."""
    eager = copy.copy(backend)
    eager.graph_adapter = None
    return eager


def graph_vs_eager(pair: ModelPair, backend: Backend, make_requests: Callable[[], Sequence[Request]],
                   spec: bool = True, watermark: WatermarkKey | None = None) -> dict[str, Any]:
    """One engine per mode runs the requests twice: the first call warms up and captures, the
    second replays the graphs the first captured (its capture time is 0 when they were kept);
    the second call's tokens and step latency are compared. ``graph_replays`` counts that call's
    replays and ``graph_eager_buckets`` names the buckets it ran eagerly (a refused capture or
    a replay that differed from eager): "equal" proves replay == eager only with replays and
    no eager buckets; ``graph_captures_ms``: per graph and bucket, the first call's capture
    milliseconds (warm-up + capture + checked replay). Adaptive runs: the eager engine takes a
    replica of the policy the graph engine's second call decided with (its cost table and
    acceptance pool), so both choose the same block sizes (a table each could choose
    differently, policy/). ``watermark``: a key both engines mark with."""
    row: dict[str, Any] = {"mode": "spec" if spec else "target-only"}
    tokens, used, replica = {}, {}, None
    for name, be in (("graph", backend), ("eager", eager_twin(backend))):
        with Engine(pair, be) as engine:
            engine.policy = replica
            _, first = engine.generate(make_requests(), spec=spec, watermark=watermark)
            outs, stats = engine.generate(make_requests(), spec=spec, watermark=watermark)
            if replica is None and engine.policy is not None:   # the table the call used
                replica = engine.policy.replica()
        used.update(stats.graphs)                        # the eager twin's is empty
        tokens[name] = [o.token_ids for o in outs]
        row[f"{name}_step_ms"] = 1e3 * stats.step_s
        row[f"{name}_capture_ms"] = 1e3 * first.capture_s
        row[f"{name}_recapture_ms"] = 1e3 * stats.capture_s
        row[f"{name}_fallbacks"] = stats.fallbacks
        if name == "graph":       # per graph and bucket: the first call's warm-up + capture
            row["graph_captures_ms"] = {
                g: {size: b["capture_ms"] for size, b in bs.items() if b.get("capture_ms")}
                for g, bs in first.graphs.items()}
    row["graph_replays"] = sum(b["replays"] for bs in used.values() for b in bs.values())
    row["graph_eager_buckets"] = [f"{g} @{size}: {b['refused']}" for g, bs in used.items()
                                  for size, b in bs.items() if b["eager"]]
    row["equal"] = tokens["graph"] == tokens["eager"]
    return row
