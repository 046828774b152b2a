"""The recipe's corpus (``dflash2rt.train.corpus``) against its definitions, on small trees built
in a temporary directory: which files ``list_files`` keeps (skipped directories, top-level
``config-*`` only, ``test_*`` files, the size bound, sorted POSIX paths); the held-out split by
SHA-256 of the path, computed anew; ``load_corpus``'s texts, truncation and typed errors; and
``cut_prompts`` by a replay of its seeded draws with a one-token-per-line encoder, its bound on
tries counted exactly."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from pathlib import Path

import pytest

from dflash2rt.errors import InvalidInputError
from dflash2rt.train import corpus


def _write(root: Path, rel: str, text: str | bytes = "x = 1\n") -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")


def _hash_fraction(rel: str) -> float:
    """The first 8 bytes of SHA-256(path), big-endian, over 2**64."""
    return int(hashlib.sha256(rel.encode()).hexdigest()[:16], 16) / 2.0 ** 64


# ---------------------------------------------------------------- list_files

def test_list_files_keeps_python_files_outside_the_skipped_directories(tmp_path):
    keep = ["a.py", "pkg/__init__.py", "pkg/config-2/m.py", "pkg/sub/deep.py", "z_test.py",
            "mytest_x.py", "testing/t.py"]
    drop = ["test/a.py", "pkg/tests/b.py", "idlelib/idle_test/c.py", "site-packages/d.py",
            "x/dist-packages/e.py", "pkg/__pycache__/f.py", "pydoc_data/g.py",
            "encodings/h.py", "config-3.12-x86_64/i.py", "test_j.py", "pkg/test_k.py",
            "notes.txt", "a.pyc", "b.py.orig"]
    for rel in keep + drop:
        _write(tmp_path, rel)
    (tmp_path / "dir.py").mkdir()
    (tmp_path / "broken.py").symlink_to(tmp_path / "missing.py")
    assert corpus.list_files(tmp_path) == sorted(keep)


def test_list_files_bounds_the_size_inclusively(tmp_path):
    _write(tmp_path, "small.py", "a" * 99)
    _write(tmp_path, "exact.py", "a" * 100)
    _write(tmp_path, "big.py", "a" * 101)
    assert corpus.list_files(tmp_path, max_bytes=100) == ["exact.py", "small.py"]
    _write(tmp_path, "large.py", "a" * 250_001)
    _write(tmp_path, "limit.py", "a" * 250_000)
    assert "limit.py" in corpus.list_files(tmp_path)
    assert "large.py" not in corpus.list_files(tmp_path)


# ---------------------------------------------------------------- is_heldout

def test_heldout_is_the_paths_hash_below_the_fraction():
    names = [f"pkg/mod{i}.py" for i in range(400)]
    for name in names:
        h = _hash_fraction(name)
        assert corpus.is_heldout(name) == (h < 0.08), name
        assert corpus.is_heldout(name, 0.5) == (h < 0.5), name
        assert not corpus.is_heldout(name, 0.0) and corpus.is_heldout(name, 1.0)
    held = sum(map(corpus.is_heldout, names))
    assert 0 < held < 100
    assert corpus.HELDOUT_FRACTION == 0.08


# ---------------------------------------------------------------- load_corpus

def _names(n_train: int, n_held: int) -> tuple[list[str], list[str]]:
    """The first module names m<i>.py that the hash puts in each split."""
    train, held, i = [], [], 0
    while len(train) < n_train or len(held) < n_held:
        name = f"m{i}.py"
        (held if _hash_fraction(name) < 0.08 else train).append(name)
        i += 1
    return sorted(train[:n_train]), sorted(held[:n_held])


def test_load_corpus_reads_both_splits_in_path_order(tmp_path):
    train, held = _names(6, 5)
    for rel in train + held:
        _write(tmp_path, rel, f"# {rel}\n")
    _write(tmp_path, "blank.py", " \n\t\n")
    _write(tmp_path, "empty.py", "")
    _write(tmp_path, train[0], b"x = '\xff'\n")
    c = corpus.load_corpus(tmp_path)
    assert c.root == tmp_path
    assert c.train == tuple([(train[0], "x = '\ufffd'\n")] +
                            [(rel, f"# {rel}\n") for rel in train[1:]])
    assert c.heldout == tuple((rel, f"# {rel}\n") for rel in held)
    assert c.train_chars == sum(len(t) for _, t in c.train) == 8 + sum(
        len(f"# {rel}\n") for rel in train[1:])
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.train = ()


@pytest.mark.parametrize("max_files, n_train, n_held", [(1, 1, 1), (3, 3, 1), (4, 4, 1),
                                                        (8, 6, 2), (16, 6, 4), (40, 6, 5)])
def test_max_files_keeps_the_first_files_of_each_split(tmp_path, max_files, n_train, n_held):
    """The first ``max_files`` training files and the first max(1, max_files // 4) held-out
    ones."""
    train, held = _names(6, 5)
    for rel in train + held:
        _write(tmp_path, rel)
    c = corpus.load_corpus(str(tmp_path), max_files=max_files)
    assert [rel for rel, _ in c.train] == train[:n_train]
    assert [rel for rel, _ in c.heldout] == held[:n_held]


def test_load_corpus_defaults_to_the_stdlib_root(tmp_path, monkeypatch):
    train, held = _names(2, 1)
    for rel in train + held:
        _write(tmp_path, rel)
    monkeypatch.setattr(corpus, "stdlib_root", lambda: tmp_path)
    c = corpus.load_corpus()
    assert c.root == tmp_path and len(c.train) == 2 and len(c.heldout) == 1


def test_load_corpus_refuses_a_tree_it_cannot_split(tmp_path):
    with pytest.raises(InvalidInputError, match="no usable \\*.py files under"):
        corpus.load_corpus(tmp_path)
    train, held = _names(2, 1)
    for rel in train:
        _write(tmp_path, rel)
    with pytest.raises(InvalidInputError, match="the split left no training or no held-out"):
        corpus.load_corpus(tmp_path)
    _write(tmp_path, held[0])
    with pytest.raises(InvalidInputError, match="the split left no training or no held-out"):
        corpus.load_corpus(tmp_path, max_files=0)
    assert len(corpus.load_corpus(tmp_path).train) == 2


# ---------------------------------------------------------------- cut_prompts

class LineTokens:
    """One token per line (its length); counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, text: str) -> list[int]:
        self.calls += 1
        return [len(line) for line in text.splitlines(keepends=True)]


