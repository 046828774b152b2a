"""vLLM's offline API, shaped: ``LLM`` loads a model pair once on one backend and decodes many
times through one ``Engine`` (the decode path of :func:`dflash2rt.api.run`); ``generate``
returns one ``LLMOutput`` per prompt, with vLLM's ``CompletionOutput`` and ``Logprob``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .api import (DEFAULT_MODEL, ModelSpec, backend_of, generate_requests, measured_table,
                  params_list, regex_constraint, resolve_model, watermark_key)
from .backend import Backend
from .constraints import TokenAutomaton
from .engine.engine import Engine
from .engine.request import RequestOutput, SamplingParams
from .engine.stats import RunStats
from .errors import DFlash2Error, InvalidInputError, MissingExtraError
from .models.pair import ModelPair
from .progress import Progress, bar_factory
from .prompts import encode_prompts, prompt_list
from .watermark import WatermarkKey


@dataclass
class Logprob:
    """One token's log-probability, as vLLM's ``Logprob``: ``rank`` is 1 for the most likely
    token; None for a sampled token outside the top-n alternatives (its rank is not computed)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One completion, shaped as vLLM's ``CompletionOutput``. ``logprobs``: with
    ``SamplingParams.logprobs = n``, per token a {token id: Logprob} of the token and its top-n
    alternatives, else None; ``cumulative_logprob`` their sum over the tokens (else None).
    ``finish_reason``: dflash2rt's own (``RequestOutput``): "length", "stop_token",
    "stop_string", "constraint" or "constraint_unsatisfiable" (vLLM says "stop" for the middle
    three)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str

    def finished(self) -> bool:
        return True


