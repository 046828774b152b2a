"""OpenAI request bodies → dflash2rt requests: every field checked, its name in any error.

OpenAI's fields map onto ``SamplingParams`` under vLLM's names (``max_tokens``, ``stop``, ...).
vLLM's extra parameters (sent by OpenAI's clients in ``extra_body``, so at the top level of the
body) are taken the way vLLM takes them: ``top_k``, ``min_p``, ``repetition_penalty``,
``ignore_eos``, ``stop_token_ids``, ``include_stop_str_in_output``, a regex constraint as
``structured_outputs={"regex": ...}`` (or the older ``guided_regex``); dflash2rt's own:
``block_size`` (the server's fixed block; another value is refused), ``num_candidates``
(candidates per draft slot, ``SamplingParams.num_candidates``) and ``verification`` ("token"
or "block", ``SamplingParams.verification``). Fields the server does
not implement are refused by name (400), never ignored, except the metadata ``user``.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any, Callable

from ..engine.request import VERIFICATIONS, SamplingParams, is_int
from ..errors import DFlash2Error
from .errors import APIError, bad

COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options",
          "stop", "presence_penalty", "frequency_penalty", "logit_bias", "seed", "user",
          "top_k", "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids",
          "include_stop_str_in_output", "structured_outputs", "guided_regex", "block_size",
          "num_candidates", "verification"}
COMPLETION = COMMON | {"prompt", "logprobs", "echo", "best_of", "suffix"}
CHAT = COMMON | {"messages", "logprobs", "top_logprobs", "max_completion_tokens",
                 "response_format", "add_generation_prompt"}
OURS = {"max_new_tokens": "max_tokens", "stop_strings": "stop"}
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class Limits:
    """What the server allows: its model names, context, block, and how to build a regex
    constraint (``regex(pattern)`` → a TokenAutomaton, cached by the caller)."""

    model_names: tuple[str, ...]
    max_model_len: int
    block: int | None           # None: adaptive
    vocab: int
    regex: Callable[[str], Any]


@dataclass(frozen=True)
class Parsed:
    """One request body, checked: ``prompts`` (token ids each; a completion may have
    several), their ``params``, streaming, usage in the stream, logprobs asked (completions:
    top-n; chat: ``top_logprobs`` when ``logprobs`` is true)."""

    prompts: list[tuple[int, ...]]
    params: SamplingParams
    stream: bool
    include_usage: bool
    logprobs: int | None
    model: str


def check_fields(body: Any, allowed: set[str]) -> dict:
    if not isinstance(body, dict):
        raise bad(None, "the request body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad(unknown[0], f"unsupported parameter {unknown[0]!r}: this server does not "
                              f"implement it (supported: {', '.join(sorted(allowed))})")
    return body


def model_of(body: dict, limits: Limits) -> str:
    model = body.get("model", limits.model_names[0])
    if not isinstance(model, str):
        raise bad("model", f"model must be a string, got {model!r}")
    if model not in limits.model_names:
        raise APIError(404, f"the model {model!r} does not exist: this server serves "
                            f"{', '.join(map(repr, limits.model_names))}", "model",
                       "model_not_found")
    return model


def _number(body: dict, name: str, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(name, f"{name} must be a number, got {v!r}")
    return v


def integer(body: dict, name: str, default: int | None) -> int | None:
    v = body.get(name)
    if v is None:
        return default
    if not is_int(v):
        raise bad(name, f"{name} must be an integer, got {v!r}")
    return v


def flag(body: dict, name: str, default: bool = False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(name, f"{name} must be true or false, got {v!r}")
    return v


def only(body: dict, name: str, allowed: object, what: str) -> None:
    v = body.get(name)
    if v is not None and v != allowed:
        raise bad(name, f"{name}={v!r} is not supported: {what}")


def _stop(body: dict) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad("stop", f"stop must be a non-empty string or a list of them, got {v!r}")
    return tuple(stops)


def _logit_bias(body: dict, vocab: int) -> dict[int, float]:
    v = body.get("logit_bias")
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise bad("logit_bias", "logit_bias must be an object mapping token ids to biases")
    out = {}
    for k, b in v.items():
        digits = str(k).lstrip("0") or "0"   # int() refuses over 4300 digits: not an id
        if not re.fullmatch(r"[0-9]+", str(k)) or len(digits) > len(str(vocab)) \
                or int(digits) >= vocab:
            raise bad("logit_bias", f"logit_bias key {k!r} is not a token id in [0, {vocab})")
        if isinstance(b, bool) or not isinstance(b, (int, float)):
            raise bad("logit_bias", f"logit_bias[{k}] must be a number, got {b!r}")
        out[int(digits)] = b
    return out


def _regex(body: dict, limits: Limits) -> Any:
    so, legacy = body.get("structured_outputs"), body.get("guided_regex")
    if so is not None and legacy is not None:
        raise bad("structured_outputs", "give structured_outputs or guided_regex, not both")
    if so is not None:
        if not isinstance(so, dict) or set(so) != {"regex"}:
            raise bad("structured_outputs", "structured_outputs must be {\"regex\": PATTERN}: "
                                            "regular expressions are the constraint supported")
        pattern, name = so["regex"], "structured_outputs"
    elif legacy is not None:
        pattern, name = legacy, "guided_regex"
    else:
        return None
    if not isinstance(pattern, str) or not pattern:
        raise bad(name, f"the regex must be a non-empty string, got {pattern!r}")
    try:
        return limits.regex(pattern)
    except DFlash2Error as exc:
        raise bad(name, str(exc)) from exc


def sampling_params(body: dict, limits: Limits, max_tokens: int | None,
                    logprobs: int | None, logprobs_param: str) -> SamplingParams:
    """The request's SamplingParams (``max_tokens``: already checked and defaulted)."""
    block = integer(body, "block_size", None)
    if block is not None and limits.block is None:
        raise bad("block_size", "this server chooses each step's block adaptively (started "
                                "with --block-size auto): omit block_size, or restart it with "
                                f"--block-size {block}")
    if block is not None and block != limits.block:
        raise bad("block_size", f"block_size={block} is not this server's: it decodes every "
                                f"request with block {limits.block} (restart it with "
                                f"--block-size {block}, or omit block_size)")
    candidates = integer(body, "num_candidates", None)
    if candidates is not None and limits.block == 1:
        raise bad("num_candidates", "this server decodes target-only (started with --no-spec): "
                                    "there are no drafts to offer candidates to; omit "
                                    "num_candidates")
    if candidates is not None and not 1 <= candidates <= limits.vocab:
        raise bad("num_candidates", f"num_candidates must lie in [1, {limits.vocab}] (the "
                                    f"vocabulary), got {candidates}")
    verification = body.get("verification", "token")
    if verification not in VERIFICATIONS:
        raise bad("verification", f"verification must be one of {', '.join(VERIFICATIONS)}, "
                                  f"got {verification!r}")
    if verification == "block" and limits.block == 1:
        raise bad("verification", "this server decodes target-only (started with --no-spec): "
                                  "there are no drafts to verify as a block; omit verification")
    temperature = _number(body, "temperature", 1.0)
    seed = integer(body, "seed", None)
    if seed is None:
        seed = secrets.randbits(62) if temperature > 0 else 0
    stop_ids = body.get("stop_token_ids")
    stop_ids = [] if stop_ids is None else stop_ids
    if not isinstance(stop_ids, list) or not all(is_int(t) and 0 <= t < limits.vocab
                                                 for t in stop_ids):
        raise bad("stop_token_ids", f"stop_token_ids must be a list of token ids in [0, "
                                    f"{limits.vocab}), got {stop_ids!r}")
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=_number(body, "top_p", 1.0),
            top_k=integer(body, "top_k", 0), min_p=_number(body, "min_p", 0.0), seed=seed,
            stop=_stop(body), stop_token_ids=tuple(stop_ids),
            include_stop_str_in_output=flag(body, "include_stop_str_in_output"),
            ignore_eos=flag(body, "ignore_eos"),
            presence_penalty=_number(body, "presence_penalty", 0.0),
            frequency_penalty=_number(body, "frequency_penalty", 0.0),
            repetition_penalty=_number(body, "repetition_penalty", 1.0),
            logit_bias=_logit_bias(body, limits.vocab), logprobs=logprobs,
            constraint=_regex(body, limits), num_candidates=candidates,
            verification=verification)
    except DFlash2Error as exc:
        name = re.match(r"[a-z_]+", str(exc))          # the messages begin with the field
        param = None if name is None else OURS.get(name.group(), name.group())
        param = logprobs_param if param == "logprobs" else param
        raise bad(param if param in COMPLETION | CHAT else None, str(exc)) from exc


