"""Regex constraints over tokens, checked against the ``regex`` module (``re``'s superset, whose
``partial=True`` says whether a text can still be extended into a full match): random patterns
of the supported grammar on a byte-fallback tokenizer (single bytes "<0xC3>", multi-character
tokens, a token for "é" and special tokens that read like text) and on the bundled byte-level
tokenizer. For every pattern:

- every random walk of the automaton that ends with EOS decodes to valid UTF-8 that
  ``re.fullmatch``es (re.ASCII: the escape classes are ASCII, as documented);
- at every state a walk reaches, a non-special token is allowed exactly when the text so far
  plus its text can still become a full match (``regex.fullmatch(..., partial=True)``; every
  character the patterns use can be spelled, byte by byte, so "can become a match" is the
  same for texts and for tokens);
- EOS is allowed exactly where the text is a full match; other special tokens never;
- random strings (and each walk's text), cut into tokens: the automaton walks the tokens and
  allows EOS after them exactly when ``re.fullmatch`` says the string matches.
"""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from dflash2rt.constraints import TokenAutomaton
from dflash2rt.errors import ConstraintError
from dflash2rt.models.tokenizer import TextTokenizer

from test_regex_property import _pattern

regex = pytest.importorskip("regex", reason="the regex module (a transformers dependency) "
                            "gives the partial-match reference")
ALPHABET = "ab01 _-\n.é"
WORDS = ["<eos>", "<|im_end|>", "a", "b", "ab", "ba", "0", "1", "01", " ", "_", "-", ".", "\n",
         "é", "aé", "<eos", "im_end"]


def byte_fallback_tokenizer() -> tuple[TextTokenizer, list[int]]:
    from tokenizers import AddedToken, Tokenizer, decoders, models

    words = WORDS + [f"<0x{b:02X}>" for b in sorted(set(ALPHABET.encode()))]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="a"))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken("<eos>", special=True),
                            AddedToken("<|im_end|>", special=True)])
    return TextTokenizer(tok, eos_token_ids=(0,), bos_token_id=None), [0, 1]


def bundled_tokenizer() -> tuple[TextTokenizer, list[int]]:
    from dflash2rt.models.tokenizer import load_tokenizer
    from dflash2rt.bundled import bundled_path

    tok = load_tokenizer(bundled_path("stdlib-code") / "target")
    return tok, list(tok.eos_token_ids)


def _text_of(tok, ids) -> bytes:
    """The UTF-8 the ids add (their bytes, joined: what the automaton reads)."""
    return tok.decode(list(ids)).encode("utf-8", "surrogatepass")


def _random_string(g: random.Random) -> str:
    return "".join(g.choice(ALPHABET) for _ in range(g.randint(0, 7)))


def _accepts(auto, ids, eos) -> bool:
    """Whether the automaton walks ``ids`` and then allows EOS."""
    state = auto.initial()
    for t in ids:
        if not auto.allowed(state)[t]:
            return False
        state = auto.advance(state, t)
    return bool(auto.allowed(state)[eos])


def _check_strings(auto, tok, pat, eos, strings) -> int:
    for text, ids in strings:
        assert tok.decode(ids) == text, (text, ids)
        assert _accepts(auto, ids, eos) == (re.fullmatch(pat, text, re.ASCII) is not None), \
            (pat, text, ids)
    return len(strings)


