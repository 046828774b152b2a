"""The two request kinds, parsed: ``/v1/completions`` and ``/v1/chat/completions`` bodies →
``protocol.Parsed`` (prompts as token ids, one SamplingParams)."""

from __future__ import annotations

from typing import Any

from ..engine.request import unicode_problem
from ..models.tokenizer import TextTokenizer
from . import protocol
from .chat import ChatTemplate
from .errors import bad
from .protocol import Limits, Parsed


def encoder(tokenizer: TextTokenizer | None):
    """Text → token ids, or a 400 where the text cannot be tokenized."""
    def encode(text: str, add_special_tokens: bool = True) -> list[int]:
        if tokenizer is None:
            raise bad("prompt", "this model has no tokenizer: give prompts as token ids")
        problem = unicode_problem(text)
        if problem:
            raise bad("prompt", f"the text is not valid Unicode ({problem})")
        return tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return encode


def completion(body: Any, limits: Limits, tokenizer: TextTokenizer | None) -> Parsed:
    body = protocol.check_fields(body, protocol.COMPLETION)
    model = protocol.model_of(body, limits)
    stream, include_usage = protocol.check_common(body)
    protocol.only(body, "echo", False, "the prompt is not echoed (echo=false)")
    protocol.only(body, "best_of", 1, "one candidate per choice (best_of=1)")
    protocol.only(body, "suffix", None, "no insertion suffix")
    if "prompt" not in body:
        raise bad("prompt", "prompt is required")
    prompts = protocol.prompt_ids(body["prompt"], encoder(tokenizer), limits.vocab)
    logprobs = protocol.integer(body, "logprobs", None)
    if logprobs is not None and not 0 <= logprobs <= protocol.MAX_TOP_LOGPROBS:
        raise bad("logprobs", f"logprobs must be an integer in [0, "
                              f"{protocol.MAX_TOP_LOGPROBS}], got {logprobs}")
    max_tokens = protocol.integer(body, "max_tokens", 16)
    for p in prompts:
        protocol.check_context(p, max_tokens, limits, "prompt")
    params = protocol.sampling_params(body, limits, max_tokens, logprobs, "logprobs")
    return Parsed(prompts, params, stream, include_usage, logprobs, model)


def chat(body: Any, limits: Limits, tokenizer: TextTokenizer | None,
         template: ChatTemplate | None) -> Parsed:
    body = protocol.check_fields(body, protocol.CHAT)
    model = protocol.model_of(body, limits)
    if template is None or tokenizer is None:
        raise bad("messages", "this model has no chat template, so chat completions are not "
                              "available: use /v1/completions, or start the server with "
                              "--chat-template FILE", "chat_template_missing")
    stream, include_usage = protocol.check_common(body)
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise bad("response_format", "response_format must be {\"type\": \"text\"}: for "
                                     "structured output send structured_outputs={\"regex\": "
                                     "...}")
    want = protocol.flag(body, "logprobs")
    top = protocol.integer(body, "top_logprobs", None)
    if top is not None and not want:
        raise bad("top_logprobs", "top_logprobs needs logprobs=true")
    if top is not None and not 0 <= top <= protocol.MAX_TOP_LOGPROBS:
        raise bad("top_logprobs", f"top_logprobs must be an integer in [0, "
                                  f"{protocol.MAX_TOP_LOGPROBS}], got {top}")
    logprobs = (top or 0) if want else None
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise bad("max_completion_tokens", "give max_tokens or max_completion_tokens, not both")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    max_tokens = protocol.integer(body, name, None)
    text = template.render(body.get("messages"),
                           protocol.flag(body, "add_generation_prompt", True))
    prompt = tuple(encoder(tokenizer)(text, add_special_tokens=False))
    if not prompt:
        raise bad("messages", "the chat template rendered these messages to no tokens")
    max_tokens = protocol.check_context(prompt, max_tokens, limits, "messages", name)
    params = protocol.sampling_params(body, limits, max_tokens, logprobs, "top_logprobs")
    return Parsed([prompt], params, stream, include_usage, logprobs, model)
