"""Requests and their sampling parameters, validated on the host before anything runs."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Sequence

from ..errors import InvalidInputError, SamplingParamsError
from ..ops.sampling import check_sampling_params


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings (vLLM-style). ``temperature == 0`` is greedy."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not is_int(self.max_new_tokens) or not 1 <= self.max_new_tokens < 2**63:
            raise SamplingParamsError(
                f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        check_sampling_params(self.temperature, self.top_k, self.top_p)
        if not is_int(self.seed) or not 0 <= self.seed < 2**63:
            raise SamplingParamsError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        for name in ("stop_token_ids", "stop_strings"):
            if not isinstance(getattr(self, name), (tuple, list)):
                raise SamplingParamsError(
                    f"{name} must be a tuple or list, got {getattr(self, name)!r}")
            object.__setattr__(self, name, tuple(getattr(self, name)))
        bad = [t for t in self.stop_token_ids if not is_int(t) or not 0 <= t < 2**63]
        if bad:
            raise SamplingParamsError(
                f"stop_token_ids must be integer token ids >= 0, got {bad[:5]!r}")
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise SamplingParamsError("stop_strings must be non-empty strings")
        if any(unicode_problem(s) for s in self.stop_strings):
            raise SamplingParamsError("a stop string is not valid Unicode text (a lone "
                                      "surrogate): it could never match the decoded text")
        if not isinstance(self.ignore_eos, bool):
            raise SamplingParamsError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        for name in ("max_new_tokens", "top_k", "seed"):      # numpy integers → int
            object.__setattr__(self, name, int(getattr(self, name)))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))


def is_int(value: object) -> bool:
    """An integer (numpy integers included), never a bool or a float."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def unicode_problem(s: str) -> str | None:
    """None for text UTF-8 can encode; else what is wrong, e.g. "surrogates not allowed at
    position 3: '\\ud800'" (a lone surrogate can never be tokenized or matched)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{exc.reason} at position {exc.start}: {s[exc.start]!r}"
    return None


@dataclass(frozen=True)
class Request:
    """One prompt (token ids) with its parameters. ``key`` separates the random streams of
    requests that share a seed; a request's tokens depend only on (prompt, params, key), never
    on its batch or its position in it."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    key: int = 0

    def validate(self, vocab_size: int) -> None:
        if not self.prompt_ids:
            raise InvalidInputError("empty prompt: give at least one token (or a non-empty string)")
        bad = [t for t in self.prompt_ids if not is_int(t)]
        if bad:
            raise InvalidInputError(f"prompt token ids must be integers, got {bad[:5]!r}")
        bad = [t for t in self.prompt_ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidInputError(f"prompt token ids {bad[:5]} are outside the vocabulary "
                                    f"[0, {vocab_size})")
        if not is_int(self.key) or not 0 <= self.key < 2**32:
            raise InvalidInputError(f"request key must be an integer in [0, 2**32), got {self.key!r}")
        bad = [t for t in self.params.stop_token_ids if t >= vocab_size]
        if bad:
            raise InvalidInputError(f"stop_token_ids {bad[:5]} are outside the vocabulary "
                                    f"[0, {vocab_size}): they could never stop the request")


@dataclass
class RequestOutput:
    """What one request produced; ``finish_reason`` is "length", "stop_token" or "stop_string"."""

    prompt_ids: tuple[int, ...]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""


def stop_at(tokens: Sequence[int], params: SamplingParams, eos: Sequence[int]
            ) -> tuple[int, str] | None:
    """(kept length, reason) if ``tokens`` already hits a stop token or the length limit."""
    stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos))
    for i, t in enumerate(tokens[:params.max_new_tokens]):
        if t in stops:
            return i, "stop_token"
    if len(tokens) >= params.max_new_tokens:
        return params.max_new_tokens, "length"
    return None


def block_size_or_default(block_size: object, default: int) -> int:
    """``block_size`` checked (an integer >= 1; 0 is not "default"), or ``default`` for None."""
    if block_size is None:
        return default
    if not is_int(block_size) or block_size < 1:
        raise InvalidInputError(f"block_size must be an integer >= 1 (or None for the draft's "
                                f"default, {default}), got {block_size!r}")
    return int(block_size)
