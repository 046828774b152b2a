"""``dflash2rt.run``: the one-call API (load a model pair, decode prompts, return texts and stats)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, Union

import torch

from .backend import Backend
from .constraints import TokenAutomaton
from .engine.engine import Engine
from .engine.request import Request, RequestOutput, SamplingParams, is_int, unicode_problem
from .engine.stats import RunStats
from .errors import InvalidInputError
from .metrics import check_metrics_path, write_metrics
from .models import hub
from .models.pair import ModelPair, load_pair, resolve_dtype
from .registry import Registry
from .watermark import WatermarkKey

DEFAULT_MODEL = "stdlib-code"
ModelSpec = Union[str, Path, tuple, ModelPair]


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


def _files_identity(*dirs: str | None) -> tuple[tuple[str, int, int], ...]:
    """(resolved path, size, mtime_ns) of every file under ``dirs``: a checkpoint replaced on
    disk gets a new identity, so the cache below never hands back stale weights."""
    out = []
    for d in dirs:
        if d is not None:
            for f in sorted(Path(d).rglob("*")):
                if f.is_file():
                    st = f.stat()
                    out.append((str(f.resolve()), st.st_size, st.st_mtime_ns))
    return tuple(out)


@functools.lru_cache(maxsize=4)
def _load_cached(target: str, draft: str | None, dtype: torch.dtype, device: str,
                 name: str, files: tuple[tuple[str, int, int], ...]) -> ModelPair:
    """``files`` (``_files_identity``) is part of the key only."""
    return load_pair(target, draft, dtype, device, name)


def _load(target: Path, draft: Path | None, dtype: torch.dtype | str, device: torch.device | str,
          name: str) -> ModelPair:
    t, d = str(target.resolve()), None if draft is None else str(draft.resolve())
    dtype = resolve_dtype(dtype, t, device)
    return _load_cached(t, d, dtype, str(device), name, _files_identity(t, d))


def resolve_model(model: ModelSpec, device: torch.device | str = "cpu",
                  dtype: torch.dtype | str = "auto", *, draft: str | Path | None = None,
                  revision: str | None = None, draft_revision: str | None = None) -> ModelPair:
    """A bundled name; a directory holding target/ and draft/, or one checkpoint (the target);
    a Hugging Face hub id ``"ORG/NAME"`` (fetched into the hub's cache, safetensors only:
    ``dflash2rt.models.hub``); a (target, draft) pair of directories or hub ids; or an already
    loaded ModelPair. A string naming an existing local path is always that path.

    ``draft``: a directory or hub id for the draft (it replaces a draft/ beside the target;
    without one a lone checkpoint runs target-only). ``revision`` / ``draft_revision``: the
    branch, tag or commit of the target's / the draft's hub id (None: main). ``dtype="auto"``:
    float32 on the CPU, the checkpoint's dtype (bfloat16) on accelerators."""
    if isinstance(model, ModelPair):
        if draft is not None or revision or draft_revision:
            raise InvalidInputError("a loaded ModelPair takes no draft, revision or "
                                    "draft_revision")
        return model
    target, draft_loc, name = hub.locate_pair(model, draft, revision, draft_revision)
    return _load(target.path, None if draft_loc is None else draft_loc.path, dtype, device,
                 name)


