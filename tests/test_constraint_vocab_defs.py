"""``constraints.vocab.vocab_bytes`` against definitions written out here: GPT-2's byte ↔
character table (its published construction, checked against the ``tokenizers`` library's
byte-level pre-tokenizer on every byte that occurs in UTF-8), SentencePiece's "<0xHH>" byte
tokens and "▁" for a space, and each id's exact value (bytes or None) in vocabularies with
every byte token, special and plain added tokens, and ids on both sides of each bound.
"""

from __future__ import annotations

import random

import pytest

from dflash2rt.constraints.vocab import vocab_bytes

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models  # noqa: E402


def _gpt2_char_of_byte() -> dict[int, str]:
    """GPT-2's ``bytes_to_unicode``: printable Latin-1 bytes stand for themselves, the others
    (in byte order) for U+0100, U+0101, ..."""
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC
                 or 0xAE <= b <= 0xFF]
    out, n = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in out:
            out[b] = chr(0x100 + n)
            n += 1
    return out


CHAR = _gpt2_char_of_byte()


def test_the_written_out_gpt2_table_is_the_tokenizers_librarys():
    from tokenizers import pre_tokenizers

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    for cp in list(range(0x80)) + [0x80, 0xE9, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFF, 0x10000,
                                   0x10FFFF] + list(range(0xC0, 0x7FF, 7)):
        data = chr(cp).encode("utf-8")
        (piece, _), = pre.pre_tokenize_str(chr(cp))
        assert piece == "".join(CHAR[b] for b in data), hex(cp)
    assert len(set(CHAR.values())) == 256


def _wordlevel(words: list[str], decoder) -> Tokenizer:
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token=words[0]))
    if decoder is not None:
        tok.decoder = decoder
    return tok


class _Wrapped:
    """What ``vocab_bytes`` reads: ``backend``, ``vocab_size`` (with added tokens), ``decode``."""

    def __init__(self, backend: Tokenizer) -> None:
        self.backend = backend
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)

    def decode(self, ids):
        return self.backend.decode(list(ids), skip_special_tokens=False)


def test_byte_level_tokens_are_their_bytes_through_the_gpt2_table():
    g = random.Random(0)
    multi = [bytes(g.randrange(256) for _ in range(g.randint(2, 5))) for _ in range(60)]
    multi += ["é".encode(), " x".encode(), "😀".encode(), b"\xc3\xc3", b"\xff\xfe"]
    want = [bytes([b]) for b in range(256)] + list(dict.fromkeys(multi))
    words = ["".join(CHAR[b] for b in w) for w in want]
    tok = _wordlevel(words, decoders.ByteLevel())
    # added tokens that are not special: "<tool>" is written in table characters (read as
    # bytes, as the library's decoder does), "ńx" is not (read as its text)
    tok.add_tokens([AddedToken("<tool>", special=False), AddedToken("ńx", special=False)])
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True)])
    t = _Wrapped(tok)
    n = len(words)
    got = vocab_bytes(t, t.vocab_size)
    assert got == want + [b"<tool>", "ńx".encode("utf-8"), None]
    assert [tok.decode([i]) for i in (n, n + 1)] == ["<tool>", "ńx"]
    # the library's own decoder agrees wherever a token alone is valid UTF-8
    for i, w in enumerate(want):
        try:
            text = w.decode("utf-8")
        except UnicodeDecodeError:
            continue
        assert tok.decode([i]) == text
    # EOS given as special: None; ids past the tokenizer's vocabulary: None
    got = vocab_bytes(t, n + 5, special=[0, 7])
    assert got[0] is None and got[7] is None and got[1:7] == want[1:7]
    assert got[n:] == [b"<tool>", "ńx".encode("utf-8"), None, None, None]


def test_a_vocabulary_smaller_than_the_tokenizers_ignores_ids_past_it():
    words = [CHAR[b] for b in range(256)]
    tok = _wordlevel(words, decoders.ByteLevel())
    tok.add_special_tokens([AddedToken("<eos>", special=True)])      # id 256
    t = _Wrapped(tok)
    got = vocab_bytes(t, 256, special=[-1, 256, 300])
    assert got == [bytes([b]) for b in range(256)]                   # -1 is not the last id
    got = vocab_bytes(t, 257, special=[-1, 257])
    assert got == [bytes([b]) for b in range(256)] + [None]


LOOKALIKES = ["<0x4>", "<0x123>", "x<0x41>", "<0X41>", "<0x41>y", "<0xG1>", "0x41"]
TEXTS = ["▁hello", "a▁b", "▁", "é", "plain", "_under_", "▁▁"]


