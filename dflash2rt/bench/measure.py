"""The one measurement loop of dflash2rt: ``bench``, ``qualify`` and the training evaluation all
measure through :func:`measure` (and ``bench.rows``: ``compare``, ``measure_rows``,
``block_sweep`` built on it; ``bench.profile``: the synced step-cost pass).

Every contender (target-only decoding, speculative decoding at each block size, the transformers
baseline) is a :class:`Contender`: a name and a callable that runs its fixed requests once and
returns :class:`Sample` s. :func:`measure` first runs every contender once, untimed, on the same
requests (allocator, lazy initialisation, graph capture / compilation), then ``repeats``
interleaved rounds (every contender once per round, so machine noise hits all alike). Graph
capture seconds are reported apart (:attr:`Measurement.capture_s`) and subtracted from a timed
sample's seconds, so no timed window includes capture.

Temperatures: ``rows.measure_rows`` times, side by side in one run, every contender (target-only,
fixed-block speculation, adaptive speculation, optionally transformers) at T = 0, T = 0.7 /
top-p 0.95 and T = 1, for each batch size, with seeded requests (the same seeds for every
contender) that generate exactly ``max_new`` tokens (EOS ignored on every side).

Step cost: ``profile.profile_steps`` is a separate, untimed profiling pass (never inside a timed
window) that synchronises the device before and after every step body (draft + select, verify;
each graph replay with graphs), so its per-step split (draft, verify, host) is device time on
GPUs too; ``measure_rows`` runs it after the timed rounds and reports the
sampled / greedy step-cost ratio at the same block size.

Naming: the engine without a draft is "target-only" (JSON keys ``target_only_*``,
``speedup_vs_target_only``). The older ``ar_tokens_per_s`` / ``speedup_vs_ar`` keys are still
written as deprecated aliases for one release (:func:`with_deprecated_aliases`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..backend import Backend
from ..engine.engine import Engine
from ..engine.request import Request, SamplingParams
from ..engine.stats import RunStats

TARGET_ONLY, SPEC, HF = "target_only", "spec", "hf"
FIXED, ADAPTIVE = "fixed", "adaptive"        # speculative contenders of measure_rows
ENGINE_CONTENDERS = (TARGET_ONLY, FIXED, ADAPTIVE)
STEP_PHASES = ("draft", "verify", "host")    # profile_steps: per-step split (+ "step", the total)
SEED = 1234                                  # measure_rows: prompt i of a row has seed SEED + i
SAMPLED_OVER_GREEDY_GOAL = 1.25              # goal: a sampled spec step costs <= 1.25x a greedy one
PHASES = ("draft", "select", "verify", "graphs", "host", "catch_up")
# Deprecated JSON keys (one release), each written with the value of its new key.
DEPRECATED_ALIASES = {"ar_tokens_per_s": "target_only_tokens_per_s",
                      "speedup_vs_ar": "speedup_vs_target_only"}


@dataclass(frozen=True)
class Temperature:
    """One sampling setting of :func:`measure_rows` (``label`` names its rows)."""

    label: str
    temperature: float
    top_p: float = 1.0


TEMPERATURES = (Temperature("T=0", 0.0), Temperature("T=0.7 top-p 0.95", 0.7, 0.95),
                Temperature("T=1", 1.0))


@dataclass
class Sample:
    """One timed (or warm-up) generation of a contender's requests."""

    outputs: list[list[int]]
    seconds: float                 # wall seconds, graph capture excluded
    tokens: int                    # tokens generated
    stats: RunStats | None = None  # engine runs only
    capture_s: float = 0.0         # graph capture / compile seconds inside this run


@dataclass
class Contender:
    """A configuration to measure: ``run()`` generates its fixed requests once."""

    name: str
    run: Callable[[], list[Sample]]


