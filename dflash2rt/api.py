"""``dflash2rt.run``: the one-call API (load a model pair, decode prompts, return texts and stats)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, Union

import torch

from .backend import Backend
from .engine.engine import Engine
from .engine.request import Request, RequestOutput, SamplingParams
from .engine.stats import RunStats
from .errors import InvalidInputError
from .models.pair import ModelPair, load_pair
from .registry import Registry

DEFAULT_MODEL = "stdlib-code"
ModelSpec = Union[str, Path, tuple, ModelPair]


@dataclass
class RunResult:
    texts: list[str]
    tokens: list[list[int]]
    stats: RunStats
    outputs: list[RequestOutput]

    def as_dict(self) -> dict[str, Any]:
        return {"texts": self.texts, "tokens": self.tokens, "stats": self.stats.as_dict(),
                "finish_reasons": [o.finish_reason for o in self.outputs]}


@functools.lru_cache(maxsize=4)
def _load_cached(target: str, draft: str | None, dtype: torch.dtype, device: str,
                 name: str) -> ModelPair:
    return load_pair(target, draft, dtype, device, name)


def resolve_model(model: ModelSpec, device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32) -> ModelPair:
    """A bundled name, a directory with target/ and draft/, a (target, draft) pair of
    directories, or an already loaded ModelPair."""
    if isinstance(model, ModelPair):
        return model
    if isinstance(model, tuple):
        if len(model) != 2:
            raise InvalidInputError("model as a tuple must be (target_dir, draft_dir)")
        target, draft = model
        return _load_cached(str(target), None if draft is None else str(draft), dtype,
                            str(device), Path(str(target)).name)
    path = Path(str(model))
    if not path.is_dir():
        from .bundled import bundled_path  # raises with the available names

        path = bundled_path(str(model))
    if not (path / "target").is_dir():
        raise InvalidInputError(f"{path} has no target/ directory (expected target/ and draft/)")
    draft = path / "draft"
    return _load_cached(str(path / "target"), str(draft) if draft.is_dir() else None, dtype,
                        str(device), path.name)


def _encode(pair: ModelPair, prompts: str | Sequence[str] | Sequence[Sequence[int]]
            ) -> list[tuple[int, ...]]:
    if isinstance(prompts, str):
        prompts = [prompts]
    out = []
    for p in prompts:
        if isinstance(p, str):
            if pair.tokenizer is None:
                raise InvalidInputError("text prompts need a tokenizer; pass token id lists")
            if not p:
                raise InvalidInputError("empty prompt: give a non-empty string")
            out.append(tuple(pair.tokenizer.encode(p)))
        else:
            out.append(tuple(int(t) for t in p))
    if not out:
        raise InvalidInputError("no prompts given")
    return out


def run(model: ModelSpec = DEFAULT_MODEL, backend: str | Backend | None = None, *,
        prompts: str | Sequence[str] | Sequence[Sequence[int]],
        max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
        seed: int = 0, block_size: int | None = None, spec: bool = True,
        stop: Sequence[str] = (), stop_token_ids: Sequence[int] = (),
        dtype: torch.dtype = torch.float32,
        on_tokens: Callable[[int, list[int]], None] | None = None) -> RunResult:
    """Decode ``prompts`` with speculative decoding (``spec=False``: target only).

    ``backend``: a name, a Backend, or None for $DFLASH2RT_BACKEND / the best available one.
    Every request uses ``seed``; a request's tokens depend only on its prompt and parameters,
    not on the batch it runs in.
    """
    be = backend if isinstance(backend, Backend) else Registry.discover().select(backend).backend
    pair = resolve_model(model, be.device, dtype)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                            top_p=top_p, seed=seed, stop_strings=tuple(stop),
                            stop_token_ids=tuple(stop_token_ids))
    requests = [Request(p, params) for p in _encode(pair, prompts)]
    with Engine(pair, be) as engine:
        outputs, stats = engine.generate(requests, spec=spec, block_size=block_size,
                                         on_tokens=on_tokens)
    return RunResult([o.text for o in outputs], [o.token_ids for o in outputs], stats, outputs)