def _encode(pair: ModelPair, prompts: str | Sequence[str] | Sequence[Sequence[int]]
            ) -> list[tuple[int, ...]]:
    """Prompts → token ids: a string, or a list of strings and/or token-id lists."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise InvalidInputError(f"prompts must be a string or a list of strings / token-id "
                                f"lists, got {type(prompts).__name__} {prompts!r:.80}")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            out.append(_encode_text(pair, i, p))
            continue
        if hasattr(p, "tolist") and not isinstance(p, (list, tuple)):
            p = p.tolist()                              # a numpy array or a tensor of ids
        if not isinstance(p, (list, tuple)):
            raise InvalidInputError(f"prompt {i} is {type(p).__name__} {p!r:.80}: give a string "
                                    "or a list of token ids (a one-token prompt is [id])")
        bad = [t for t in p if not is_int(t)]
        if bad:
            raise InvalidInputError(f"prompt {i}: token ids must be integers, got {bad[0]!r}")
        out.append(tuple(int(t) for t in p))
    if not out:
        raise InvalidInputError("no prompts given")
    return out


def _encode_text(pair: ModelPair, i: int, p: str) -> tuple[int, ...]:
    if pair.tokenizer is None:
        raise InvalidInputError("text prompts need a tokenizer; pass token id lists")
    if not p:
        raise InvalidInputError(f"prompt {i} is empty: give a non-empty string")
    problem = unicode_problem(p)
    if problem:
        raise InvalidInputError(f"prompt {i} is not valid Unicode text ({problem}); fix its "
                                "encoding")
    return tuple(pair.tokenizer.encode(p))


def run(model: ModelSpec = DEFAULT_MODEL, backend: str | Backend | None = None, *,
        prompts: str | Sequence[str] | Sequence[Sequence[int]],
        draft: str | Path | None = None, revision: str | None = None,
        draft_revision: str | None = None,
        max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
        seed: int = 0, block_size: int | None = None, spec: bool = True,
        stop: str | Sequence[str] = (), stop_token_ids: Sequence[int] = (),
        include_stop_str_in_output: bool = False, dtype: torch.dtype | str = "auto",
        on_tokens: Callable[[int, list[int]], None] | None = None,
        repetition_penalty: float = 1.0, frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0, min_p: float = 0.0,
        logit_bias: dict[int, float] | None = None, logprobs: int | None = None,
        logprobs_mode: str = "raw",
        regex: str | None = None, constraint: Any = None,
        metrics: str | Path | None = None,
        watermark: WatermarkKey | str | Path | None = None) -> RunResult:
    """Decode ``prompts`` with speculative decoding (``spec=False``: target only).

    ``model``, ``draft``, ``revision``, ``draft_revision``: see ``resolve_model`` (a bundled
    name, a directory, a hub id such as ``"Qwen/Qwen3-8B"`` with ``draft=
    "z-lab/Qwen3-8B-DFlash-b16"``, a (target, draft) tuple, or a loaded ModelPair).

    The penalties, ``min_p``, ``logit_bias`` and ``logprobs`` are ``SamplingParams``'s (their
    definitions and order are documented there); every one keeps speculation lossless.
    ``regex``: every output must match the pattern (``dflash2rt.constraints.regex`` syntax),
    EOS allowed where it fully matches: a ``TokenAutomaton`` over the model's tokenizer.
    ``constraint``: a hook of your own (``SamplingParams.constraint``); not both.

    ``backend``: a name, a Backend, or None for $DFLASH2RT_BACKEND / the best available one.
    ``block_size``: None (default) chooses each step's block size adaptively (1, a target-only
    step, included: engine/schedule.py); an int >= 2 decodes with that fixed block.
    Every request uses ``seed``. With a fixed block a request's tokens depend only on its prompt
    and parameters, not on the batch it runs in. Adaptive: greedy output is the same; seeded
    sampled output follows the block sizes chosen, which depend on the batch and on the cost
    table, measured once per model pair and device in this process, so repeated calls
    reproduce it (other processes or machines may differ: fix block_size for that).
    ``metrics``: a file to write the run's speculation metrics to, in the Prometheus text
    format under vLLM's names with a ``dflash2rt:`` prefix (``dflash2rt.metrics``; labelled
    with the model's and the backend's names); checked before decoding. The same text, from
    any RunStats: ``dflash2rt.metrics.prometheus_text(res.stats)``.
    ``watermark``: a WatermarkKey or the path of a key file (``dflash2rt watermark keygen``):
    sampled tokens are watermarked (distortion-free; detect with ``dflash2rt.watermark.detect``
    or ``dflash2rt watermark detect``); greedy requests are unchanged and unmarked. The key is
    never written to stats, JSON or logs.
    """
    metrics_path = None if metrics is None else check_metrics_path(metrics)
    key = _watermark_key(watermark)
    be = backend if isinstance(backend, Backend) else Registry.discover().select(backend).backend
    pair = resolve_model(model, be.device, dtype, draft=draft, revision=revision,
                         draft_revision=draft_revision)
    if regex is not None:
        if constraint is not None:
            raise InvalidInputError("give regex or constraint, not both")
        if pair.tokenizer is None:
            raise InvalidInputError("regex needs a tokenizer; this model pair has none")
        constraint = TokenAutomaton.from_regex(regex, pair.tokenizer,
                                               pair.target.cfg.vocab_size, pair.eos_token_ids)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                            top_p=top_p, seed=seed,
                            stop_strings=(stop,) if isinstance(stop, str) else stop,
                            stop_token_ids=stop_token_ids,
                            include_stop_str_in_output=include_stop_str_in_output,
                            repetition_penalty=repetition_penalty,
                            frequency_penalty=frequency_penalty,
                            presence_penalty=presence_penalty, min_p=min_p,
                            logit_bias=logit_bias or {}, logprobs=logprobs,
                            logprobs_mode=logprobs_mode,
                            constraint=constraint)
    requests = [Request(p, params) for p in _encode(pair, prompts)]
    with Engine(pair, be) as engine:
        outputs, stats = engine.generate(requests, spec=spec, block_size=block_size,
                                         on_tokens=on_tokens, watermark=key)
    if metrics_path is not None:
        labels = {"model_name": pair.name} if pair.name else {}
        write_metrics(stats, metrics_path, {**labels, "backend": stats.backend})
    return RunResult([o.text for o in outputs], [o.token_ids for o in outputs], stats, outputs)


def _watermark_key(watermark: object) -> WatermarkKey | None:
    """A WatermarkKey, a key file's path, or None."""
    if watermark is None or isinstance(watermark, WatermarkKey):
        return watermark
    if isinstance(watermark, (str, Path)):
        return WatermarkKey.from_file(watermark)
    raise InvalidInputError(f"watermark must be a WatermarkKey or the path of a key file, got "
                            f"{type(watermark).__name__}")
