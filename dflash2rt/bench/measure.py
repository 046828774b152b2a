"""Interleaved measurements of our engine (spec and target-only) and the HF baseline."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..engine.engine import Engine
from ..engine.request import Request, SamplingParams
from ..engine.stats import RunStats


@dataclass
class Timing:
    """Repeated measurements of one configuration; ``tokens`` per run is fixed."""

    tokens: int = 0
    seconds: list[float] = field(default_factory=list)
    stats: list[RunStats] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / statistics.median(self.seconds) if self.seconds else 0.0

    def per_step(self, phase: str) -> float:
        """Median seconds of ``phase`` per decode step."""
        return statistics.median(s.time[phase] / max(s.steps, 1) for s in self.stats)

    @property
    def tau(self) -> float:
        return statistics.median(s.tau for s in self.stats) if self.stats else 0.0


def sync(device: torch.device) -> None:
    """Wait for queued device work so a wall clock covers it (no-op on CPU)."""
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def requests(prompts: Sequence[Sequence[int]], max_new: int, temperature: float = 0.0,
             seed: int = 0) -> list[Request]:
    params = SamplingParams(max_new_tokens=max_new, temperature=temperature, seed=seed,
                            ignore_eos=True)
    return [Request(tuple(p), params) for p in prompts]


def engine_run(engine: Engine, reqs: list[Request], spec: bool, block: int | None,
               into: Timing) -> None:
    outs, stats = engine.generate(reqs, spec=spec, block_size=block)
    into.tokens = stats.generated
    into.seconds.append(stats.wall_s)
    into.stats.append(stats)
    into.outputs = [o.token_ids for o in outs]


def interleave(runs: dict[str, Callable[[], None]], repeats: int) -> None:
    """Run every configuration once per round, ``repeats`` rounds (noise hits all alike)."""
    for _ in range(repeats):
        for fn in runs.values():
            fn()
