"""``dflash2rt.run``: the one-call API (load a model pair, decode prompts, return texts and stats),
and what it shares with ``dflash2rt.LLM`` (:mod:`dflash2rt.llm`: the same, vLLM-shaped, load once
and ``generate`` many times): the one decode path. Model resolution is
``dflash2rt.models.resolve``'s (re-exported here), prompt encoding ``dflash2rt.prompts``'."""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .backend import Backend
from .constraints import TokenAutomaton
from .engine.engine import Engine
from .engine.request import Request, RequestOutput, SamplingParams, is_int
from .engine.policy.adaptive import AdaptivePolicy
from .engine.policy.table import MeasuredTable
from .engine.stats import RunStats
from .errors import ConflictingArgumentsError, InvalidInputError
from .metrics import check_metrics_path, write_metrics
from .models.pair import ModelPair, check_dtype
from .models.resolve import ModelSpec, resolve_model
from .prompts import encode_prompts
from .registry import Registry
from .watermark import WatermarkKey

DEFAULT_MODEL = "stdlib-code"


@dataclass
class RunResult:
    texts: list[str]
    tokens: list[list[int]]
    stats: RunStats
    outputs: list[RequestOutput]

    def as_dict(self) -> dict[str, Any]:
        out = {"texts": self.texts, "tokens": self.tokens, "stats": self.stats.as_dict(),
               "finish_reasons": [o.finish_reason for o in self.outputs]}
        if any(o.logprobs is not None for o in self.outputs):
            out["logprobs"] = [o.logprobs for o in self.outputs]
            out["top_logprobs"] = [None if o.top_logprobs is None else
                                   [{str(k): v for k, v in t.items()} for t in o.top_logprobs]
                                   for o in self.outputs]
        return out


