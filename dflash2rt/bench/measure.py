"""The one measurement loop of dflash2rt: ``bench``, ``qualify`` and the training evaluation all
measure through :func:`measure` (and :func:`compare` / :func:`block_sweep` built on it).

Every contender (target-only decoding, speculative decoding at each block size, the transformers
baseline) is a :class:`Contender`: a name and a callable that runs its fixed requests once and
returns :class:`Sample` s. :func:`measure` first runs every contender once, untimed, on the same
requests (allocator, lazy initialisation, graph capture / compilation), then ``repeats``
interleaved rounds (every contender once per round, so machine noise hits all alike). Graph
capture seconds are reported apart (:attr:`Measurement.capture_s`) and subtracted from a timed
sample's seconds, so no timed window includes capture.

Temperatures: :func:`measure_rows` times, side by side in one run, every contender (target-only,
fixed-block speculation, adaptive speculation, optionally transformers) at T = 0, T = 0.7 /
top-p 0.95 and T = 1, for each batch size, with seeded requests (the same seeds for every
contender) that generate exactly ``max_new`` tokens (EOS ignored on every side).

Step cost: :func:`profile_steps` is a separate, untimed profiling pass (never inside a timed
window) that synchronises the device before and after every step body (draft + select, verify;
each graph replay with graphs), so its per-step split (draft, verify, host) is device time on
GPUs too; :func:`measure_rows` runs it after the timed rounds and reports the
sampled / greedy step-cost ratio at the same block size.

Naming: the engine without a draft is "target-only" (JSON keys ``target_only_*``,
``speedup_vs_target_only``). The older ``ar_tokens_per_s`` / ``speedup_vs_ar`` keys are still
written as deprecated aliases for one release (:func:`with_deprecated_aliases`).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

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
SAMPLED_OVER_GREEDY_GOAL = 1.25              # issue goal: sampled spec step <= 1.25x greedy
PHASES = ("draft", "select", "verify", "graphs", "host")
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
    def tokens_per_s(self) -> float:
        """Median over timed runs of the run's generated tokens / its timed seconds (a run of
        several batches, e.g. batch 1 over several prompts: total tokens / total seconds)."""
        rates = [sum(s.tokens for s in r) / sec for r in self.runs
                 if (sec := sum(s.seconds for s in r)) > 0]
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


def _compare_dict(tonly: Measurement, spec: Measurement, hfr: Measurement | None,
                  prompts: int, all_m: dict[str, Measurement],
                  adaptive: Measurement | None = None) -> dict[str, Any]:
    """The compare() dict (target-only vs speculative at one block size [vs transformers])."""
    res: dict[str, Any] = {
        "prompts": prompts, "tokens": spec.tokens, "tau": spec.tau,
        "target_only_tokens_per_s": tonly.tokens_per_s, "spec_tokens_per_s": spec.tokens_per_s,
        "hf_tokens_per_s": hfr.tokens_per_s if hfr else None,
        "greedy_equal": spec.outputs == tonly.outputs,
        "hf_equal": hfr.outputs == tonly.outputs if hfr else None,
        # the engine's own clocks inside the timed runs (no device sync between phases: on a
        # GPU this is launch time); the synced split is measure_rows' step_profile
        "time_split_per_step_s": spec.time_split_per_step_s,
        "steps": spec.steps,
    }
    res["speedup_vs_target_only"] = res["spec_tokens_per_s"] / res["target_only_tokens_per_s"]
    res["speedup_vs_hf"] = res["spec_tokens_per_s"] / res["hf_tokens_per_s"] if hfr else None
    res["efficiency"] = res["speedup_vs_target_only"] / res["tau"] if res["tau"] else None
    res["mismatched_prompts"] = [i for i, (a, b) in enumerate(zip(spec.outputs, tonly.outputs))
                                 if a != b]
    if adaptive is not None:
        res["adaptive_tokens_per_s"] = adaptive.tokens_per_s
        res["adaptive_tau"] = adaptive.tau
        res["adaptive_greedy_equal"] = adaptive.outputs == tonly.outputs
    res["capture_s"] = {k: v.capture_s for k, v in all_m.items()}
    res["warmup_s"] = {k: v.warmup_s for k, v in all_m.items()}
    res["fallbacks"] = all_fallbacks(all_m)
    return res


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
    res = _compare_dict(m[TARGET_ONLY], m[SPEC], m.get(HF), len(batch), m)
    log(f"batch {len(batch)}: target-only {res['target_only_tokens_per_s']:.1f} tok/s, spec "
        f"{res['spec_tokens_per_s']:.1f} tok/s (x{res['speedup_vs_target_only']:.2f}, "
        f"tau {res['tau']:.2f})"
        + (f", hf {res['hf_tokens_per_s']:.1f} tok/s" if m.get(HF) else ""))
    return with_deprecated_aliases(res)


@contextlib.contextmanager
def synced_phases(device: torch.device,
                  clocks: dict[int, tuple[dict[str, float], dict[str, float]]]
                  ) -> Iterator[None]:
    """While active (the profiling pass only, never a timed run): every step body
    (``Stepper._run``: one eager body, or one graph replay) runs between two device syncs
    (:func:`sync`), and its seconds (graph capture left out) go to
    ``clocks[id(clock)][1]["draft"]`` (draft + select) or ``["verify"]`` (verify + accept +
    commit; target-only: forward + sample + commit), where ``clock`` is the time dict the
    engine passed the body: a run's ``RunStats.time`` for its decode steps, a scratch dict for
    anything else (adaptive calibration), so a run's part is told apart."""
    from ..engine.graphed import Stepper

    run0 = Stepper._run

    def run(self: Stepper, kind: str, *args: Any, **kwargs: Any) -> Any:
        clock = kwargs.get("clock", args[-1] if args else None)
        acc = clocks.setdefault(id(clock), (clock, dict.fromkeys(
            ("draft", "verify", "capture"), 0.0)))[1]
        sync(device)
        cap, t0 = self.capture_s, time.perf_counter()
        out = run0(self, kind, *args, **kwargs)
        sync(device)
        seconds, captured = time.perf_counter() - t0, self.capture_s - cap
        acc["capture"] += captured
        acc["draft" if kind == "draft" else "verify"] += seconds - captured
        return out

    Stepper._run = run                                   # type: ignore[method-assign]
    try:
        yield
    finally:
        Stepper._run = run0                              # type: ignore[method-assign]


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
        with synced_phases(engine.backend.device, clocks):
            st = engine.generate(list(b), spec=spec, block_size=block)[1]
        acc = next((a for c, a in clocks.values() if c is st.time), None)
        if acc is None and st.steps:
            raise RuntimeError("the profiling pass saw no step body of the run's decode steps: "
                               "the engine's step bodies no longer go through Stepper._run")
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