@dataclass
class LLMOutput:
    """One prompt's result, shaped as vLLM's ``RequestOutput``: ``prompt`` (None for a prompt
    given as token ids), ``prompt_token_ids``, ``outputs`` (one ``CompletionOutput``: dflash2rt
    makes one completion per prompt) and ``finished`` (always True: ``generate`` returns
    finished requests). ``request_id``: the prompt's index in its ``generate`` call."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


def render_chat(template: Any, messages: Any, add_generation_prompt: bool, where: str) -> str:
    """``template.render`` with its 400s (``serve.errors.APIError``) as InvalidInputErrors."""
    from .serve.errors import APIError

    try:
        return template.render(messages, add_generation_prompt)
    except APIError as exc:
        raise InvalidInputError(f"{where}{exc.message}") from exc


def _llm_output(i: int, prompt: object, out: RequestOutput, tokenizer: Any) -> LLMOutput:
    logprobs = cumulative = None
    if out.logprobs is not None:
        logprobs = []
        for t, lp, top in zip(out.token_ids, out.logprobs, out.top_logprobs or []):
            ranked = {k: j + 1 for j, (k, _) in
                      enumerate(sorted(top.items(), key=lambda kv: -kv[1]))}
            entry = {t: Logprob(lp, ranked.get(t))}
            entry.update({k: Logprob(v, ranked[k]) for k, v in top.items() if k != t})
            if tokenizer is not None:
                for k, v in entry.items():
                    v.decoded_token = tokenizer.decode([k])
            logprobs.append(entry)
        cumulative = float(sum(out.logprobs))
    return LLMOutput(str(i), prompt if isinstance(prompt, str) else None, list(out.prompt_ids),
                     [CompletionOutput(0, out.text, list(out.token_ids), cumulative, logprobs,
                                       out.finish_reason)])


class LLM:
    """A model pair loaded once on one backend, decoded many times: vLLM's ``LLM``, shaped.

    ``model``, ``backend``, ``dtype``, ``draft``, ``revision``, ``draft_revision``: as for
    ``run`` (``resolve_model``); the pair (``self.pair``) is loaded here and an ``Engine``
    (``self.engine``, vLLM's ``llm_engine``) made, kept for every ``generate`` call: captured
    graphs are replayed by later calls, and ``engine.policy`` may be assigned (engine/policy/).
    ``last_stats``: the ``RunStats`` of the latest ``generate`` call (None before the first).
    ``close()`` (or ``with LLM(...) as llm:``) releases the engine's graphs and caches and the
    pair.
    """

    def __init__(self, model: ModelSpec = DEFAULT_MODEL, backend: str | Backend | None = None,
                 *, dtype: torch.dtype | str = "auto", draft: str | Path | None = None,
                 revision: str | None = None, draft_revision: str | None = None) -> None:
        self.backend = backend_of(backend)
        self.pair: ModelPair | None = resolve_model(
            model, self.backend.device, dtype, draft=draft, revision=revision,
            draft_revision=draft_revision)
        self.engine: Engine | None = Engine(self.pair, self.backend,
                                            table=measured_table(self.pair, self.backend.device))
        self.last_stats: RunStats | None = None
        self._templates: dict[str, Any] = {}        # chat's compiled templates, by source

    def generate(self, prompts: str | Sequence[str] | Sequence[Sequence[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 block_size: int | None = None, spec: bool = True,
                 watermark: WatermarkKey | str | Path | None = None,
                 on_tokens: Callable[[int, list[int]], None] | None = None,
                 use_tqdm: bool | Callable[..., Any] = False) -> list[LLMOutput]:
        """Decode ``prompts`` (a string, or a list of strings and/or token-id lists; vLLM's
        prompt dicts ``{"prompt": text}`` / ``{"prompt_token_ids": ids}`` as well), one
        ``LLMOutput`` per prompt, in order. ``sampling_params``: None (``SamplingParams()``:
        greedy, 64 new tokens), one for every prompt, or a list, one per prompt.
        ``block_size``, ``spec``, ``watermark``, ``on_tokens``: as for ``run``. ``use_tqdm``:
        vLLM's progress bar of the prompts processed (True: tqdm's, which must be installed;
        a callable: called as tqdm is, ``(total=, desc=, dynamic_ncols=)``); off by default
        (vLLM's is on). The call's stats: ``self.last_stats``."""
        if self.engine is None or self.pair is None:
            raise DFlash2Error("this LLM is closed: make a new one")
        factory = bar_factory(use_tqdm)
        key = watermark_key(watermark)
        listed = prompt_list(prompts)
        prompt_ids = encode_prompts(self.pair, listed)
        params = params_list(sampling_params, len(prompt_ids))
        kw = dict(spec=spec, block_size=block_size, on_tokens=on_tokens, watermark=key)
        if factory is None:
            outputs, self.last_stats = generate_requests(self.engine, prompt_ids, params, **kw)
        else:
            bar = Progress(factory, len(prompt_ids), on_tokens)
            try:
                outputs, self.last_stats = generate_requests(
                    self.engine, prompt_ids, params, **{**kw, "on_tokens": bar.tokens},
                    on_finish=bar.finish)
            finally:
                bar.close()
        return [_llm_output(i, p, o, self.pair.tokenizer)
                for i, (p, o) in enumerate(zip(listed, outputs))]

    def chat(self, messages: Sequence[Any], sampling_params: SamplingParams |
             Sequence[SamplingParams] | None = None, *, chat_template: str | None = None,
             add_generation_prompt: bool = True, block_size: int | None = None,
             spec: bool = True, watermark: WatermarkKey | str | Path | None = None,
             on_tokens: Callable[[int, list[int]], None] | None = None,
             use_tqdm: bool | Callable[..., Any] = False) -> list[LLMOutput]:
        """vLLM's ``LLM.chat``: ``messages`` is one conversation (a list of OpenAI's
        ``{"role", "content"}`` messages, content a string or a list of text parts) or a list
        of conversations. Each is rendered by the chat template as the server's
        ``/v1/chat/completions`` renders it (``serve/chat.py``: Hugging Face's
        ``apply_chat_template``, then tokenized without added special tokens) and decoded as
        ``generate`` decodes a prompt; one ``LLMOutput`` per conversation, its ``prompt`` the
        rendered text. ``chat_template``: the template itself or a file (None: the model's,
        from its tokenizer_config.json or chat_template.jinja). The other arguments are
        ``generate``'s. Needs jinja2 (``pip install 'dflash2rt[serve]'``)."""
        if self.engine is None or self.pair is None:
            raise DFlash2Error("this LLM is closed: make a new one")
        if not isinstance(add_generation_prompt, bool):
            raise InvalidInputError(f"add_generation_prompt must be True or False, got "
                                    f"{add_generation_prompt!r}")
        many = isinstance(messages, (list, tuple)) and len(messages) > 0 and \
            all(isinstance(m, (list, tuple)) for m in messages)
        conversations = list(messages) if many else [messages]
        template = self._chat_template(chat_template)
        texts, prompts = [], []
        for i, conv in enumerate(conversations):
            where = f"conversation {i}: " if many else ""
            text = render_chat(template, list(conv) if isinstance(conv, tuple) else conv,
                               add_generation_prompt, where)
            ids = self.pair.tokenizer.encode(text, add_special_tokens=False)
            if not ids:
                raise InvalidInputError(f"{where}the chat template rendered the messages to no "
                                        f"tokens")
            texts.append(text)
            prompts.append(ids)
        outs = self.generate(prompts, sampling_params, block_size=block_size, spec=spec,
                             watermark=watermark, on_tokens=on_tokens, use_tqdm=use_tqdm)
        for text, out in zip(texts, outs):
            out.prompt = text
        return outs

    def _chat_template(self, given: str | None) -> Any:
        """The compiled template ``chat`` renders with (kept per source)."""
        try:
            from .serve.chat import ChatTemplate, find_template, special_tokens
            import jinja2  # noqa: F401
        except ImportError as exc:
            raise MissingExtraError(f"LLM.chat needs jinja2 ({exc.name} is missing): pip "
                                    f"install 'dflash2rt[serve]'") from exc
        if given is not None and not isinstance(given, str):
            raise InvalidInputError(f"chat_template must be a template or a file's path, got "
                                    f"{given!r}")
        if self.pair.tokenizer is None:
            raise InvalidInputError("this model has no tokenizer: chat needs one to tokenize "
                                    "the rendered messages")
        src = getattr(self.pair.target, "source_dir", None)
        target_dir = None if src is None else Path(src)
        source = find_template(target_dir, given)
        if source is None:
            raise InvalidInputError("this model has no chat template (no chat_template in its "
                                    "tokenizer_config.json, no chat_template.jinja): give "
                                    "chat_template=, the template or a file")
        if source not in self._templates:
            self._templates[source] = ChatTemplate(source, special_tokens(target_dir))
        return self._templates[source]

    def regex_constraint(self, regex: str) -> TokenAutomaton:
        """The constraint for ``SamplingParams(constraint=...)`` that makes an output a full
        match of ``regex`` (as ``run(regex=...)``)."""
        if self.pair is None:
            raise DFlash2Error("this LLM is closed: make a new one")
        return regex_constraint(self.pair, regex)

    @property
    def tokenizer(self) -> Any:
        return None if self.pair is None else self.pair.tokenizer

    def get_tokenizer(self) -> Any:
        """The target's tokenizer (vLLM's ``LLM.get_tokenizer``; None for a model without
        one)."""
        if self.pair is None:
            raise DFlash2Error("this LLM is closed: make a new one")
        return self.pair.tokenizer

    def close(self) -> None:
        """Release the engine's graphs and static caches and drop the pair; idempotent."""
        if self.engine is not None:
            self.engine.close()
        self.engine = self.pair = None

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
