"""The one measurement loop of dflash2rt: ``bench``, ``qualify`` and the training evaluation all
measure through :func:`measure` (and :func:`compare` / :func:`block_sweep` built on it).

Every contender (target-only decoding, speculative decoding at each block size, the transformers
baseline) is a :class:`Contender`: a name and a callable that runs its fixed requests once and
returns :class:`Sample` s. :func:`measure` first runs every contender once, untimed, on the same
requests (allocator, lazy initialisation, graph capture / compilation), then ``repeats``
interleaved rounds (every contender once per round, so machine noise hits all alike). Graph
capture seconds are reported apart (:attr:`Measurement.capture_s`) and subtracted from a timed
sample's seconds, so no timed window includes capture.

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
PHASES = ("draft", "select", "verify", "graphs", "host")
# Deprecated JSON keys (one release), each written with the value of its new key.
DEPRECATED_ALIASES = {"ar_tokens_per_s": "target_only_tokens_per_s",
                      "speedup_vs_ar": "speedup_vs_target_only"}


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
    def tokens_per_s(self) -> float:
        """Median over samples of generated tokens / timed seconds."""
        rates = [s.tokens / s.seconds for s in self.samples if s.seconds > 0]
        return statistics.median(rates) if rates else 0.0

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
                 name: str = HF) -> Contender:
    """transformers ``generate()`` (:class:`~dflash2rt.bench.hf_baseline.HFGreedy`) on
    ``prompts`` as one batch."""
    def run() -> list[Sample]:
        outs, seconds = hf.generate(prompts, max_new)
        return [Sample(outs, seconds, sum(map(len, outs)))]
    return Contender(name, run)


def warm_caches(engine: Engine, prompts: Sequence[Sequence[int]], max_new: int,
                block: int) -> float:
    """Untimed: with graphs, one run of each mode at the largest batch the bench uses, so the
    engine's one set of static caches is sized once for every later batch (a smaller batch
    then never releases and re-captures graphs). → graph capture seconds (0 without graphs;
    :func:`~dflash2rt.bench.measure.measure` warms every contender itself before timing)."""
    if engine.backend.graph_adapter is None:
        return 0.0
    reqs = requests(prompts, max_new)
    return sum(engine_sample(engine, reqs, spec, b).capture_s
               for spec, b in ((False, None), (True, block)))


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


def compare(batch: Sequence[Sequence[int]], engine: Engine, hf: Any | None, max_new: int,
            block: int, repeats: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Target-only, speculative (``block``) and, with ``hf``, transformers greedy on ``batch``
    (one request per prompt, decoded as one batch), warmed up, then interleaved."""
    reqs = requests(batch, max_new)
    contenders = [engine_contender(TARGET_ONLY, engine, [reqs], False),
                  engine_contender(SPEC, engine, [reqs], True, block)]
    if hf is not None:
        contenders.append(hf_contender(hf, batch, max_new))
    m = measure(contenders, repeats)
    tonly, spec, hfr = m[TARGET_ONLY], m[SPEC], m.get(HF)
    res: dict[str, Any] = {
        "prompts": len(batch), "tokens": spec.tokens, "tau": spec.tau,
        "target_only_tokens_per_s": tonly.tokens_per_s, "spec_tokens_per_s": spec.tokens_per_s,
        "hf_tokens_per_s": hfr.tokens_per_s if hfr else None,
        "greedy_equal": spec.outputs == tonly.outputs,
        "hf_equal": hfr.outputs == tonly.outputs if hfr else None,
        "time_split_per_step_s": spec.time_split_per_step_s,
        "steps": spec.steps,
    }
    res["speedup_vs_target_only"] = res["spec_tokens_per_s"] / res["target_only_tokens_per_s"]
    res["speedup_vs_hf"] = res["spec_tokens_per_s"] / res["hf_tokens_per_s"] if hfr else None
    res["efficiency"] = res["speedup_vs_target_only"] / res["tau"] if res["tau"] else None
    res["mismatched_prompts"] = [i for i, (a, b) in enumerate(zip(spec.outputs, tonly.outputs))
                                 if a != b]
    res["capture_s"] = {k: v.capture_s for k, v in m.items()}
    res["warmup_s"] = {k: v.warmup_s for k, v in m.items()}
    res["fallbacks"] = all_fallbacks(m)
    log(f"batch {len(batch)}: target-only {res['target_only_tokens_per_s']:.1f} tok/s, spec "
        f"{res['spec_tokens_per_s']:.1f} tok/s (x{res['speedup_vs_target_only']:.2f}, "
        f"tau {res['tau']:.2f})"
        + (f", hf {res['hf_tokens_per_s']:.1f} tok/s" if hfr else ""))
    return with_deprecated_aliases(res)


def block_sweep(prompts: Sequence[Sequence[int]], engine: Engine, max_new: int,
                blocks: Sequence[int], repeats: int,
                log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """τ and speedup per block size (batch 1, each prompt alone), with the fitted speedup model.
    Every block size (and target-only) is warmed up before any of them is timed."""
    batches = [requests([p], max_new) for p in prompts]
    contenders = [engine_contender(TARGET_ONLY, engine, batches, False)] + \
        [engine_contender(f"spec{b}", engine, batches, True, b) for b in blocks]
    m = measure(contenders, repeats)
    tonly = m[TARGET_ONLY]
    t_target = statistics.median(s.stats.wall_s - s.stats.capture_s - s.stats.time["prefill"]
                                 for s in tonly.samples) / max_new
    rows = []
    for b in blocks:
        spec = m[f"spec{b}"]
        st = spec.stats
        t_draft = statistics.median((s.time["draft"] + s.time["select"]) / s.steps for s in st)
        t_verify = statistics.median((s.time["verify"] + s.time["graphs"] + s.time["host"])
                                     / s.steps for s in st)        # graphs: draft + verify
        measured = spec.tokens_per_s / tonly.tokens_per_s
        rows.append(with_deprecated_aliases({
            "block_size": b, "tau": spec.tau, "speedup_vs_target_only": measured,
            "t_target_s": t_target, "t_draft_s": t_draft, "t_verify_s": t_verify,
            "predicted_speedup": spec.tau * t_target / (t_draft + t_verify),
            "capture_s": spec.capture_s, "fallbacks": spec.fallbacks}))
        log(f"block {b:2d}: tau {spec.tau:.2f}, speedup x{measured:.2f} (model x"
            f"{rows[-1]['predicted_speedup']:.2f})")
    return rows
