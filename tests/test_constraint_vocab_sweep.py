"""``constraints.vocab.vocab_bytes`` on a backend whose serialized form is written out by hand
(``to_str`` JSON and ``id_to_token``, the two things it reads), for the entries the
``tokenizers`` library always fills in but the reader guards against: an added token with no
id, and ``Replace`` decoders without a pattern object. Expected bytes are written out here.
"""

from __future__ import annotations

import json

from dflash2rt.constraints.vocab import vocab_bytes


class _JsonBackend:
    """``to_str()``: the given spec as JSON; ``id_to_token(i)``: ``pieces[i]``."""

    def __init__(self, pieces: list[str], spec: dict) -> None:
        self.pieces, self.spec = pieces, spec

    def to_str(self) -> str:
        return json.dumps(self.spec)

    def id_to_token(self, i: int) -> str:
        return self.pieces[i]


class _Tokenizer:
    def __init__(self, backend: _JsonBackend) -> None:
        self.backend, self.vocab_size = backend, len(backend.pieces)

    def decode(self, ids):
        return "".join(self.backend.pieces[i] for i in ids)


PIECES = ["a_", "b_", "c_"]
BYTE_FALLBACK = {"type": "ByteFallback"}


def _bytes(decoders: list[dict], added: list[dict] = ()) -> list[bytes | None]:
    spec = {"decoder": {"type": "Sequence", "decoders": decoders}, "added_tokens": list(added)}
    return vocab_bytes(_Tokenizer(_JsonBackend(PIECES, spec)), len(PIECES))


def test_a_special_added_token_without_an_id_takes_no_id_away():
    assert _bytes([BYTE_FALLBACK], [{"content": "<x>", "special": True}]) == \
        [b"a_", b"b_", b"c_"]
    assert _bytes([BYTE_FALLBACK], [{"id": 1, "content": "<x>", "special": True}]) == \
        [b"a_", None, b"c_"]


def test_a_replace_without_a_pattern_object_and_a_non_replace_with_one_change_nothing():
    plain = {"type": "Replace", "pattern": "_", "content": "-"}
    other = {"type": "Strip", "pattern": {"String": "_"}, "content": "-"}
    assert _bytes([plain, other, BYTE_FALLBACK]) == [b"a_", b"b_", b"c_"]
    real = {"type": "Replace", "pattern": {"String": "_"}, "content": "-"}
    assert _bytes([real, BYTE_FALLBACK]) == [b"a-", b"b-", b"c-"]
