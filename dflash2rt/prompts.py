"""Prompts as ``run`` and ``LLM.generate`` take them: a string, token-id lists, vLLM's prompt
dicts, or a list of those, checked and encoded to token ids with the pair's tokenizer."""

from __future__ import annotations

from typing import Any, Sequence

from .engine.request import is_int, unicode_problem
from .errors import InvalidInputError
from .models.pair import ModelPair


def prompt_list(prompts: Any) -> list[Any]:
    """The prompts as a list (one string or one vLLM prompt dict is a list of one), each vLLM
    prompt dict replaced by what it holds: ``{"prompt": text}`` (vLLM's ``TextPrompt``) by
    the text, ``{"prompt_token_ids": ids}`` (``TokensPrompt``) by the ids."""
    if isinstance(prompts, (str, dict)):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise InvalidInputError(f"prompts must be a string or a list of strings / token-id "
                                f"lists, got {type(prompts).__name__} {prompts!r:.80}")
    return [_from_dict(i, p) if isinstance(p, dict) else p for i, p in enumerate(prompts)]


def _from_dict(i: int, p: dict) -> Any:
    keys = sorted(map(str, p))
    if keys == ["prompt"] and isinstance(p["prompt"], str):
        return p["prompt"]
    if keys == ["prompt_token_ids"] and isinstance(p["prompt_token_ids"], (list, tuple)):
        return p["prompt_token_ids"]
    raise InvalidInputError(f"prompt {i} is a dict with keys {keys} ({p!r:.80}): a dict prompt "
                            "holds one key, 'prompt' (a string: vLLM's TextPrompt) or "
                            "'prompt_token_ids' (a list of token ids: TokensPrompt)")


def encode_prompts(pair: ModelPair, prompts: str | Sequence[str] | Sequence[Sequence[int]]
                   ) -> list[tuple[int, ...]]:
    """Prompts → token ids: a string, or a list of strings and/or token-id lists (and vLLM's
    prompt dicts: ``prompt_list``)."""
    out = []
    for i, p in enumerate(prompt_list(prompts)):
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
