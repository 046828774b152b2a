"""What each token contributes to the output, as bytes: the alphabet a constraint matches over.

Decoding one token alone is not what it adds to a text: a byte-fallback token ("<0xC3>") is
half a character and decodes to U+FFFD alone, a byte-level BPE token ("Ġx") is bytes written as
printable characters, and special tokens (EOS, "<|im_end|>") are markup, not text. As xgrammar's
tokenizer info does, this reads the vocabulary and the decoder of the ``tokenizers`` model:

- special tokens (added tokens marked special, and the ids given as EOS) have no bytes (None):
  a constraint never matches them as text;
- a ``ByteLevel`` decoder (GPT-2 style BPE: Qwen, Llama 3): each character of the token string
  is one byte, through the GPT-2 byte ↔ character table;
- a ``ByteFallback`` decoder (SentencePiece style: Llama 2, Mistral): "<0xHH>" is the byte HH,
  other tokens are their UTF-8 text after the decoder's "▁" → " " replacement;
- anything else: the UTF-8 of the token decoded alone.

``vocab_bytes(tokenizer, vocab, special)`` returns the list; a tokenizer without a ``tokenizers``
backend (a test's list of texts) gets the UTF-8 of ``decode([i])``.
"""

from __future__ import annotations

import json
import re
from typing import Sequence

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _gpt2_bytes() -> dict[str, int]:
    """GPT-2's printable character for each byte, inverted: character → byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


_BYTE_OF = _gpt2_bytes()


def _decoders(spec: dict | None) -> list[dict]:
    if not spec:
        return []
    if spec.get("type") == "Sequence":
        return [d for sub in spec.get("decoders", []) for d in _decoders(sub)]
    return [spec]


def vocab_bytes(tokenizer, vocab: int, special: Sequence[int] = ()) -> list[bytes | None]:
    """Each token id's bytes in the output (None: a special token, never text); ids past the
    tokenizer's vocabulary are None too."""
    backend = getattr(tokenizer, "backend", None)
    n = min(vocab, tokenizer.vocab_size)
    out: list[bytes | None] = [None] * vocab
    if backend is None or not hasattr(backend, "id_to_token"):
        for i in range(n):
            out[i] = tokenizer.decode([i]).encode("utf-8")
    else:
        spec = json.loads(backend.to_str())
        kinds = {d.get("type") for d in _decoders(spec.get("decoder"))}
        replace = [(d["pattern"].get("String"), d["content"]) for d in _decoders(spec.get("decoder"))
                   if d.get("type") == "Replace" and isinstance(d.get("pattern"), dict)]
        for i in range(n):
            out[i] = _token_bytes(backend, tokenizer, i, kinds, replace)
        for added in spec.get("added_tokens", []):
            if added.get("special") and 0 <= added.get("id", -1) < vocab:
                out[added["id"]] = None
    for i in special:
        if 0 <= i < vocab:
            out[i] = None
    return out


def _token_bytes(backend, tokenizer, i: int, kinds: set, replace: list) -> bytes | None:
    piece = backend.id_to_token(i)
    if piece is None:
        return None
    if "ByteLevel" in kinds:
        try:
            return bytes(_BYTE_OF[c] for c in piece)
        except KeyError:                     # an added token written as plain text
            return tokenizer.decode([i]).encode("utf-8")
    if "ByteFallback" in kinds:
        m = _BYTE_TOKEN.fullmatch(piece)
        if m:
            return bytes([int(m.group(1), 16)])
        for old, new in replace:
            if old:
                piece = piece.replace(old, new)
        if "Metaspace" in kinds:
            piece = piece.replace("▁", " ")
        return piece.encode("utf-8")
    return tokenizer.decode([i]).encode("utf-8")