def _check_pattern(tok, special, pat, g, walks, checks, cut, counts):
    eos = special[0]
    try:
        auto = TokenAutomaton.from_regex(pat, tok, tok.vocab_size, eos=[eos])
    except ConstraintError:
        # refused as unsatisfiable: no word of the alphabet matches (each atom can be spelled)
        assert not any(re.fullmatch(pat, w, re.ASCII) for w in ("", *ALPHABET)), pat
        return 0
    rx = regex.compile(pat, regex.ASCII)
    ended, texts = 0, []
    for _ in range(walks):
        state, ids = auto.initial(), []
        for _ in range(12):
            allowed = np.flatnonzero(auto.allowed(state))
            assert len(allowed), (pat, ids)                  # pruned: never stuck
            text = tok.decode(ids)
            full = rx.fullmatch(text) is not None and "\ufffd" not in text
            assert auto.allowed(state)[eos] == full, (pat, text)
            assert not auto.allowed(state)[special[1:]].any()
            for t in g.sample(range(tok.vocab_size), min(checks, tok.vocab_size)):
                if t in special:
                    continue
                nxt = tok.decode(ids + [t])
                if "\ufffd" in nxt:                           # mid-character: not checkable
                    continue
                can = rx.fullmatch(nxt, partial=True) is not None
                assert bool(auto.allowed(state)[t]) == can, (pat, nxt, t)
            t = int(g.choice(list(allowed)))
            if t == eos:
                assert re.fullmatch(pat, text, re.ASCII) is not None, (pat, text)
                assert "\ufffd" not in text                   # valid UTF-8
                texts.append((text, list(ids)))
                ended += 1
                break
            ids.append(t)
            state = auto.advance(state, t)
    strings = texts + [(text, cut(text)) for text in (_random_string(g) for _ in range(24))]
    counts["strings"] += _check_strings(auto, tok, pat, eos, strings)
    counts["patterns"] += 1
    return ended


def _byte_cut(tok, g: random.Random):
    """A random segmentation of a text into the byte-fallback vocabulary: at each point any
    word that spells what follows, or the next byte's own token."""
    backend = tok.backend
    words = [(w, backend.token_to_id(w)) for w in WORDS if not w.startswith("<")]

    def cut(text: str) -> list[int]:
        data, ids, i = text.encode(), [], 0
        while i < len(data):
            fits = [(w, t) for w, t in words if data.startswith(w.encode(), i)]
            if fits and g.random() < 0.7:
                w, t = g.choice(fits)
                ids.append(t)
                i += len(w.encode())
            else:
                ids.append(backend.token_to_id(f"<0x{data[i]:02X}>"))
                i += 1
        return ids
    return cut


def test_byte_fallback_tokenizer_against_regex():
    tok, special = byte_fallback_tokenizer()
    assert tok.decode([tok.backend.token_to_id("<0xC3>")]) == "\ufffd"   # half a character
    g = random.Random(7)
    counts, ended = {"patterns": 0, "strings": 0}, 0
    for _ in range(200):
        ended += _check_pattern(tok, special, _pattern(g), g, walks=6,
                                checks=len(WORDS) + 12, cut=_byte_cut(tok, g), counts=counts)
    print(f"byte-fallback tokenizer: {counts['patterns']} patterns x {counts['strings']} "
          f"strings in all, {ended} walks ended by EOS")
    assert counts["patterns"] > 150 and counts["strings"] > 150 * 24 and ended > 100


def test_bundled_byte_level_tokenizer_against_regex():
    tok, special = bundled_tokenizer()
    g = random.Random(11)
    counts, ended = {"patterns": 0, "strings": 0}, 0
    cut = lambda text: tok.encode(text, add_special_tokens=False)        # noqa: E731
    for _ in range(60):
        ended += _check_pattern(tok, special, _pattern(g), g, walks=3, checks=150, cut=cut,
                                counts=counts)
    print(f"bundled tokenizer: {counts['patterns']} patterns x {counts['strings']} strings in "
          f"all, {ended} walks ended by EOS")
    assert counts["patterns"] > 40 and counts["strings"] > 40 * 24 and ended > 10