def check_common(body: dict) -> tuple[bool, bool]:
    """``n`` and ``stream_options`` → (stream, include_usage)."""
    only(body, "n", 1, "one choice per prompt (n=1)")
    stream = flag(body, "stream")
    opts = body.get("stream_options")
    if opts is not None and not stream:
        raise bad("stream_options", "stream_options needs stream=true")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict) or not set(opts) <= {"include_usage"}:
            raise bad("stream_options", f"stream_options supports include_usage only, got "
                                        f"{opts!r}")
        include_usage = flag(opts, "include_usage")
    return stream, include_usage


def check_context(prompt: tuple[int, ...], max_tokens: int | None, limits: Limits,
                  what: str, name: str = "max_tokens") -> int:
    """``max_tokens`` (None: what the context leaves), checked against the context; ``name``:
    the field the request gave it in (chat also has max_completion_tokens)."""
    if max_tokens is not None and max_tokens < 1:
        raise bad(name, f"{name} must be >= 1, got {max_tokens}")
    room = limits.max_model_len - len(prompt)
    if room < 1 or (max_tokens is not None and max_tokens > room):
        asked = len(prompt) + (max_tokens or 1)
        raise bad(what if room < 1 else name,
                  f"this model's maximum context length is {limits.max_model_len} tokens; the "
                  f"request needs {asked} ({len(prompt)} in the {what}, "
                  f"{max_tokens or 1} to generate): shorten the {what} or lower {name}",
                  "context_length_exceeded")
    return room if max_tokens is None else max_tokens


def prompt_ids(value: Any, encode: Callable[[str], list[int]], vocab: int
               ) -> list[tuple[int, ...]]:
    """A completion's ``prompt``: a string, a list of token ids, or a list of either."""
    if isinstance(value, str) or (isinstance(value, list) and value and is_int(value[0])):
        value = [value]
    if not isinstance(value, list) or not value:
        raise bad("prompt", "prompt must be a string, a list of token ids, or a non-empty "
                            "list of those")
    out = []
    for p in value:
        if isinstance(p, str):
            if not p:
                raise bad("prompt", "a prompt is empty: give at least one character")
            out.append(tuple(encode(p)))
        elif isinstance(p, list) and p and all(is_int(t) for t in p):
            if not all(0 <= t < vocab for t in p):
                raise bad("prompt", f"prompt token ids must lie in [0, {vocab})")
            out.append(tuple(p))
        else:
            raise bad("prompt", f"each prompt must be a non-empty string or a non-empty list "
                                f"of token ids, got {p!r:.80}")
    return out