def _key(t: Temperature, contender: str) -> str:
    return f"{t.label}|{contender}"


def _groups(n: int, batch: int) -> list[list[int]]:
    """Prompt indices 0..n-1 in consecutive batches of ``batch``."""
    return [list(range(i, min(i + batch, n))) for i in range(0, n, batch)]


def measure_rows(engine: Engine, prompts_by_batch: dict[int, Sequence[Sequence[int]]],
                 max_new: int, block: int, repeats: int, hf: Any | None = None,
                 temperatures: Sequence[Temperature] = TEMPERATURES,
                 profile: Sequence[str] = ENGINE_CONTENDERS,
                 log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every contender side by side at every temperature, per batch size: for batch size
    ``b``, ``prompts_by_batch[b]`` decoded in batches of ``b`` (batch 1: each prompt alone) by
    target-only decoding, fixed-block speculation (``block``), adaptive speculation
    (``block_size=None``) and, with ``hf``, transformers ``generate()``. Requests are seeded
    (prompt i: seed ``SEED + i``, the same for every contender) and generate exactly
    ``max_new`` tokens, EOS ignored. All contenders of a batch size (every temperature) are
    warmed up before any is timed, then timed in ``repeats`` interleaved rounds; after the
    timed rounds, the profiling pass (:func:`profile_steps`) splits the step cost of each
    engine contender named in ``profile`` (the sampled / greedy ratio needs ``FIXED``).

    → ``{"rows": [...], "step_profile": {...}, "compare": {batch: compare()-style dict at the
    first temperature (T = 0)}, "capture_s": {batch: seconds}}``. A row (one per temperature
    × batch): ``temperature`` (label), ``temperature_value``, ``top_p``, ``batch``,
    ``prompts``, ``tokens``, ``seeds``, ``contenders`` (name → tokens_per_s, tau, steps,
    speedup_vs_target_only, block_sizes, step_split_s, ...), and at T = 0 ``greedy_equal`` /
    ``mismatched_prompts`` (speculative == target-only, for every prompt)."""
    rows: list[dict[str, Any]] = []
    prof_rows: list[dict[str, Any]] = []
    ratios: list[dict[str, Any]] = []
    legacy: dict[int, dict[str, Any]] = {}
    capture: dict[int, float] = {}
    modes = ((TARGET_ONLY, False, None), (FIXED, True, block), (ADAPTIVE, True, None))
    for batch, prompts in prompts_by_batch.items():
        groups = _groups(len(prompts), batch)
        batches: dict[str, list[list[Request]]] = {}
        contenders = []
        for t in temperatures:
            reqs = seeded_requests(prompts, max_new, t)
            batches[t.label] = [[reqs[i] for i in g] for g in groups]
            contenders += [engine_contender(_key(t, name), engine, batches[t.label], spec, b)
                           for name, spec, b in modes]
            if hf is not None:
                contenders.append(hf_contender(hf, prompts, max_new, _key(t, HF), t, SEED,
                                               batch))
        m = measure(contenders, repeats)
        capture[batch] = sum(x.capture_s for x in m.values())
        prof: dict[tuple[str, str], dict[str, Any]] = {}
        if profile:                          # the profiling pass: after every timed round
            for t in temperatures:
                for name, spec, b in (x for x in modes if x[0] in profile):
                    p = prof[(t.label, name)] = profile_steps(engine, batches[t.label], spec, b)
                    prof_rows.append({"temperature": t.label, "batch": batch,
                                      "contender": name, "block_size": b,
                                      **{k: p[k] for k in (*STEP_PHASES, "step", "steps",
                                                           "tau", "block_sizes")}})
            greedy = prof.get((temperatures[0].label, FIXED))
            for t in temperatures[1:]:
                if greedy and greedy["step"] > 0 and temperatures[0].temperature == 0:
                    ratios.append({"batch": batch, "temperature": t.label, "block_size": block,
                                   "greedy_step_s": greedy["step"],
                                   "sampled_step_s": prof[(t.label, FIXED)]["step"],
                                   "ratio": prof[(t.label, FIXED)]["step"] / greedy["step"]})
        for t in temperatures:
            rows.append(_row(t, batch, prompts, m, prof, block, hf is not None))
            log(_row_line(rows[-1]))
        t0 = temperatures[0]
        if t0.temperature == 0:
            legacy[batch] = with_deprecated_aliases(_compare_dict(
                m[_key(t0, TARGET_ONLY)], m[_key(t0, FIXED)], m.get(_key(t0, HF)),
                len(prompts), {k.split("|", 1)[1]: v for k, v in m.items()
                               if k.startswith(t0.label + "|")}, m[_key(t0, ADAPTIVE)]))
            legacy[batch]["tokens"] = rows[-len(temperatures)]["tokens"]
    return {"rows": rows, "compare": legacy, "capture_s": capture,
            "step_profile": {"rows": prof_rows, "sampled_over_greedy": ratios,
                             "goal_sampled_over_greedy": SAMPLED_OVER_GREEDY_GOAL,
                             "method": "a separate untimed pass after the timed rounds: one "
                                       "generate() per configuration, device synchronised "
                                       "before and after every step body (graph replay with "
                                       "graphs) and every step; seconds per decode step"}}


def _row(t: Temperature, batch: int, prompts: Sequence[Sequence[int]],
         m: dict[str, Measurement], prof: dict[tuple[str, str], dict[str, Any]], block: int,
         with_hf: bool) -> dict[str, Any]:
    tonly = m[_key(t, TARGET_ONLY)]
    base = tonly.tokens_per_s
    contenders: dict[str, dict[str, Any]] = {}
    for name in (*ENGINE_CONTENDERS, *((HF,) if with_hf else ())):
        x = m[_key(t, name)]
        d: dict[str, Any] = {"tokens_per_s": x.tokens_per_s,
                             "speedup_vs_target_only": x.tokens_per_s / base if base else None}
        if name != HF:
            d.update(tau=x.tau, steps=x.steps,
                     block_sizes={str(k): v for k, v in x.block_sizes.items()},
                     step_split_s=prof.get((t.label, name)))
        if name == FIXED:
            d["block_size"] = block
        d.update(capture_s=x.capture_s, warmup_s=x.warmup_s, fallbacks=list(x.fallbacks))
        contenders[name] = d
    row: dict[str, Any] = {
        "temperature": t.label, "temperature_value": t.temperature, "top_p": t.top_p,
        "batch": batch, "prompts": len(prompts),
        "tokens": sum(s.tokens for s in tonly.runs[-1]) if tonly.samples else 0,
        "seeds": [SEED + i for i in range(len(prompts))], "contenders": contenders,
        "greedy_equal": None}
    if t.temperature == 0:
        mism = {name: [i for i, (a, b) in enumerate(zip(m[_key(t, name)].outputs,
                                                         tonly.outputs)) if a != b]
                for name in (FIXED, ADAPTIVE)}
        row["greedy_equal"] = not any(mism.values())
        row["mismatched_prompts"] = mism
        if with_hf:
            row["hf_equal"] = m[_key(t, HF)].outputs == tonly.outputs
    return row


def _row_line(row: dict[str, Any]) -> str:
    c = row["contenders"]
    spec = ", ".join(f"{name} {c[name]['tokens_per_s']:.1f} tok/s (x"
                     f"{c[name]['speedup_vs_target_only'] or 0:.2f}, tau {c[name]['tau']:.2f})"
                     for name in (FIXED, ADAPTIVE))
    return (f"{row['temperature']}, batch {row['batch']}: target-only "
            f"{c[TARGET_ONLY]['tokens_per_s']:.1f} tok/s, {spec}"
            + (f", hf {c[HF]['tokens_per_s']:.1f} tok/s" if HF in c else "")
            + ("" if row["greedy_equal"] is None else
               f"; greedy spec == target-only: {row['greedy_equal']}"))


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
