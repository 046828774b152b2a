"""One progress line per N steps on stderr: loss, tokens/s, elapsed time and ETA."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def fmt_s(seconds: float) -> str:
    """Seconds as ``1h02m03s`` / ``2m03s`` / ``3.4s``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class Progress:
    """Tracks one phase; ``step`` prints every ``every`` steps and at the last one."""

    def __init__(self, phase: str, total: int, every: int = 10, stream: TextIO | None = None) -> None:
        self.phase, self.total, self.every = phase, total, max(1, every)
        self.stream = sys.stderr if stream is None else stream
        self.start = time.perf_counter()
        self.tokens = 0
        self._window_tokens, self._window_start = 0, self.start

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def step(self, i: int, tokens: int, **metrics: float) -> None:
        """Record step ``i`` (1-based) that processed ``tokens`` tokens; print if due."""
        self.tokens += tokens
        self._window_tokens += tokens
        if i % self.every and i != self.total:
            return
        now = time.perf_counter()
        rate = self._window_tokens / max(now - self._window_start, 1e-9)
        self._window_tokens, self._window_start = 0, now
        elapsed = now - self.start
        eta = elapsed / i * (self.total - i)
        parts = " ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        self.log(f"step {i}/{self.total} {parts} tok/s {rate:.0f} elapsed {fmt_s(elapsed)} "
                 f"eta {fmt_s(eta)}")

    def log(self, message: str) -> None:
        print(f"[{self.phase}] {message}", file=self.stream, flush=True)
