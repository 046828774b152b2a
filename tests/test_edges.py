"""Edges: a stop string at offset 0, an ignored EOS at the end of a match, whitespace key bytes."""

from __future__ import annotations

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.constraints import TokenAutomaton
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams, stop_cut
from dflash2rt.watermark import WatermarkKey

from test_stops import A, CA, EOS, TOK, VOCAB, _word
from tiny_models import oracle_pair

BLOCK = 8
MODES = [dict(block_size=BLOCK), dict(spec=False)]          # speculative, target-only


@pytest.fixture(scope="module")
def engine():
    pair = oracle_pair(BLOCK, dtype=torch.float32)
    pair.tokenizer = TOK
    return Engine(pair, get_backend("cpu"))


def _out(engine, params: SamplingParams, **mode):
    outs, _ = engine.generate([Request(A, params)], **mode)
    return outs[0].token_ids, outs[0].text, outs[0].finish_reason


def test_the_rule_cuts_a_stop_at_offset_zero():
    assert stop_cut("n0k0", ("n",)) == 0 and stop_cut("n0k0", ("n0",), include=True) == 2
    assert stop_cut("n0k0", ("0k", "n0")) == 0                   # the earliest, at 0


@pytest.mark.parametrize("mode", MODES, ids=["spec", "target-only"])
@pytest.mark.parametrize("stop", [_word(CA[0]), _word(CA[0])[0]], ids=["token", "char"])
def test_a_stop_string_at_offset_zero_ends_the_text_there(engine, mode, stop):
    """The first generated token's text starts with the stop string: the text is empty (the
    token that completed it is kept), or the stop string itself with include."""
    p = SamplingParams(max_new_tokens=12, stop_strings=(stop,))
    assert _out(engine, p, **mode) == ([CA[0]], "", "stop_string")
    p = SamplingParams(max_new_tokens=12, stop_strings=(stop,), include_stop_str_in_output=True)
    assert _out(engine, p, **mode) == ([CA[0]], stop, "stop_string")


def _three_words() -> TokenAutomaton:
    """The exact text of the chain's first three tokens, then EOS (a dead end)."""
    text = "".join(_word(t) for t in CA[:3])
    return TokenAutomaton.from_regex(text, TOK, VOCAB, eos=[EOS])


@pytest.mark.parametrize("mode", MODES, ids=["spec", "target-only"])
def test_ignored_eos_at_the_end_of_a_match_is_the_constraints_end(engine, mode):
    """At the end of the match only EOS is allowed. Honoured, it stops the request before it
    ("stop_token"); ignored, it is output and its transition is the automaton's dead end: the
    request ends there, "constraint", with EOS as its last token (not EOS again to the length
    limit)."""
    a = _three_words()
    words = "".join(_word(t) for t in CA[:3])
    assert _out(engine, SamplingParams(max_new_tokens=12, constraint=a), **mode) == \
        (CA[:3], words, "stop_token")
    p = SamplingParams(max_new_tokens=12, constraint=a, ignore_eos=True)
    assert _out(engine, p, **mode) == (CA[:3] + [EOS], words + _word(EOS), "constraint")
    s = a.initial()
    for t in CA[:3] + [EOS]:
        s = a.advance(s, t)
    assert a.dead[s] and a.accepting(s)


WHITESPACE = b" \t\n\r\x0b\x0c"


@pytest.mark.parametrize("secret", [
    b" " + bytes(range(100, 130)) + b"\n",                      # whitespace at both ends
    b"\n" * 4 + bytes(range(200, 228)),                         # leading newlines
    bytes(range(40, 70)) + b"\r\n",                             # a CRLF at the end
    WHITESPACE * 5 + b"  ",                                     # whitespace only
    b"0123456789abcdef" * 2,                                    # 32 hex digits: raw, not hex
], ids=["both-ends", "leading", "crlf", "all-whitespace", "hex-looking"])
def test_raw_key_bytes_are_the_key_whitespace_included(tmp_path, secret):
    """A 32-byte raw key file is the key byte for byte: whitespace at its ends is part of it
    (only the hex form is stripped)."""
    assert len(secret) == 32
    f = tmp_path / "k"
    f.write_bytes(secret)
    f.chmod(0o600)
    key = WatermarkKey.from_file(f)
    assert key == WatermarkKey(secret)
    assert key.fingerprint == WatermarkKey(secret).fingerprint
    f.write_bytes(b"\n " + secret.hex().encode() + b"\n")       # its hex form, padded
    assert WatermarkKey.from_file(f) == key