class _Default:
    """A keyword of ``run`` left at its default (so that a keyword given can be told from one
    not given, even when it is given its default value); it reads as the default in help()."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


def run(model: ModelSpec = DEFAULT_MODEL, backend: str | Backend | None = None, *,
        prompts: str | Sequence[str] | Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        draft: str | Path | None = None, revision: str | None = None,
        draft_revision: str | None = None,
        max_new_tokens: int = _Default(64), temperature: float = _Default(0.0),
        top_p: float = _Default(1.0), top_k: int = _Default(0),
        seed: int = _Default(0), block_size: int | None = None, spec: bool = True,
        stop: str | Sequence[str] = _Default(()), stop_token_ids: Sequence[int] = _Default(()),
        include_stop_str_in_output: bool = _Default(False), dtype: torch.dtype | str = "auto",
        on_tokens: Callable[[int, list[int]], None] | None = None,
        repetition_penalty: float = _Default(1.0), frequency_penalty: float = _Default(0.0),
        presence_penalty: float = _Default(0.0), min_p: float = _Default(0.0),
        logit_bias: dict[int, float] | None = _Default(None),
        logprobs: int | None = _Default(None), logprobs_mode: str = _Default("raw"),
        regex: str | None = None, constraint: Any = _Default(None),
        num_candidates: int | None = _Default(None), verification: str = _Default("token"),
        metrics: str | Path | None = None,
        watermark: WatermarkKey | str | Path | None = None,
        tp: int = 1, tp_check: bool = False) -> RunResult | None:
    """Decode ``prompts`` with speculative decoding (``spec=False``: target only).

    ``model``, ``draft``, ``revision``, ``draft_revision``: see ``resolve_model`` (a bundled
    name, a directory, a hub id such as ``"Qwen/Qwen3-8B"`` with ``draft=
    "z-lab/Qwen3-8B-DFlash-b16"``, a (target, draft) tuple, or a loaded ModelPair).

    The sampling keywords (``max_new_tokens`` to ``logprobs_mode``, ``stop`` being
    ``stop_strings``, ``constraint``, ``num_candidates`` and ``verification``) are
    ``SamplingParams``'s fields,
    one set for every prompt. ``sampling_params`` instead: a ``dflash2rt.SamplingParams`` for
    every prompt, or a list of them, one per prompt (as vLLM's ``LLM.generate``); giving it
    with any sampling keyword is a ``ConflictingArgumentsError``, a list of the wrong length an
    ``InvalidInputError``.

    The penalties, ``min_p``, ``logit_bias`` and ``logprobs`` are ``SamplingParams``'s (their
    definitions and order are documented there); every one keeps speculation lossless.
    ``regex``: every output must match the pattern (``dflash2rt.constraints.regex`` syntax),
    EOS allowed where it fully matches: a ``TokenAutomaton`` over the model's tokenizer, the
    constraint of every request (of every ``sampling_params`` without one of its own; one with
    a constraint is a conflict). ``constraint``: a hook of your own
    (``SamplingParams.constraint``); not both.

    ``backend``: a name, a Backend, or None for $DFLASH2RT_BACKEND / the best available one.
    ``block_size``: None (default) chooses each step's block size adaptively (1, a target-only
    step, included: engine/policy/); an int >= 2 decodes with that fixed block.
    Every request uses its ``seed``. With a fixed block a request's tokens depend only on its
    prompt and parameters, not on the batch it runs in. Adaptive: greedy output is the same;
    seeded sampled output follows the block sizes chosen, which depend on the batch and on the
    cost table, measured once per model pair and device in this process, so repeated calls
    reproduce it (other processes or machines may differ: fix block_size for that).
    ``metrics``: a file to write the run's speculation metrics to, in the Prometheus text
    format under vLLM's names with a ``dflash2rt:`` prefix (``dflash2rt.metrics``; labelled
    with the model's and the backend's names); checked before decoding. The same text, from
    any RunStats: ``dflash2rt.metrics.prometheus_text(res.stats)``.
    ``watermark``: a WatermarkKey or the path of a key file (``dflash2rt watermark keygen``):
    sampled tokens are watermarked (distortion-free; detect with ``dflash2rt.watermark.detect``
    or ``dflash2rt watermark detect``); greedy requests are unchanged and unmarked. The key is
    never written to stats, JSON or logs.
    ``tp``: tensor-parallel ranks (docs/tensor-parallel.md): the target sharded over ``tp``
    processes of this host (spawned here; under torchrun, this process is one of them), the
    draft replicated. Rank 0 returns the result, the other ranks None. ``tp_check``: every
    step, the ranks compare a hash of the tokens they committed (debug mode; raises
    DistributedError on a disagreement).
    """
    a = dict(locals())
    if not is_int(tp) or tp < 1:
        raise InvalidInputError(f"tp must be a positive integer, got {tp!r}")
    if not isinstance(tp_check, bool):
        raise InvalidInputError(f"tp_check must be True or False, got {tp_check!r}")
    check_dtype(dtype)                              # the ranks of a tp > 1 run would each raise
    if tp > 1:
        return _run_tp(a)
    return _run(a)


_SAMPLING_KEYWORDS = ("max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                      "stop_token_ids", "include_stop_str_in_output", "repetition_penalty",
                      "frequency_penalty", "presence_penalty", "min_p", "logit_bias",
                      "logprobs", "logprobs_mode", "constraint", "num_candidates",
                      "verification")


def _run(a: dict[str, Any], group: Any = None) -> RunResult | None:
    """``run``'s body; ``group``: this rank's TPGroup in a tensor-parallel run."""
    keywords = {k: a[k] for k in _SAMPLING_KEYWORDS}
    given = [k for k, v in keywords.items() if not isinstance(v, _Default)]
    sampling_params = a["sampling_params"]
    if sampling_params is not None and given:
        raise ConflictingArgumentsError(
            f"give the sampling settings either as keywords or as sampling_params, not both: "
            f"{', '.join(given)} given with sampling_params (set them in the SamplingParams)")
    values = {k: v.value if isinstance(v, _Default) else v for k, v in keywords.items()}
    metrics_path = None if a["metrics"] is None else check_metrics_path(a["metrics"])
    key = watermark_key(a["watermark"])
    be = backend_of(a["backend"])
    if group is None:
        pair = resolve_model(a["model"], be.device, a["dtype"], draft=a["draft"],
                             revision=a["revision"], draft_revision=a["draft_revision"])
    else:
        from .distributed.rank_setup import rank_setup

        be, group, pair = rank_setup(a, be)
    regex = a["regex"]
    if regex is not None and values["constraint"] is not None:
        raise InvalidInputError("give regex or constraint, not both")
    automaton = None if regex is None else regex_constraint(pair, regex)
    if sampling_params is None:
        stop = values.pop("stop")
        sampling_params = SamplingParams(
            **{**values, "stop_strings": (stop,) if isinstance(stop, str) else stop,
               "logit_bias": values["logit_bias"] or {}})
    prompt_ids = encode_prompts(pair, a["prompts"])
    params = params_list(sampling_params, len(prompt_ids))
    if automaton is not None:
        params = _constrained(params, automaton)
    main = group is None or group.is_main
    with Engine(pair, be, table=measured_table(pair, be.device)) as engine:
        if group is not None:
            from .distributed.consensus import RankZero, StepCheck

            if pair.draft is not None:           # every decision rank 0's
                engine.policy = AdaptivePolicy.measured(pair.draft.cfg.block_size,
                                                        engine.table, agree=RankZero(group))
            engine.step_check = StepCheck(group) if group.check else None
        outputs, stats = generate_requests(engine, prompt_ids, params, spec=a["spec"],
                                   block_size=a["block_size"],
                                   on_tokens=a["on_tokens"] if main else None, watermark=key)
    if not main:
        return None
    if group is not None:
        from .distributed.rank_setup import heads_line

        stats.tensor_parallel = (f"tp={group.world} over {group.backend} (target sharded by "
                                 f"query head: {heads_line(pair, group)}; "
                                 f"vocabulary-parallel LM head; draft replicated"
                                 f"{'; step hash check on' if group.check else ''})")
    if metrics_path is not None:
        labels = {"model_name": pair.name} if pair.name else {}
        write_metrics(stats, metrics_path, {**labels, "backend": stats.backend})
    return RunResult([o.text for o in outputs], [o.token_ids for o in outputs], stats, outputs)


_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # target → draft → device


def measured_table(pair: ModelPair, device: object) -> MeasuredTable:
    """The adaptive policy's measured table the api's engines over this model pair (its target
    and draft modules) on this device share in this process: ``run`` called again, or an
    ``LLM``, decides from what earlier calls measured instead of calibrating again."""
    drafts = _TABLES.setdefault(pair.target, weakref.WeakKeyDictionary())
    key = pair.draft if pair.draft is not None else pair.target
    return drafts.setdefault(key, {}).setdefault(str(device), MeasuredTable())


def backend_of(backend: str | Backend | None) -> Backend:
    """A Backend object as is; a name (None: $DFLASH2RT_BACKEND, else the best available)
    through the plugin registry."""
    if isinstance(backend, Backend):
        return backend
    if backend is not None and not isinstance(backend, str):
        raise InvalidInputError(f"backend must be a name (e.g. 'cpu', 'cuda:1'), a Backend or "
                                f"None for the best available one, got {backend!r}")
    return Registry.discover().select(backend).backend


def regex_constraint(pair: ModelPair, regex: str) -> TokenAutomaton:
    """The ``TokenAutomaton`` that constrains a request's output to a full match of ``regex``
    over ``pair``'s tokenizer (what ``run(regex=...)`` uses)."""
    if pair.tokenizer is None:
        raise InvalidInputError("regex needs a tokenizer; this model pair has none")
    return TokenAutomaton.from_regex(regex, pair.tokenizer, pair.target.cfg.vocab_size,
                                     pair.eos_token_ids)