def test_special_tokens_are_never_text_and_byte_tokens_spell_characters():
    tok, special = byte_fallback_tokenizer()
    eos, im_end = special
    # ".*x"-like: a pattern whose "." could eat "<eos>" or "<|im_end|>" read as text
    auto = TokenAutomaton.from_regex(".*b", tok, tok.vocab_size, eos=[eos])
    assert not auto.allowed(auto.initial())[eos]             # "" does not match: no EOS
    assert not auto.allowed(auto.initial())[im_end]
    s = auto.advance(auto.initial(), tok.backend.token_to_id("b"))
    assert auto.allowed(s)[eos] and auto.accepting(s)
    # "é" from its two byte tokens; "[^é]*" refuses the first of them
    c3, a9 = (tok.backend.token_to_id(f"<0x{b:02X}>") for b in "é".encode())
    only = TokenAutomaton.from_regex("é", tok, tok.vocab_size, eos=[eos])
    mid = only.advance(only.initial(), c3)
    assert not only.allowed(mid)[eos] and not only.accepting(mid)
    assert only.allowed(only.advance(mid, a9))[eos]
    not_e = TokenAutomaton.from_regex("[^é]*", tok, tok.vocab_size, eos=[eos])
    assert not not_e.allowed(not_e.initial())[c3]
    assert not not_e.allowed(not_e.initial())[tok.backend.token_to_id("é")]
    # "a.b": the middle must be one whole character, never a lone byte
    dot = TokenAutomaton.from_regex("a.b", tok, tok.vocab_size, eos=[eos])
    s = dot.advance(dot.initial(), tok.backend.token_to_id("a"))
    s = dot.advance(s, c3)
    assert not dot.allowed(s)[tok.backend.token_to_id("b")]      # "a" + 0xC3 + "b": invalid
    assert dot.allowed(s)[a9]
    # a special token the user allows: anywhere, state unchanged
    ok = TokenAutomaton.from_regex("ab", tok, tok.vocab_size, eos=[eos], allow_special=[im_end])
    assert ok.allowed(ok.initial())[im_end] and ok.advance(ok.initial(), im_end) == 0


def test_a_vocabulary_that_cannot_spell_any_match_is_refused():
    tok, special = byte_fallback_tokenizer()
    with pytest.raises(ConstraintError, match="no text the vocabulary can spell"):
        TokenAutomaton.from_regex("zz|q", tok, tok.vocab_size, eos=special[:1])


def test_begun_characters_that_a_pattern_cannot_tell_apart_are_one_state():
    """A byte-level vocabulary holds every lone byte, so a walk can begin any of the ~20,000
    three-byte prefixes of four-byte characters; the pattern names none of them, so they are
    the same few states (and dead ones are the dead state)."""
    from dflash2rt.constraints.regex import CharDFA
    from dflash2rt.constraints.utf8 import ByteDFA

    tok, special = bundled_tokenizer()
    assert TokenAutomaton.from_regex(r"\W+", tok, tok.vocab_size, eos=special).num_states < 16
    assert TokenAutomaton.from_regex(r"\w+", tok, tok.vocab_size, eos=special).num_states < 8
    dfa = ByteDFA(CharDFA("[^é]é"))
    ends = {dfa.step(dfa.step(dfa.step(dfa.step(0, 0xF0), b2), b3), 0x80)
            for b2 in range(0x90, 0xC0) for b3 in range(0x80, 0xC0)}
    assert len(ends) == 1 and ByteDFA.DEAD not in ends
    assert dfa.step(0, 0xC3) != dfa.step(0, 0xC4)          # "é" begins with 0xC3: told apart
    assert dfa.matches("xé".encode()) and dfa.matches("😀é".encode())
    assert not dfa.matches("éé".encode()) and not dfa.matches(b"\xf0\x9f\x98")


def test_a_branch_the_vocabulary_cannot_finish_is_pruned():
    """``a(bc)?`` over a vocabulary with no "c": after "a" the "b" that could only be
    followed by "c" is refused, so no request can get stuck at "ab"; EOS is allowed."""
    tok, special = byte_fallback_tokenizer()
    auto = TokenAutomaton.from_regex("a(bc)?", tok, tok.vocab_size, eos=special[:1])
    s = auto.advance(auto.initial(), tok.backend.token_to_id("a"))
    assert auto.allowed(s)[special[0]] and auto.accepting(s)
    assert not auto.allowed(s)[tok.backend.token_to_id("b")]
    assert not auto.allowed(s)[tok.backend.token_to_id("<0x62>")]
    assert not auto.allowed(auto.initial())[tok.backend.token_to_id("ab")]
    assert not auto.dead[auto.initial()] and auto.allowed(s).sum() == 1
