"""The engine: one decode loop over a Runner and a Policy.

``Engine.generate`` begins the call's policy, prefills, then repeats choose a block → the
Runner's step (its bodies, eager or replayed from graphs, and its one device→host transfer) →
collect the tokens → drop finished requests → observe, until every request is done, and ends
the policy. Speculative decoding is adaptive by default (``block_size=None``): the engine's
``AdaptivePolicy`` over its measured ``table`` (policy/); ``block_size=N`` is a
``FixedPolicy``. What falls back during a run goes to that run's Fallbacks and ends in its
RunStats.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import torch

from ..backend import Backend, Fallbacks, same_device
from ..errors import InvalidInputError, ResourceError
from ..models.memory import memory_note
from ..models.pair import ModelPair
from ..ops.procs import unpack_logprobs
from ..watermark import WatermarkKey
from ..watermark.sampler import require_fp64
from .candidates import check_no_counts, counts as candidate_counts
from .verification import block_rows, check_rule
from .output import Collector, drop_finished, host_masks, verify_masks
from .precompile import CompileAhead
from .policy import Call, Live, Policy
from .policy.adaptive import AdaptivePolicy
from .policy.fixed import FixedPolicy
from .policy.table import MeasuredTable, bucket_of
from .request import Request, RequestOutput, block_size_or_default
from .runner import Runner, Step
from .stages import selector_params
from .state import BatchState
from .stats import RunStats

OnTokens = Callable[[int, list[int]], None]
CALIBRATION_KEY = 1 << 62      # calibration steps draw uniforms under keys no real step uses


class Engine:
    """Speculative (or target-only) decoding of a batch of requests on one backend.
    ``table``: the measured cost table adaptive calls learn into (None: a new one; pass one
    to several engines to share what they measure). ``policy``: the adaptive policy (None: a
    measured one over ``table``, made on the first adaptive call); assign one to change it."""

    def __init__(self, pair: ModelPair, backend: Backend,
                 table: MeasuredTable | None = None) -> None:
        if not isinstance(backend, Backend):
            raise InvalidInputError(
                f"Engine needs a Backend, got {backend!r}: get one by name with "
                "dflash2rt.get_backend(name)")
        self.pair, self.backend = pair, backend
        self.table = MeasuredTable() if table is None else table
        self.policy: AdaptivePolicy | None = None
        # Called with each step's host rows (prefill's, then every decode step's) once the
        # step has committed them: a tensor-parallel run's cross-rank check (distributed/).
        self.step_check: Callable[[list], None] | None = None
        if pair.dtype not in backend.dtypes:
            raise InvalidInputError(
                f"backend {backend.name!r} does not run {pair.dtype} models (it supports "
                f"{', '.join(str(d).replace('torch.', '') for d in backend.dtypes)}); "
                "load the models in one of those dtypes")
        if not same_device(pair.device, backend.device):
            raise InvalidInputError(f"models are on {pair.device} but backend {backend.name!r} "
                                    f"runs on {backend.device}; load the models there")
        # Every run's first fallbacks: the backend's standing ones, then the model pass's.
        self._standing_fallbacks = Fallbacks(backend.standing_fallbacks)
        self.model_pass = backend.prepare_models(
            [m for m in (pair.target, pair.draft) if m is not None], self._standing_fallbacks)
        self.runner = Runner(pair, backend)
        self.compiler = CompileAhead(pair, backend)   # kernels compiled before the first step

    def close(self) -> None:
        """Release the captured graphs and the static caches now (they are kept across
        generate() calls so that later calls replay instead of capturing again)."""
        self.runner.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(self, requests: Sequence[Request], spec: bool = True,
                 block_size: int | None = None, on_tokens: OnTokens | None = None,
                 watermark: WatermarkKey | None = None, *,
                 on_finish: Callable[[int], None] | None = None
                 ) -> tuple[list[RequestOutput], RunStats]:
        """Decode every request to completion; ``on_tokens(i, ids)`` streams new tokens,
        ``on_finish(i)`` is called once as request i ends (after its last ``on_tokens``).
        ``spec`` with ``block_size=None``: adaptive speculation (``self.policy``); an int
        >= 2: that fixed block. ``watermark``: a WatermarkKey that marks every sampled
        request's tokens (``dflash2rt.watermark.generate``; greedy requests are unchanged and
        unmarked); the key stays out of stats and outputs."""
        policy = self._policy(requests, spec, block_size, watermark, on_tokens, on_finish)
        call = policy.begin(requests)
        stats, out, fallbacks = self._new_run(requests, call, on_tokens, watermark, on_finish)
        with torch.inference_mode(), self.backend.run_context():
            stats.compile_s, stats.compile_variants = self.compiler.run(
                _blocks(policy, call), fallbacks.report)          # before the clock starts
            start = time.perf_counter()
            st = self.runner.start(requests, call.spec, call.room, watermark, fallbacks.report,
                                   stats.time, self.step_check)
            try:
                st = self._prefill(st, requests, out, stats, fallbacks, start)
                while st.size:
                    block = policy.choose(Live(st.rows, out.remaining(st.rows),
                                               lambda k, st=st: self._probe(st, k, out, stats)))
                    step = self.runner.step(st, block, verify_masks(st, out, stats, block))
                    st, seconds = self._collect(st, step, out, stats)
                    policy.observe(step.rows, block, step.accepted, seconds + step.catch_up_s)
                policy.end(sum(len(o.token_ids) for o in out.outputs),
                           time.perf_counter() - start - stats.calibration_s)
            except BaseException as exc:
                self.close()              # release graphs now, outside any capture
                if isinstance(exc, torch.OutOfMemoryError):
                    raise _out_of_memory(exc, len(requests), self.backend.device) from exc
                raise
            finally:
                self._end_run(stats, fallbacks, policy)
        stats.wall_s = time.perf_counter() - start
        stats.generated = sum(len(o.token_ids) for o in out.outputs)
        return out.finish(), stats

    def _policy(self, requests: Sequence[Request], spec: bool, block_size: int | None,
                watermark: WatermarkKey | None, on_tokens: OnTokens | None = None,
                on_finish: Callable[[int], None] | None = None) -> Policy:
        """The call's policy, after checking what the call asks: adaptive (``self.policy``)
        for speculation without a block size, else a fixed block (1 for target-only)."""
        pair = self.pair
        if watermark is not None:
            if not isinstance(watermark, WatermarkKey):
                raise InvalidInputError(f"watermark must be a WatermarkKey (load one with "
                                        f"WatermarkKey.from_file), got {type(watermark).__name__}")
            require_fp64(self.backend.has_fp64)
        if not requests:
            raise InvalidInputError("no requests: give at least one prompt")
        if not isinstance(spec, bool):
            raise InvalidInputError(f"spec must be True (speculative decoding) or False "
                                    f"(target only), got {spec!r}")
        if on_tokens is not None and not callable(on_tokens):
            raise InvalidInputError(f"on_tokens must be None or a callable on_tokens(i, ids), "
                                    f"got {type(on_tokens).__name__}")
        if on_finish is not None and not callable(on_finish):
            raise InvalidInputError(f"on_finish must be None or a callable on_finish(i), got "
                                    f"{type(on_finish).__name__}")
        if spec and pair.draft is None:
            raise InvalidInputError("speculative decoding needs a draft model (or use spec=False)")
        if spec and block_size is None:
            if self.policy is None:
                self.policy = AdaptivePolicy.measured(pair.draft.cfg.block_size, self.table)
            policy: Policy = self.policy
        else:
            block = block_size_or_default(
                block_size, pair.draft.cfg.block_size if pair.draft is not None else 1,
                pair.target.cfg.max_position_embeddings)
            if spec and block < 2:
                raise InvalidInputError(f"block_size must be >= 2 for speculative decoding "
                                        f"(None: adaptive), got {block}")
            policy = FixedPolicy(block, spec)
        for q in requests:
            q.validate(pair.target.cfg.vocab_size)
        if not spec:
            check_no_counts(requests)
        check_rule(requests, spec, watermark)
        return policy

    def _new_run(self, requests: Sequence[Request], call: Call, on_tokens: OnTokens | None,
                 watermark: WatermarkKey | None, on_finish: Callable[[int], None] | None = None
                 ) -> tuple[RunStats, Collector, Fallbacks]:
        """The run's stats, its token collector and its fallback recorder."""
        stats = RunStats("spec" if call.spec else "target-only", self.backend.name,
                         str(self.backend.device), call.room if call.spec else 1,
                         requests=len(requests), adaptive=call.adaptive, call_plan=call.plan,
                         model_pass=self.model_pass, watermarked=watermark is not None)
        stats.cost_noise = call.cost_noise
        pair = self.pair
        if call.spec:
            stats.candidates = candidate_counts(requests, selector_params(pair).top_k)
            stats.block_verified = block_rows(requests)
        out = Collector(requests, pair.tokenizer, pair.eos_token_ids, on_tokens,
                        pair.target.cfg.vocab_size, on_finish)
        return stats, out, Fallbacks(self._standing_fallbacks.reported)

    def _prefill(self, st: BatchState, requests: Sequence[Request], out: Collector,
                 stats: RunStats, fallbacks: Fallbacks, start: float) -> BatchState:
        """Prefill and its first tokens → the batch left."""
        note = memory_note(self.backend.device)     # free memory estimated, or unchecked
        if note:
            fallbacks.report(note)
        host_masks(st, out, stats)                     # generic hooks: the first token's
        host = self.runner.prefill(st, [q.prompt_ids for q in requests])
        for i, h in enumerate(host):
            out.add(st.rows[i], [h[0]], None if len(h) == 2 else
                    unpack_logprobs(h[2:], 1, st.procs.logprobs, st.procs.wants[i]))
        stats.time["prefill"] = time.perf_counter() - start
        st = drop_finished(st, out)
        host_masks(st, out, stats)
        return st

    def _collect(self, st: BatchState, step: Step, out: Collector,
                 stats: RunStats) -> tuple[BatchState, float]:
        """A step's host work: its tokens out, lengths mirrored, finished requests dropped,
        the next masks of generic constraint hooks → (the batch left, the step's seconds)."""
        stats.syncs += 1
        stats.time["graphs"] += step.device_s
        stats.time["catch_up"] += step.catch_up_s
        stats.draft_deferred += step.deferred
        stats.steps += 1
        stats.record_accepts(step.accepted, step.block)
        for i, h in enumerate(step.host):
            out.add(st.rows[i], step.tokens(i), step.logprobs(i, st))
            st.host_lens[i] += h[0] + 1
        st = drop_finished(st, out)
        host_masks(st, out, stats)
        end = time.perf_counter()
        stats.time["host"] += end - step.host_t0
        seconds = end - step.t0 - step.capture_s
        stats.record_step_time(step.block, bucket_of(len(step.rows)), seconds)
        return st, seconds

    def _probe(self, st: BatchState, k: int, out: Collector,
               stats: RunStats) -> Callable[[int], float]:
        """Calibration through the Runner: a function timing one discarded step of a block on
        the batch's first ``k`` rows, under other RNG keys (``Live.probe``)."""
        rows = st if k >= st.size else st.keep(list(range(k)))
        probe = dataclasses.replace(rows, key=rows.key ^ CALIBRATION_KEY)

        def time_step(block: int) -> float:
            seconds = self.runner.trial(probe, block,
                                        verify_masks(probe, out, stats, block, False))
            stats.calibration_steps += 1
            stats.calibration_s += seconds
            return seconds
        return time_step

    def _end_run(self, stats: RunStats, fallbacks: Fallbacks, policy: Policy) -> None:
        """What the run reports however it ended: capture, graphs, fallbacks, cost table."""
        stats.capture_s = self.runner.capture_s()
        stats.graphs = self.runner.graphs()
        stats.fallbacks = list(fallbacks.reported)
        for (b, k), c in policy.costs.items():
            stats.costs.setdefault(b, {})[k] = c


def _out_of_memory(exc: BaseException, n: int, device: object) -> ResourceError:
    """A step that ran out of device memory: the KV caches were checked before the run, a
    step's working set (prefill's activations, a block's logits) was not."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ResourceError(f"{device} ran out of memory during a step of a run of {n} requests "
                         f"({first}); the KV caches fit, the step's working set did not: "
                         "lower the number of prompts (or max_num_seqs), the prompt length "
                         "or block_size")


def _blocks(policy: Policy, call: Call) -> tuple[int, ...]:
    """The block sizes a call may step with: an adaptive policy's candidates, else its one
    block (1: target-only)."""
    if isinstance(policy, AdaptivePolicy):
        return tuple(policy.schedule.candidates)
    return (call.room if call.spec else 1,)
