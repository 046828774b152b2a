"""The server's ``/metrics``: Prometheus text under vLLM's names with the ``dflash2rt:`` prefix.

The speculation series are ``dflash2rt.metrics.prometheus_text`` of the engine loop's
cumulative RunStats (docs/metrics.md; ``generation_tokens_total`` counts the tokens returned).
Beside them, the request series vLLM's server exports, with vLLM's meanings:
``num_requests_running`` / ``num_requests_waiting`` (gauges), ``request_success_total``
(finished requests by ``finished_reason``: stop, length, abort), ``prompt_tokens_total``, the
histograms ``time_to_first_token_seconds``, ``time_per_output_token_seconds`` and
``e2e_request_latency_seconds``, and ``http_requests_total{handler, method, status}`` (status
grouped as "2xx", "4xx", "5xx", as vLLM's instrumentator groups it; no prefix, as there).
"""

from __future__ import annotations

import threading
from typing import Mapping

from ..engine.stats import RunStats
from ..metrics import PREFIX, labels_text, prometheus_text, value_text

BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
           7.5, 10.0, 20.0, 40.0, 80.0)
REASONS = ("stop", "length", "abort")
METHODS = ("GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS")


def _family(name: str, kind: str, help_: str, samples: list[tuple[str, dict, float]]
            ) -> list[str]:
    return [f"# HELP {name} {help_}", f"# TYPE {name} {kind}",
            *(f"{name}{suffix}{labels_text(lab)} {value_text(v)}" for suffix, lab, v in samples)]


class Histogram:
    """Cumulative buckets, count and sum of observed values."""

    def __init__(self) -> None:
        self.counts = [0] * len(BUCKETS)
        self.count, self.sum = 0, 0.0

    def observe(self, v: float) -> None:
        self.count += 1
        self.sum += v
        for i, b in enumerate(BUCKETS):
            if v <= b:
                self.counts[i] += 1

    def samples(self, base: dict) -> list[tuple[str, dict, float]]:
        return [*(("_bucket", {**base, "le": repr(b)}, c) for b, c in zip(BUCKETS, self.counts)),
                ("_bucket", {**base, "le": "+Inf"}, self.count), ("_count", base, self.count),
                ("_sum", base, float(self.sum))]


class ServerMetrics:
    """Counters the HTTP side updates (under a lock: several threads serve requests)."""

    def __init__(self, labels: Mapping[str, str]) -> None:
        self.labels = dict(labels)
        self.lock = threading.Lock()
        self.success = dict.fromkeys(REASONS, 0)
        self.prompt_tokens = 0
        self.ttft, self.tpot, self.e2e = Histogram(), Histogram(), Histogram()
        self.http: dict[tuple[str, str, str], int] = {}

    def finished(self, reason: str, prompt_tokens: int, tokens: int, ttft: float | None,
                 e2e: float) -> None:
        """A request that ended: ``reason`` stop / length / abort."""
        with self.lock:
            self.success[reason] += 1
            self.prompt_tokens += prompt_tokens
            self.e2e.observe(e2e)
            if ttft is not None:
                self.ttft.observe(ttft)
                if tokens > 1:
                    self.tpot.observe((e2e - ttft) / (tokens - 1))

    def http_request(self, handler: str, method: str, status: int) -> None:
        """One HTTP request (a method not in ``METHODS`` counts as "other": clients choose
        it, and the label's values must stay few)."""
        key = (handler, method if method in METHODS else "other", f"{status // 100}xx")
        with self.lock:
            self.http[key] = self.http.get(key, 0) + 1

    def text(self, stats: RunStats, running: int, waiting: int) -> str:
        base = self.labels
        p = PREFIX
        with self.lock:
            lines = [
                *_family(p + "num_requests_running", "gauge", "Requests in the decoding batch.",
                         [("", base, running)]),
                *_family(p + "num_requests_waiting", "gauge", "Requests waiting for a slot.",
                         [("", base, waiting)]),
                *_family(p + "request_success_total", "counter", "Finished requests by finish "
                         "reason (abort: cancelled by the client or the shutdown).",
                         [("", {**base, "finished_reason": r}, n)
                          for r, n in self.success.items()]),
                *_family(p + "prompt_tokens_total", "counter", "Prompt tokens of the requests "
                         "that finished.", [("", base, self.prompt_tokens)]),
                *_family(p + "time_to_first_token_seconds", "histogram", "Seconds from "
                         "arrival to the first token.", self.ttft.samples(base)),
                *_family(p + "time_per_output_token_seconds", "histogram", "Seconds per "
                         "output token after the first.", self.tpot.samples(base)),
                *_family(p + "e2e_request_latency_seconds", "histogram", "Seconds from "
                         "arrival to the end.", self.e2e.samples(base)),
                *_family("http_requests_total", "counter", "HTTP requests by handler, method "
                         "and status class.",
                         [("", {"handler": h, "method": m, "status": s}, n)
                          for (h, m, s), n in sorted(self.http.items())]),
            ]
        return prometheus_text(stats, base) + "\n".join(lines) + "\n"