def _constrained(params: list[SamplingParams], automaton: TokenAutomaton
                 ) -> list[SamplingParams]:
    """``params`` with ``run``'s regex automaton as their constraint (none may have its own)."""
    clash = [i for i, p in enumerate(params) if p.constraint is not None]
    if clash:
        raise ConflictingArgumentsError(
            f"regex given and sampling_params {clash[:5]} carry a constraint of their own: "
            "give one of them")
    done: dict[int, SamplingParams] = {}            # one copy per distinct SamplingParams
    for p in params:
        if id(p) not in done:
            done[id(p)] = dataclasses.replace(p, constraint=automaton)
    return [done[id(p)] for p in params]


def params_list(sampling_params: object, n: int) -> list[SamplingParams]:
    """One ``SamplingParams`` per prompt, from None (the defaults), one for every prompt, or a
    list / tuple of exactly ``n``."""
    if sampling_params is None:
        return [SamplingParams()] * n
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * n
    if not isinstance(sampling_params, (list, tuple)):
        raise InvalidInputError(f"sampling_params must be a dflash2rt.SamplingParams or a list "
                                f"of them (one per prompt), got "
                                f"{type(sampling_params).__name__}")
    bad = [i for i, p in enumerate(sampling_params) if not isinstance(p, SamplingParams)]
    if bad:
        raise InvalidInputError(f"sampling_params[{bad[0]}] is "
                                f"{type(sampling_params[bad[0]]).__name__}, not a "
                                "dflash2rt.SamplingParams")
    if len(sampling_params) != n:
        raise InvalidInputError(f"sampling_params has {len(sampling_params)} entries for {n} "
                                f"prompt{'s' if n != 1 else ''}: give one per prompt, or a "
                                "single SamplingParams for all")
    return list(sampling_params)