@dataclass
class Measurement:
    """Timed samples of one contender (warm-up excluded), its warm-up and capture seconds."""

    name: str
    samples: list[Sample] = field(default_factory=list)
    warmup_s: float = 0.0          # wall seconds of the untimed warm-up run
    capture_s: float = 0.0         # graph capture / compile seconds (warm-up and timed runs)
    timed_runs: int = 0            # calls of the contender's run() inside timed rounds
    fallbacks: list[str] = field(default_factory=list)   # every run's (warm-up included)

    def add_fallbacks(self, samples: Sequence[Sample]) -> None:
        for s in samples:
            for f in (s.stats.fallbacks if s.stats is not None else ()):
                if f not in self.fallbacks:
                    self.fallbacks.append(f)

    @property
    def stats(self) -> list[RunStats]:
        return [s.stats for s in self.samples if s.stats is not None]

    @property
    def tokens(self) -> int:
        """Tokens of one run (each sample of a contender generates the same count)."""
        return self.samples[-1].tokens if self.samples else 0

    @property
    def outputs(self) -> list[list[int]]:
        """Token ids of the last timed run's samples, in order."""
        per_run = len(self.samples) // max(self.timed_runs, 1)
        return [o for s in self.samples[-per_run:] for o in s.outputs] if self.samples else []

    @property
    def runs(self) -> list[list[Sample]]:
        """The timed samples, grouped by timed run (each run yields the same number)."""
        per_run = len(self.samples) // max(self.timed_runs, 1) or 1
        return [self.samples[i:i + per_run] for i in range(0, len(self.samples), per_run)]

    @property
    def rates(self) -> list[float]:
        """Per timed run (round, in order): the run's generated tokens / its timed seconds (a
        run of several batches, e.g. batch 1 over several prompts: total tokens / seconds)."""
        return [sum(s.tokens for s in r) / sec for r in self.runs
                if (sec := sum(s.seconds for s in r)) > 0]

    @property
    def tokens_per_s(self) -> float:
        """Median of ``rates`` over the timed runs."""
        rates = self.rates
        return statistics.median(rates) if rates else 0.0

    @property
    def block_sizes(self) -> dict[int, int]:
        """Decode steps per block size over every timed sample (1: target-only steps), from
        ``RunStats.block_sizes``; empty without engine stats."""
        out: dict[int, int] = {}
        for st in self.stats:
            for b, n in st.block_sizes.items():
                out[int(b)] = out.get(int(b), 0) + int(n)
        return dict(sorted(out.items()))

    @property
    def observed_step_s(self) -> dict[str, dict[str, float]]:
        """block → batch bucket → mean seconds of a decode step over every timed sample
        (``RunStats.step_time``; keys as strings, for JSON)."""
        acc: dict[tuple[int, int], list] = {}
        for st in self.stats:
            for b, per in st.step_time.items():
                for k, (n, sec) in per.items():
                    cell = acc.setdefault((int(b), int(k)), [0, 0.0])
                    cell[0] += n
                    cell[1] += sec
        out: dict[str, dict[str, float]] = {}
        for (b, k), (n, sec) in sorted(acc.items()):
            out.setdefault(str(b), {})[str(k)] = sec / n
        return out

    @property
    def tau(self) -> float:
        """Committed tokens per request per step over every timed sample (0 without stats)."""
        st = self.stats
        steps = sum(s.request_steps for s in st)
        return sum(s.committed for s in st) / steps if steps else 0.0

    @property
    def steps(self) -> float:
        """Median decode steps per sample."""
        return statistics.median(s.steps for s in self.stats) if self.stats else 0.0

    def per_step(self, phase: str) -> float:
        """Median seconds of ``phase`` per decode step."""
        st = self.stats
        return statistics.median(s.time[phase] / max(s.steps, 1) for s in st) if st else 0.0

    @property
    def time_split_per_step_s(self) -> dict[str, float]:
        return {k: self.per_step(k) for k in PHASES}

    def as_dict(self) -> dict[str, Any]:
        return {"tokens_per_s": self.tokens_per_s, "tau": self.tau, "steps": self.steps,
                "time_split_per_step_s": self.time_split_per_step_s,
                "warmup_s": self.warmup_s, "capture_s": self.capture_s,
                "fallbacks": list(self.fallbacks)}


def sync(device: torch.device) -> None:
    """Wait for queued device work so a wall clock covers it (no-op on CPU)."""
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def mean_ms(fn: Callable[[], Any], sync: Callable[[], None], n: int) -> float:
    """Mean milliseconds of ``fn`` over ``n`` back-to-back calls after one untimed call,
    ``sync`` (waiting for the device) at both ends of the timed window."""
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return 1e3 * (time.perf_counter() - t0) / n


def resolve_backend(backend: Backend | str | None) -> Backend:
    """A Backend object as is; a name (or None: the default) through the plugin registry."""
    if isinstance(backend, Backend):
        return backend
    from ..registry import Registry

    return Registry.discover().select(backend).backend


def requests(prompts: Sequence[Sequence[int]], max_new: int, temperature: float = 0.0,
             seed: int = 0) -> list[Request]:
    """One request per prompt, exactly ``max_new`` new tokens each (EOS ignored)."""
    params = SamplingParams(max_new_tokens=max_new, temperature=temperature, seed=seed,
                            ignore_eos=True)
    return [Request(tuple(p), params) for p in prompts]


