"""The recipe's byte-level BPE tokenizer (``dflash2rt.train.tokenizer``) against its definition:
exactly ``vocab_size`` ids (EOS id 0, the mask the last id) from the smallest size it takes,
merges only of pairs seen at least twice (a hand-made corpus, its merged tokens listed by hand),
EOS decoded as its text, ``save`` into a fresh nested directory and over an earlier save, and
no progress bar drawn even when stderr is a terminal (a pseudo-terminal on fd 2)."""

from __future__ import annotations

import dataclasses
import os
import pty
import threading

import pytest

from dflash2rt.errors import InvalidInputError
from dflash2rt.train.tokenizer import EOS_TOKEN, MASK_TOKEN, train_tokenizer

from test_train import _texts


@pytest.mark.parametrize("vocab_size", [300, 400])
def test_exactly_vocab_size_ids_eos_first_mask_last(vocab_size):
    tok = train_tokenizer(_texts(), vocab_size)
    assert (tok.vocab_size, tok.eos_id, tok.mask_id) == (vocab_size, 0, vocab_size - 1)
    assert tok.backend.id_to_token(vocab_size - 1) == MASK_TOKEN
    assert tok.backend.id_to_token(0) == EOS_TOKEN


@pytest.mark.parametrize("vocab_size", [299, 257, 0])
def test_below_300_ids_is_refused_with_the_size(vocab_size):
    with pytest.raises(InvalidInputError, match=f"vocab_size={vocab_size} is too small"):
        train_tokenizer(["abc abc"], vocab_size)


def test_only_pairs_seen_twice_are_merged():
    """'qz' occurs twice ('qz', ' qz'), every other pair once: one merge, after the 256 bytes
    and EOS; ' ' is byte-level 'Ġ'."""
    tok = train_tokenizer(["qz qz xj"], 300)
    vocab = tok.backend.get_vocab()
    merged = {t for t, i in vocab.items() if 257 <= i < tok.mask_id}
    assert merged == {"qz"}
    assert (tok.mask_id, tok.vocab_size) == (258, 259)
    assert tok.encode("qz xj") == [vocab["qz"], vocab["Ġ"], vocab["x"], vocab["j"]]


def test_eos_decodes_to_its_text():
    tok = train_tokenizer(["qz qz xj"], 300)
    assert tok.decode([tok.eos_id]) == EOS_TOKEN
    assert tok.decode(tok.encode("qz") + [tok.eos_id] + tok.encode(" xj")) == \
        f"qz{EOS_TOKEN} xj"


def test_save_makes_the_directories_and_overwrites(tmp_path):
    from tokenizers import Tokenizer

    tok = train_tokenizer(["qz qz xj"], 300)
    target = tmp_path / "run" / "tokenizer"
    path = tok.save(target)
    assert path == target / "tokenizer.json"
    assert tok.save(target) == path                              # the same directory again
    assert Tokenizer.from_file(str(path)).to_str() == tok.backend.to_str()


def test_trained_tokenizer_is_frozen():
    tok = train_tokenizer(["qz qz xj"], 300)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tok.mask_id = 3


def test_no_progress_bar_on_a_terminal():
    """stderr a pseudo-terminal while training: nothing is written to it (the recipe prints
    its own progress lines)."""
    master, slave = pty.openpty()
    seen: list[bytes] = []

    def drain():
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:                                      # the slave side is closed
                return
            if not chunk:
                return
            seen.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    saved = os.dup(2)
    try:
        os.dup2(slave, 2)
        train_tokenizer(_texts(2), 300)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(slave)
    reader.join(timeout=10)
    os.close(master)
    assert b"".join(seen) == b""
