"""Requests and their sampling parameters, validated on the host before anything runs."""

from __future__ import annotations

import functools
import numbers
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..constraints import Constraint, TokenAutomaton
from ..errors import (ConflictingArgumentsError, ConstraintError, InvalidInputError,
                      SamplingParamsError)
from ..ops.procs import check_proc_params
from ..ops.sampling import check_sampling_params


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings (vLLM-style). ``temperature == 0`` is greedy.

    Logit processing, in this order: ``logit_bias`` (token id → bias in [-100, 100]) and the
    penalties on the raw logits — ``repetition_penalty`` (1 = off; over prompt + output tokens:
    a positive logit divided by it, a non-positive one multiplied), ``frequency_penalty`` and
    ``presence_penalty`` (0 = off, in [-2, 2]; over output tokens: minus f · count, minus s if
    present) — then temperature, top-k, top-p and ``min_p`` (0 = off: keep tokens with p ≥
    min_p · max p). See ``ops.procs`` and ``ops.sampling``. ``logprobs``: None (off), or n ≥ 0:
    each emitted token's log-probability, with the top-n alternatives
    (``RequestOutput.logprobs``), by log_softmax (finite wherever the law keeps the token):
    ``logprobs_mode`` "raw" (the default, as vLLM V1's ``raw_logprobs``) of the model's own
    logits before any processing, or "processed" under the final law (after the processors,
    the constraint, temperature, top-k, top-p and min-p; greedy requests at temperature 1).

    ``constraint`` (structured output, as vLLM's ``structured_outputs`` / SGLang's ``regex``):
    None, or a hook with ``initial()``, ``allowed(state) -> bool[V]`` and ``advance(state,
    token)`` (``dflash2rt.constraints``); forbidden tokens get logit −inf after the processors
    above, before temperature. A ``TokenAutomaton`` (``from_regex``, ``token_set``) masks on
    the device; any other hook builds its masks on the host (``advance`` must return a new
    state): one host→device mask copy per step, and in speculative steps one more round trip
    for the drafts (counted in ``RunStats.constraint_host_masks`` and ``syncs``). A request whose
    state allows no token finishes there: finish_reason "constraint" where the output is a
    complete match (the hook's ``accepting(state)``), else "constraint_unsatisfiable".

    ``num_candidates``: how many candidates per draft slot the selector offers this request
    (None: the draft's trained ``selector_top_k``; 1 to the vocabulary size otherwise): a
    proposal setting, so any value keeps verification lossless (``engine.candidates``).

    ``verification``: how a sampled request's drafts are verified: "token" (the default; slot
    by slot, ``ops.verify``) or "block" (the block as a whole, ``ops.block_verify``: the same
    output law, never fewer accepted drafts in expectation; float64 devices, torch ops, not
    with the watermark). Greedy requests verify the same either way.

    vLLM's field names are accepted as well: ``max_tokens`` is ``max_new_tokens`` and ``stop``
    (a string or a list of strings; None: none) is ``stop_strings``, given to the constructor
    (one of the two names, not both) and read back as properties; ``top_k=-1`` (vLLM's "off")
    is read as 0; ``seed=None`` (vLLM's "no seed") draws a random seed in [0, 2**62), which the
    params keep (``repr`` shows it, so the request can be repeated). The fields keep
    dflash2rt's names (``dataclasses.replace``, ``repr``).
    """

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_p: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict, hash=False)
    logprobs: int | None = None
    logprobs_mode: str = "raw"
    constraint: Any = field(default=None, hash=False)
    num_candidates: int | None = None
    verification: str = "token"

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
            raise SamplingParamsError("stop_strings holds a string that is not valid Unicode "
                                      "text (a lone surrogate): it could never match the "
                                      "decoded text")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise SamplingParamsError(f"{name} must be True or False, got "
                                          f"{getattr(self, name)!r}")
        for name in ("max_new_tokens", "top_k", "seed"):      # numpy integers → int
            object.__setattr__(self, name, int(getattr(self, name)))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        check_proc_params(self.repetition_penalty, self.frequency_penalty,
                          self.presence_penalty, self.min_p, self.logit_bias, self.logprobs)
        object.__setattr__(self, "logit_bias",
                           {int(t): float(b) for t, b in self.logit_bias.items()})
        for name in ("repetition_penalty", "frequency_penalty", "presence_penalty", "min_p"):
            object.__setattr__(self, name, float(getattr(self, name)))
        if self.logprobs is not None:
            object.__setattr__(self, "logprobs", int(self.logprobs))
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise SamplingParamsError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got "
                                      f"{self.logprobs_mode!r}")
        if self.num_candidates is not None:
            if not is_int(self.num_candidates) or not 1 <= self.num_candidates < 2**31:
                raise SamplingParamsError(f"num_candidates must be None (the draft's trained "
                                          f"count) or an integer >= 1, got "
                                          f"{self.num_candidates!r}")
            object.__setattr__(self, "num_candidates", int(self.num_candidates))
        if self.verification not in VERIFICATIONS:
            raise SamplingParamsError(f"verification must be one of {VERIFICATIONS}, got "
                                      f"{self.verification!r}")
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise SamplingParamsError(
                f"constraint must be None or a hook with initial(), allowed(state) and "
                f"advance(state, token) (e.g. dflash2rt.constraints.TokenAutomaton), got "
                f"{type(self.constraint).__name__}")

    @property
    def max_tokens(self) -> int:
        """vLLM's name of ``max_new_tokens``."""
        return self.max_new_tokens

    @property
    def stop(self) -> tuple[str, ...]:
        """vLLM's name of ``stop_strings``."""
        return self.stop_strings

    @property
    def processed(self) -> bool:
        """Whether the request uses a logit processor (bias, a penalty, min-p), logprobs or a
        constraint."""
        return self.constraint is not None or bool(self.logit_bias) \
            or self.logprobs is not None or self.min_p > 0 \
            or self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 \
            or self.presence_penalty != 0.0


VLLM_NAMES = {"max_tokens": "max_new_tokens", "stop": "stop_strings"}
# vLLM's fields that dflash2rt has only at their default: (the values taken, what each does
# here). Another value is refused, never ignored.
VLLM_DEFAULTS: dict[str, tuple[tuple[Any, ...], str]] = {
    "n": ((1,), "one completion per prompt: repeat the prompt (with seeds) for more"),
    "best_of": ((None, 1), "one completion per prompt, none ranked"),
    "min_tokens": ((0,), "EOS and stop tokens end a request at any length"),
    "prompt_logprobs": ((None,), "logprobs are of the generated tokens only"),
    "truncate_prompt_tokens": ((None,), "prompts are never truncated: shorten the prompt"),
    "detokenize": ((True,), "every output has its text"),
    "bad_words": ((None,), "no word is banned: a logit_bias of -100 on its tokens bans them"),
    "allowed_token_ids": ((None,), "every token may be drawn: a regex constraint limits the "
                                   "output"),
    "logits_processors": ((None,), "no per-request logits processors: logit_bias, penalties, "
                                   "min_p and constraints are the processing"),
    "skip_special_tokens": ((False,), "special tokens are kept in the output's text"),
    "spaces_between_special_tokens": ((True,), "the tokenizer's own decoding"),
}


def _vllm_default(name: str, value: Any) -> None:
    """``value`` of vLLM field ``name`` (``VLLM_DEFAULTS``): dropped when it is the default
    dflash2rt has, else SamplingParamsError."""
    taken, meaning = VLLM_DEFAULTS[name]
    if not any(value is v if v is None or isinstance(v, bool) else is_int(value) and value == v
               for v in taken):
        shown = " or ".join(repr(v) for v in taken)
        raise SamplingParamsError(f"SamplingParams: {name}={value!r} is not supported, only "
                                  f"{shown} (vLLM's default): {meaning}")


def _accept_vllm_names(init: Callable[..., None]) -> Callable[..., None]:
    """``SamplingParams.__init__`` taking vLLM's field names too (``VLLM_NAMES``), and
    vLLM's fields dflash2rt has only at their default (``VLLM_DEFAULTS``)."""

    @functools.wraps(init)
    def __init__(self: SamplingParams, *args: Any, **kw: Any) -> None:
        for vllm, ours in VLLM_NAMES.items():
            if vllm not in kw:
                continue
            if ours in kw:
                raise ConflictingArgumentsError(
                    f"SamplingParams: {vllm} (vLLM's name) and {ours} are the same field: "
                    f"give one of them")
            value = kw.pop(vllm)
            if vllm == "stop":
                value = () if value is None else (value,) if isinstance(value, str) else value
            kw[ours] = value
        for name in VLLM_DEFAULTS.keys() & kw.keys():
            _vllm_default(name, kw.pop(name))
        if is_int(kw.get("top_k")) and kw["top_k"] == -1:
            kw["top_k"] = 0
        if "seed" in kw and kw["seed"] is None:     # vLLM's "no seed": a random one, kept
            kw["seed"] = secrets.randbits(62)
        init(self, *args, **kw)
    return __init__


SamplingParams.__init__ = _accept_vllm_names(  # type: ignore[method-assign]
    SamplingParams.__init__)


def is_int(value: object) -> bool:
    """An integer (numpy integers included), never a bool or a float."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_count(name: str, value: object, least: int) -> None:
    """``value`` an integer (``is_int``) >= ``least``, else an InvalidInputError naming it."""
    if not is_int(value) or value < least:
        raise InvalidInputError(f"{name} must be an integer >= {least}, got {value!r}")


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
        bad = [t for t in self.params.logit_bias if t >= vocab_size]
        if bad:
            raise InvalidInputError(f"logit_bias token ids {bad[:5]} are outside the vocabulary "
                                    f"[0, {vocab_size})")
        c = self.params.constraint
        if isinstance(c, TokenAutomaton) and c.vocab_size != vocab_size:
            raise ConstraintError(f"the constraint's token automaton has {c.vocab_size} "
                                  f"columns but the target's vocabulary has {vocab_size} "
                                  "tokens: build it with vocab_size=" + str(vocab_size))
        k = self.params.num_candidates
        if k is not None and k > vocab_size:
            raise InvalidInputError(f"num_candidates={k} asks for more candidates per draft slot "
                                    f"than the vocabulary has ({vocab_size})")
        if self.params.logprobs is not None and self.params.logprobs > vocab_size:
            raise InvalidInputError(f"logprobs={self.params.logprobs} asks for more "
                                    f"alternatives than the vocabulary has ({vocab_size})")


@dataclass
class RequestOutput:
    """What one request produced; ``finish_reason`` is "length", "stop_token", "stop_string",
    "constraint" (the output is a complete match and the constraint allows no more token) or
    "constraint_unsatisfiable" (the constraint allows no token and the output is not a match:
    a generic hook that got stuck, or one that cannot say)."""

    prompt_ids: tuple[int, ...]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""
    # With SamplingParams.logprobs = n: per emitted token, its log-probability and the top-n
    # alternatives {token id: log-probability} under the final processed law; else None.
    logprobs: list[float] | None = None
    top_logprobs: list[dict[int, float]] | None = None


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


LOGPROBS_MODES = ("raw", "processed")
VERIFICATIONS = ("token", "block")


def stop_cut(text: str, stops: Sequence[str], include: bool = False) -> int | None:
    """Where an output's text ends for its stop strings: at the earliest position in the text
    where any of them starts (ties: the shortest), after it with ``include`` (vLLM's
    include_stop_str_in_output); None when none occurs. One rule for the API's text, the CLI's
    streaming and the tests' reference. (vLLM checks its stop strings in list order and cuts at
    the first one found, which can leave an earlier, overlapping one in the text.)"""
    best = None
    for s in stops:
        k = text.find(s)
        if k >= 0 and (best is None or (k, len(s)) < best):
            best = (k, len(s))
    return None if best is None else best[0] + (best[1] if include else 0)


def block_size_or_default(block_size: object, default: int, most: int | None = None) -> int:
    """``block_size`` checked (an integer >= 1; 0 is not "default"; at most ``most``, the
    target's context: a block longer than the context the model holds has no use, and its
    step's attention grows with its square), or ``default`` for None."""
    if block_size is None:
        return default
    if not is_int(block_size) or block_size < 1:
        raise InvalidInputError(f"block_size must be an integer >= 1 (or None for the draft's "
                                f"default, {default}), got {block_size!r}")
    if most is not None and block_size > most:
        raise InvalidInputError(f"block_size must be at most {most} (the target's "
                                f"max_position_embeddings), got {block_size!r}")
    return int(block_size)