def seeded_requests(prompts: Sequence[Sequence[int]], max_new: int, t: Temperature,
                    first_seed: int = SEED) -> list[Request]:
    """One request per prompt at ``t``: prompt i gets seed ``first_seed + i`` (so a prompt has
    the same seed whatever its batch), exactly ``max_new`` new tokens (EOS ignored)."""
    return [Request(tuple(p), SamplingParams(max_new_tokens=max_new, temperature=t.temperature,
                                             top_p=t.top_p, seed=first_seed + i,
                                             ignore_eos=True))
            for i, p in enumerate(prompts)]


def engine_sample(engine: Engine, reqs: Sequence[Request], spec: bool,
                  block: int | None = None) -> Sample:
    """One engine generate() of ``reqs``; the sample's seconds exclude graph capture."""
    outs, stats = engine.generate(list(reqs), spec=spec, block_size=block)
    return Sample([o.token_ids for o in outs], stats.wall_s - stats.capture_s, stats.generated,
                  stats, stats.capture_s)


def engine_contender(name: str, engine: Engine, batches: Sequence[Sequence[Request]],
                     spec: bool, block: int | None = None) -> Contender:
    """The engine decoding each of ``batches`` in turn (one sample per batch)."""
    return Contender(name, lambda: [engine_sample(engine, b, spec, block) for b in batches])


def hf_contender(hf: Any, prompts: Sequence[Sequence[int]], max_new: int,
                 name: str = HF, temperature: Temperature | None = None, seed: int = SEED,
                 batch: int | None = None) -> Contender:
    """transformers ``generate()`` (:class:`~dflash2rt.bench.hf_baseline.HFGreedy`) on
    ``prompts``, in batches of ``batch`` (default: all as one batch), exactly ``max_new`` new
    tokens each (EOS ignored, as our requests); greedy, or sampled at ``temperature`` with the
    global torch RNG seeded ``seed`` + the batch's first prompt index before each (untimed)."""
    size = batch or len(prompts)
    groups = [list(range(i, min(i + size, len(prompts)))) for i in range(0, len(prompts), size)]
    t = temperature or TEMPERATURES[0]

    def run() -> list[Sample]:
        out = []
        for g in groups:
            kw = {} if t.temperature == 0 else {"temperature": t.temperature, "top_p": t.top_p,
                                                "seed": seed + g[0]}
            outs, seconds = hf.generate([prompts[i] for i in g], max_new, **kw)
            out.append(Sample(outs, seconds, sum(map(len, outs))))
        return out
    return Contender(name, run)


def warm_caches(engine: Engine, prompts: Sequence[Sequence[int]], max_new: int,
                block: int) -> float:
    """Untimed: with graphs, one run of each mode (target-only, ``block``, adaptive) at the
    largest batch the bench uses, so the engine's one set of static caches is sized once for
    every later batch (a smaller batch then never releases and re-captures graphs). → graph
    capture seconds (0 without graphs; :func:`~dflash2rt.bench.measure.measure` warms every
    contender itself before timing)."""
    if engine.backend.graph_adapter is None:
        return 0.0
    reqs = requests(prompts, max_new)
    return sum(engine_sample(engine, reqs, spec, b).capture_s       # None: adaptive
               for spec, b in ((False, None), (True, block), (True, None)))


def measure(contenders: Sequence[Contender], repeats: int) -> dict[str, Measurement]:
    """Warm up every contender (one untimed run each, before any timing), then ``repeats``
    interleaved rounds of one timed run per contender. → measurements by contender name."""
    out = {c.name: Measurement(c.name) for c in contenders}
    if len(out) != len(contenders):
        raise ValueError("contender names must be unique")
    for c in contenders:                                     # warm-up: untimed
        t0 = time.perf_counter()
        samples = c.run()
        out[c.name].warmup_s = time.perf_counter() - t0
        out[c.name].capture_s += sum(s.capture_s for s in samples)
        out[c.name].add_fallbacks(samples)
    for _ in range(max(repeats, 1)):                         # interleaved timed rounds
        for c in contenders:
            samples = c.run()
            m = out[c.name]
            m.samples += samples
            m.timed_runs += 1
            m.capture_s += sum(s.capture_s for s in samples)
            m.add_fallbacks(samples)
    return out


def all_fallbacks(measurements: dict[str, Measurement]) -> list[str]:
    """Every fallback any contender's runs took, each once, in order."""
    out: list[str] = []
    for m in measurements.values():
        out += [f for f in m.fallbacks if f not in out]
    return out


def with_deprecated_aliases(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` plus the deprecated keys (``ar_tokens_per_s``, ``speedup_vs_ar``) with the values of
    their new names. DEPRECATED: the aliases go in the next release; read the new keys."""
    for old, new in DEPRECATED_ALIASES.items():
        if new in d:
            d[old] = d[new]
    return d