def _byte_fallback(decoder, extra: list[str] = ()) -> tuple[Tokenizer, list[str]]:
    words = [f"<0x{b:02X}>" for b in range(256)] + ["<0xab>", "<0xfF>"] + LOOKALIKES + TEXTS
    return _wordlevel(words + list(extra), decoder), words + list(extra)


def test_byte_fallback_tokens_are_bytes_and_other_tokens_their_text_with_spaces():
    llama2 = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok, words = _byte_fallback(llama2)
    got = vocab_bytes(_Wrapped(tok), len(words))
    assert got[:256] == [bytes([b]) for b in range(256)]
    assert got[256:258] == [b"\xab", b"\xff"]                       # hex digits in either case
    rest = LOOKALIKES + TEXTS
    assert got[258:] == [w.replace("▁", " ").encode("utf-8") for w in rest]


def test_metaspace_and_other_replacements_are_applied_and_regex_ones_are_not():
    meta = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    tok, words = _byte_fallback(meta)
    got = vocab_bytes(_Wrapped(tok), len(words))
    assert got[258:] == [w.replace("▁", " ").encode("utf-8") for w in LOOKALIKES + TEXTS]
    # a string replacement other than "▁", nested one Sequence deep; a regex one is skipped
    other = decoders.Sequence([decoders.Sequence([decoders.Replace("_", "-")]),
                               decoders.Replace(Regex("l+"), "L"), decoders.ByteFallback()])
    tok, words = _byte_fallback(other)
    got = vocab_bytes(_Wrapped(tok), len(words))
    assert got[:256] == [bytes([b]) for b in range(256)]
    assert got[258:] == [w.replace("_", "-").encode("utf-8") for w in LOOKALIKES + TEXTS]
    # byte fallback alone: the text is kept as it is ("▁" included)
    tok, words = _byte_fallback(decoders.ByteFallback())
    got = vocab_bytes(_Wrapped(tok), len(words))
    assert got[258:] == [w.encode("utf-8") for w in LOOKALIKES + TEXTS]


def test_any_other_decoder_gives_the_utf8_of_each_token_decoded_alone():
    words = ["hello", "##lo", "é", "<0x41>", "Ġx", "▁a"]
    for decoder in (decoders.WordPiece(), None):
        tok = _wordlevel(words, decoder)                 # None: no decoder at all
        tok.add_special_tokens([AddedToken("<s>", special=True)])
        t = _Wrapped(tok)
        got = vocab_bytes(t, t.vocab_size)
        assert got == [tok.decode([i]).encode("utf-8") for i in range(len(words))] + [None]


class _Texts:
    """A tokenizer with no ``tokenizers`` backend: token i is ``texts[i]``."""

    def __init__(self, texts):
        self.texts, self.vocab_size = list(texts), len(texts)

    def decode(self, ids):
        return "".join(self.texts[i] for i in ids)


@pytest.mark.parametrize("vocab", [3, 5, 8])
def test_a_tokenizer_without_backend_gives_each_texts_utf8(vocab):
    texts = ["a", "é", "", "<eos>", "x y"]
    got = vocab_bytes(_Texts(texts), vocab, special=[-1, 3, vocab])
    want = [t.encode("utf-8") for t in texts][:vocab] + [None] * max(0, vocab - 5)
    if vocab > 3:
        want[3] = None
    assert got == want
    assert vocab_bytes(_Texts(texts), vocab, special=[0])[0] is None


class _BackendWithoutIdToToken(_Texts):
    """A backend that is not a ``tokenizers.Tokenizer`` (no ``id_to_token``): decode alone."""

    backend = object()


def test_a_backend_without_id_to_token_is_read_by_decoding_each_token():
    texts = ["a", "é", "<0x41>", "Ġx"]
    got = vocab_bytes(_BackendWithoutIdToToken(texts), 5, special=[1])
    assert got == [b"a", None, b"<0x41>", "Ġx".encode("utf-8"), None]


def test_a_special_added_token_at_id_0_has_no_bytes():
    for decoder in (decoders.ByteLevel(), decoders.ByteFallback(), None):
        tok = _wordlevel(["<s>", "a", "b"], decoder)
        tok.add_special_tokens([AddedToken("<s>", special=True)])       # takes id 0
        assert tok.token_to_id("<s>") == 0
        assert vocab_bytes(_Wrapped(tok), 3) == [None, b"a", b"b"]
