"""Watermark keys against their definitions (watermark/keys.py's docstring), written anew here:
each subkey is keyed BLAKE2b of its label under the secret, and the graph inputs' words of every
subkey are that subkey's three words at their own offsets; a key file that cannot be read or
written is reported with the operating system's reason.

Classes of bug held: a subkey's words sliced at the wrong offset or width (a draft subkey that
carries a word of the target's, a [4] word vector where a kernel reads [3]); an error message
that names the exception's class in place of its reason, or drops the reason."""

from __future__ import annotations

import errno
import hashlib
import os

import numpy as np
import pytest
import torch

from dflash2rt.watermark import WatermarkKey, WatermarkKeyError
from dflash2rt.watermark.keys import KeyWords, words_of

LABEL = b"dflash2rt watermark v1 "                 # the documented domain label prefix


def subkey_words(secret: bytes, name: str) -> list[int]:
    """The definition: BLAKE2b-96 of label + name under the secret, three little-endian
    uint32 words (Philox k0, k1, counter word)."""
    d = hashlib.blake2b(LABEL + name.encode(), key=secret, digest_size=12).digest()
    return [int.from_bytes(d[i:i + 4], "little") for i in (0, 4, 8)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_subkeys_and_their_graph_words_are_the_definition(seed):
    """Every subkey's (k0, k1, word) and the [9] graph words: A at 0, B at 3, C at 6, each
    subkey's words exactly its three (random secrets: no word repeats across subkeys)."""
    secret = np.random.default_rng(seed).bytes(32)
    key = WatermarkKey(secret)
    want = {n: subkey_words(secret, n) for n in "ABC"}
    assert len({w for ws in want.values() for w in ws}) == 9
    for name, sub in (("A", key.draft), ("B", key.target), ("C", key.coin)):
        assert [sub.k0, sub.k1, sub.word] == want[name]
        assert key.subkey(name) is sub and sub.name == name
    words = words_of(key, "cpu")
    assert words.dtype == torch.int64
    assert words.tolist() == want["A"] + want["B"] + want["C"]
    kw = KeyWords(words)
    for name, sub in (("A", kw.draft), ("B", kw.target), ("C", kw.coin)):
        assert sub.name == name
        assert sub.words.shape == (3,)
        assert sub.words.tolist() == want[name]
        assert [int(sub.k0), int(sub.k1), int(sub.word)] == want[name]


def test_a_file_that_cannot_be_read_names_the_reason(tmp_path):
    """The OS's reason in words (a missing file, a folder), not the exception's class name."""
    for path, code in ((tmp_path / "missing.key", errno.ENOENT), (tmp_path, errno.EISDIR)):
        with pytest.raises(WatermarkKeyError) as info:
            WatermarkKey.from_file(path)
        msg = str(info.value)
        assert msg == f"cannot read watermark key file {str(path)!r}: {os.strerror(code)}"


def test_a_file_that_cannot_be_written_names_the_reason(tmp_path):
    """Saving into a folder that does not exist: the OS's reason, nothing left behind."""
    path = tmp_path / "no-such-folder" / "wm.key"
    with pytest.raises(WatermarkKeyError) as info:
        WatermarkKey(bytes(32)).save(path)
    assert str(info.value) == \
        f"cannot write watermark key file {str(path)!r}: {os.strerror(errno.ENOENT)}"
    assert list(tmp_path.iterdir()) == []