def _replay(files, count, lo, hi, seed):
    """The documented draws, one try at a time: a file, a start line, a wanted token count; a
    blank start line is a lost try; lines are added until the count is reached or the file
    ends; kept when lo..hi tokens (here one token per line)."""
    rng, out = random.Random(seed), []
    while len(out) < count:
        rel, text = files[rng.randrange(len(files))]
        lines = text.splitlines(keepends=True)
        start = rng.randrange(len(lines))
        want = rng.randint(lo, hi)
        if not lines[start].strip():
            continue
        n = min(want, len(lines) - start)
        if lo <= n <= hi:
            out.append({"file": rel, "line": start + 1,
                        "prompt": "".join(lines[start:start + n]),
                        "prompt_ids": [len(x) for x in lines[start:start + n]]})
    return out


FILES = (("a.py", "".join(f"a{i} = {i}\n" if i % 4 else "\n" for i in range(30))),
         ("b/c.py", "def f():\n    return 1\n\nx = f()"),
         ("d.py", "".join(f"{'d' * i}\n" for i in range(1, 12))))


@pytest.mark.parametrize("count, lo, hi, seed", [(20, 1, 3, 0), (15, 2, 2, 5), (10, 3, 6, 2),
                                                 (1, 4, 4, 9), (0, 1, 1, 0)])
def test_cut_prompts_replays_its_seeded_draws(count, lo, hi, seed):
    got = corpus.cut_prompts(FILES, LineTokens(), count, lo, hi, seed)
    assert got == _replay(FILES, count, lo, hi, seed)
    text = dict(FILES)
    for p in got:
        lines = text[p["file"]].splitlines(keepends=True)
        assert p["prompt"].startswith(lines[p["line"] - 1]) and lines[p["line"] - 1].strip()
        assert lo <= len(p["prompt_ids"]) <= hi


def test_cut_prompts_gives_up_after_50_tries_a_prompt_and_100_more():
    """A request no file can meet: exactly 50 × count + 100 tries (one encoding each), then a
    typed error naming the request."""
    for count in (1, 3):
        enc = LineTokens()
        with pytest.raises(InvalidInputError, match=f"could not cut {count} prompts of 2..5 "
                                                    "tokens from the given files"):
            corpus.cut_prompts((("one.py", "x = 1\n"),), enc, count, 2, 5, 0)
        assert enc.calls == 50 * count + 100
