"""Chat templates: the model's (``chat_template`` in the target's tokenizer_config.json, or a
``chat_template.jinja`` beside it) or one given to the server, rendered as Hugging Face's
``apply_chat_template`` renders it (a sandboxed Jinja environment with loop controls, the
``tojson`` filter, ``raise_exception`` and ``strftime_now``; ``messages``,
``add_generation_prompt``, the special tokens), then tokenized without added special tokens."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, InvalidInputError
from ..models.tokenizer import read_json_object
from .errors import bad

ROLES = ("system", "developer", "user", "assistant", "tool")


def find_template(target_dir: Path | None, given: str | None) -> str | None:
    """The template to use: ``given`` (a file's path, or the template itself), else the
    model's, else None (chat completions are then refused)."""
    if given is not None:
        p = Path(given).expanduser()
        if p.is_file():
            return p.read_text(encoding="utf-8")
        if "{" not in given:
            raise InvalidInputError(f"--chat-template {given!r} is neither a file nor a Jinja "
                                    "template")
        return given
    if target_dir is None:
        return None
    jinja = target_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    cfg = target_dir / "tokenizer_config.json"
    if not cfg.is_file():
        return None
    t = read_json_object(cfg).get("chat_template")
    if isinstance(t, list):            # named templates: the default one
        if not all(isinstance(x, dict) for x in t):
            raise CheckpointError(f"{cfg}: chat_template as a list must hold objects with a "
                                  f"name and a template")
        t = next((x.get("template") for x in t if x.get("name") == "default"), None)
    if t is not None and not isinstance(t, str):
        raise CheckpointError(f"{cfg}: chat_template must be a string, or a list of named "
                              f"templates, got {type(t).__name__}")
    return t


def special_tokens(target_dir: Path | None) -> dict[str, str]:
    """bos_token / eos_token of the target's tokenizer_config.json, as templates read them."""
    cfg = None if target_dir is None else target_dir / "tokenizer_config.json"
    if cfg is None or not cfg.is_file():
        return {}
    data = read_json_object(cfg)
    out = {}
    for name in ("bos_token", "eos_token"):
        v = data.get(name)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            out[name] = v
    return out


class ChatTemplate:
    """A compiled template; ``render(messages)`` → the prompt text."""

    def __init__(self, source: str, specials: dict[str, str]) -> None:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False,
                                                                  indent=indent)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self.template = env.from_string(source)
        except TemplateError as exc:
            raise InvalidInputError(f"the chat template does not compile: {exc}") from exc
        self.specials = specials

    def render(self, messages: Any, add_generation_prompt: bool) -> str:
        from jinja2 import TemplateError

        messages = check_messages(messages)
        try:
            return self.template.render(messages=messages,
                                        add_generation_prompt=add_generation_prompt,
                                        **self.specials)
        except (TemplateError, TemplateRefusal) as exc:
            raise bad("messages", f"the chat template refused the messages: {exc}") from exc
        except (ArithmeticError, LookupError, TypeError, ValueError, RecursionError) as exc:
            # the template's own expression failed on these messages (as vLLM, a 400); a
            # macro that calls itself without end as well
            raise bad("messages", f"the chat template failed on the messages: "
                                  f"{type(exc).__name__}: {exc}") from exc


class TemplateRefusal(Exception):
    """``raise_exception(...)`` called by a template."""


def _raise(message: str) -> None:
    raise TemplateRefusal(message)


def check_messages(messages: Any) -> list[dict[str, str]]:
    """OpenAI's messages: a non-empty list of {role, content} with string content (or a list
    of text parts, joined) → plain {role, content} dicts."""
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "messages must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not set(m) <= {"role", "content", "name"}:
            raise bad(f"messages[{i}]", f"messages[{i}] must be an object with role and "
                                        f"content (and optionally name), got {m!r:.80}")
        if m.get("role") not in ROLES:
            raise bad(f"messages[{i}].role", f"messages[{i}].role must be one of {ROLES}, got "
                                             f"{m.get('role')!r}")
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str) for p in content):
                raise bad(f"messages[{i}].content", "content parts must be "
                                                    "{\"type\": \"text\", \"text\": ...}: "
                                                    "this server takes text only")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise bad(f"messages[{i}].content", f"messages[{i}].content must be a string, "
                                                f"got {content!r:.80}")
        out.append({"role": m["role"], "content": content})
    return out