def generate_requests(engine: Engine, prompt_ids: list[tuple[int, ...]],
                      params: list[SamplingParams], **kw: Any
                      ) -> tuple[list[RequestOutput], RunStats]:
    """The one decode path of ``run`` and ``LLM.generate``: a request per prompt, one
    ``Engine.generate`` call (``kw``: its spec, block_size, on_tokens, watermark, on_finish)."""
    return engine.generate([Request(p, q) for p, q in zip(prompt_ids, params)], **kw)


def _run_tp(a: dict[str, Any]) -> RunResult | None:
    """``run`` with tp > 1: this process is a rank (torchrun, or a group already up), or
    ``tp`` ranks are spawned here and rank 0's result comes back."""
    import pickle

    from .distributed import group as tp_group, launch
    from .distributed.rank_setup import check_model_shardable

    if torch.distributed.is_initialized() or tp_group.env_world() is not None:
        return _run(a, a["tp"])
    check_model_shardable(a)                     # before spawning: a clear error, at once
    if isinstance(a["backend"], Backend):       # spawned ranks select it again by name
        a = {**a, "backend": a["backend"].name}
    try:
        pickle.dumps(a)
    except Exception as exc:       # noqa: BLE001 — lambdas, open files, locks ...
        raise InvalidInputError(f"tp={a['tp']} spawns processes, which need picklable arguments"
                                f" (on_tokens, constraint, model): {exc}") from exc
    return launch.spawn(_run_spawned, a["tp"], (a,))


def _run_spawned(a: dict[str, Any]) -> RunResult | None:
    """A spawned rank's ``run`` (launch.spawn set its RANK, WORLD_SIZE, MASTER_*)."""
    return _run(a, a["tp"])


def watermark_key(watermark: object) -> WatermarkKey | None:
    """A WatermarkKey, a key file's path, or None."""
    if watermark is None or isinstance(watermark, WatermarkKey):
        return watermark
    if isinstance(watermark, (str, Path)):
        return WatermarkKey.from_file(watermark)
    raise InvalidInputError(f"watermark must be a WatermarkKey or the path of a key file, got "
                            f"{type(watermark).__name__}")

