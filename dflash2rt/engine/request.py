"""Requests and their sampling parameters, validated on the host before anything runs."""

from __future__ import annotations

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
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens < 1:
            raise SamplingParamsError(
                f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        check_sampling_params(self.temperature, self.top_k, self.top_p)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) \
                or not 0 <= self.seed < 2**63:
            raise SamplingParamsError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise SamplingParamsError("stop_strings must be non-empty strings")


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
        bad = [t for t in self.prompt_ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidInputError(f"prompt token ids {bad[:5]} are outside the vocabulary "
                                    f"[0, {vocab_size})")
        if not 0 <= self.key < 2**32:
            raise InvalidInputError(f"request key must be in [0, 2**32), got {self.key}")


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
