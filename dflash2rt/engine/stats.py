"""Run statistics: τ, accept-length histogram, speculation counters, throughput, time split,
and every fallback."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunStats:
    mode: str                      # "spec" or "target-only"
    backend: str
    device: str
    block_size: int                # adaptive: the largest candidate (the cache's block room)
    requests: int = 0
    adaptive: bool = False         # block size chosen per step (engine/policy/)
    # adaptive: why the schedule ran this whole call target-only ("": it speculated)
    call_plan: str = ""
    # adaptive: set when the schedule learned from distorted timings ($DFLASH2RT_PERTURB_COSTS)
    cost_noise: str = ""
    block_sizes: dict[int, int] = field(default_factory=dict)  # block → steps (1: target-only)
    candidates: dict[int, int] = field(default_factory=dict)   # candidates per draft slot →
                                   # requests selecting at that count (spec runs; engine.candidates)
    block_verified: int = 0        # requests verified as a block (spec runs; engine.verification)
    costs: dict[int, dict[int, float]] = field(default_factory=dict)  # block → bucket → seconds
    # block → bucket → [steps, seconds] of this run's real decode steps (capture excluded):
    # what the steps cost, beside ``costs`` (what the schedule's table predicted)
    step_time: dict[int, dict[int, list]] = field(default_factory=dict)
    calibration_steps: int = 0     # adaptive: timing steps whose results were discarded
    calibration_s: float = 0.0     # their seconds (part of wall_s; capture excluded)
    draft_deferred: int = 0        # adaptive: positions whose draft context K/V a target-only
                                   # step deferred to the next spec step (batched, eager)
    steps: int = 0                 # decode steps (each covers every active request)
    request_steps: int = 0         # Σ over steps of active requests
    committed: int = 0             # tokens committed by decode steps (before truncation)
    generated: int = 0             # tokens returned to the caller
    accept_hist: list[int] = field(default_factory=list)   # index = accepted drafts per step
    # Speculation counters (vLLM's spec-decode metrics; dflash2rt.metrics exports them), from
    # each step's verification outcome, the host copy of the step's one sync, before any stop
    # or length truncation. A draft: one request's speculative step of block b >= 2 (b - 1
    # draft tokens); target-only steps, adaptive ones included, are not drafts. Position i:
    # draft slot i + 1 (the token after the anchor is position 0). A slot is reached when the
    # step's block has it and every slot before it was accepted.
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)   # drafts that accepted slot i
    reached_per_pos: list[int] = field(default_factory=list)    # drafts that verified slot i
    # Seconds per phase. Eager steps, per step body: "draft" (draft + select) and "verify"
    # (verify + accept + commit; target-only: forward + sample + commit), then "host" (the one
    # sync and the host work). Graph-replaying steps: "graphs" (launching the step's graphs and
    # waiting for them at the sync; `dflash2rt bench step-profile` splits it per graph), then host.
    # "select" stays for reports that sum draft + select. "catch_up": adaptive runs, the deferred
    # draft context K/V projected (eagerly, graphs or not) before a spec step (``draft_deferred``).
    time: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("prefill", "draft", "select", "verify", "graphs", "host", "catch_up"), 0.0))
    wall_s: float = 0.0
    capture_s: float = 0.0         # graph warm-up + capture inside decode steps (part of wall_s)
    # Kernels compiled ahead (engine/precompile.py) before this call's first step: seconds
    # (the shape-only trace and the compiles; not part of wall_s) and, per kernel, the variants
    # compiled (0 / empty where nothing was left to compile or the kernels do not compile here)
    compile_s: float = 0.0
    compile_variants: dict[str, int] = field(default_factory=dict)
    syncs: int = 0                 # device→host synchronisations in decode steps
    constraint_host_masks: int = 0  # generic constraint hooks (target-only): host→device mask
                                    # uploads, one per step (token automata need none)
    fallbacks: list[str] = field(default_factory=list)   # the run's Fallbacks.reported
    model_pass: str | None = None  # what the backend's model pass did (CPU: oneDNN-packed linears)
    watermarked: bool = False      # sampled tokens carry a watermark (never the key itself)
    tensor_parallel: str = ""      # a tensor-parallel run: ranks and process group ("" if none)
    # Graph mode: per graph ("draft greedy", "verify sampled", ...) and bucket this run used, its
    # replays and eager runs in this run, whether it is captured / verified, why it runs eagerly.
    graphs: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)

    @property
    def tau(self) -> float:
        """Mean committed tokens per request per step (1 for target-only decoding)."""
        return self.committed / self.request_steps if self.request_steps else 0.0

    def __post_init__(self) -> None:
        if self.mode == "spec" and not self.accepted_per_pos:   # every position, even if unused
            self.accepted_per_pos = [0] * max(self.block_size - 1, 0)
            self.reached_per_pos = [0] * max(self.block_size - 1, 0)

    @property
    def mean_acceptance_length(self) -> float:
        """Mean tokens committed per draft, the bonus token included (vLLM's mean acceptance
        length: 1 + accepted / drafts); 0 when the run made no draft."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted tokens (0 when nothing was drafted)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def acceptance_rate_per_pos(self) -> list[float]:
        """vLLM's per-position acceptance rate: drafts that accepted position i over all drafts
        (``vllm/v1/spec_decode/metrics.py``: accepted_per_pos / num_drafts; 0 without drafts).
        With adaptive block sizes a draft may lack position i: see the conditional rate."""
        n = self.num_drafts
        return [a / n if n else 0.0 for a in self.accepted_per_pos]

    @property
    def conditional_acceptance_rate_per_pos(self) -> list[float]:
        """P(position i accepted | reached): over the drafts that verified position i (the
        block had it and every earlier position was accepted); 0 where never reached."""
        return [a / r if r else 0.0 for a, r in zip(self.accepted_per_pos, self.reached_per_pos)]

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def step_s(self) -> float:
        """Mean decode-step latency, graph capture and calibration steps excluded."""
        return (self.wall_s - self.time["prefill"] - self.capture_s - self.calibration_s) \
            / self.steps if self.steps else 0.0

    def record_accepts(self, accepted: list[int], block: int) -> None:
        """One decode step of block ``block`` (1: target-only): drafts accepted per live row."""
        self.block_sizes[block] = self.block_sizes.get(block, 0) + 1
        if block >= 2:
            self._record_drafts(accepted, block - 1)
        for a in accepted:
            while len(self.accept_hist) <= a:
                self.accept_hist.append(0)
            self.accept_hist[a] += 1
        self.request_steps += len(accepted)
        self.committed += sum(a + 1 for a in accepted)

    def record_step_time(self, block: int, bucket: int, seconds: float) -> None:
        """One real decode step of ``block`` at batch ``bucket`` took ``seconds``."""
        cell = self.step_time.setdefault(block, {}).setdefault(bucket, [0, 0.0])
        cell[0] += 1
        cell[1] += seconds

    @property
    def observed_costs(self) -> dict[int, dict[int, float]]:
        """block → bucket → mean seconds of this run's decode steps (``step_time``)."""
        return {b: {k: s / n for k, (n, s) in sorted(per.items()) if n}
                for b, per in sorted(self.step_time.items())}

    def _record_drafts(self, accepted: list[int], gamma: int) -> None:
        """Drafts of ``gamma`` tokens: counts, and per position reached / accepted."""
        for counts in (self.accepted_per_pos, self.reached_per_pos):
            counts.extend([0] * (gamma - len(counts)))
        self.num_drafts += len(accepted)
        self.num_draft_tokens += gamma * len(accepted)
        for a in accepted:
            self.num_accepted_tokens += a
            for i in range(min(a + 1, gamma)):          # positions 0 .. a reached (a < gamma)
                self.reached_per_pos[i] += 1
                if i < a:
                    self.accepted_per_pos[i] += 1

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.update(tau=self.tau, tokens_per_s=self.tokens_per_s,
                 observed_costs=self.observed_costs,
                 mean_acceptance_length=self.mean_acceptance_length,
                 acceptance_rate=self.acceptance_rate,
                 acceptance_rate_per_pos=self.acceptance_rate_per_pos,
                 conditional_acceptance_rate_per_pos=self.conditional_acceptance_rate_per_pos)
        return d
