"""Watermark keys: file formats, domain-separated subkeys pinned by known answers, and the secret
never shown (repr, str, format, errors, pickle)."""

from __future__ import annotations

import copy
import os
import pickle

import pytest

from dflash2rt.errors import InvalidInputError
from dflash2rt.watermark import WatermarkKey, WatermarkKeyError

SECRET = bytes(range(32))


def test_subkeys_known_answers_and_distinct():
    # Pinned: a change here orphans every text watermarked before it (detection needs them).
    k = WatermarkKey(SECRET)
    got = {s.name: (s.k0, s.k1, s.word) for s in (k.draft, k.target, k.coin)}
    assert got == {"A": (0x1FD0EF40, 0x6CAEC373, 0x0570B105),
                   "B": (0xFA366F73, 0x922F8C69, 0x7BFBF7AD),
                   "C": (0xB03A160B, 0x185F653B, 0x1BD6A28B)}
    assert k.fingerprint == "2e20d0c31f21cf4c"
    assert k.subkey("B") is k.target
    with pytest.raises(WatermarkKeyError, match="'A', 'B' or 'C'"):
        k.subkey("D")


def test_generate_gives_fresh_keys():
    a, b = WatermarkKey.generate(), WatermarkKey.generate()
    assert a != b and a.fingerprint != b.fingerprint
    assert a == WatermarkKey(a._secret) and hash(a) == hash(WatermarkKey(a._secret))


@pytest.mark.parametrize("content", [SECRET.hex().encode(), SECRET.hex().upper().encode() + b"\n",
                                     b"  " + SECRET.hex().encode() + b"\r\n", SECRET])
def test_from_file_formats(tmp_path, content):
    f = tmp_path / "k"
    f.write_bytes(content)
    f.chmod(0o600)
    assert WatermarkKey.from_file(f) == WatermarkKey(SECRET)


@pytest.mark.parametrize("content", [b"", b"00" * 31, b"zz" * 32, SECRET + b"x", b"00" * 33])
def test_from_file_rejects_malformed_without_echoing(tmp_path, content):
    f = tmp_path / "k"
    f.write_bytes(content)
    f.chmod(0o600)
    with pytest.raises(WatermarkKeyError, match="64 hexadecimal digits") as info:
        WatermarkKey.from_file(f)
    assert isinstance(info.value, InvalidInputError)
    if content:
        assert content.decode("latin-1")[:16] not in str(info.value)


def test_missing_file_and_bad_secret():
    with pytest.raises(WatermarkKeyError, match="cannot read"):
        WatermarkKey.from_file("/nonexistent/dir/key")
    for bad in (b"short", "x" * 32, None, SECRET * 2):
        with pytest.raises(WatermarkKeyError, match="32 bytes"):
            WatermarkKey(bad)


def test_save_round_trip_mode_and_no_overwrite(tmp_path):
    k = WatermarkKey.generate()
    path = k.save(tmp_path / "wm.key")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert WatermarkKey.from_file(path) == k
    with pytest.raises(WatermarkKeyError, match="refusing to overwrite"):
        WatermarkKey.generate().save(path)
    assert WatermarkKey.from_file(path) == k
    k2 = WatermarkKey.generate()
    k2.save(path, overwrite=True)
    assert WatermarkKey.from_file(path) == k2


def test_secret_never_shown():
    k = WatermarkKey(SECRET)
    hexes = (SECRET.hex(), SECRET.hex().upper(), repr(SECRET), str(list(SECRET)))
    shown = [repr(k), str(k), f"{k}", f"{k!r}", repr(k.draft), str(k.target), repr(vars(type(k)))]
    shown += [f"{s.k0:x}" for s in (k.draft,)]  # a subkey word itself must not appear either
    for text in shown[:-1]:
        for secret_text in hexes:
            assert secret_text not in text
        assert shown[-1] not in text
    assert repr(k) == "WatermarkKey(fingerprint=2e20d0c31f21cf4c)"
    assert repr(k.coin) == "SubKey(C)"
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(k)
    assert copy.deepcopy(k) is k and copy.copy(k) is k


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_keys_readable_by_group_or_others_are_refused_saying_how_to_fix(tmp_path, mode):
    f = tmp_path / "shared.key"
    f.write_text(SECRET.hex())
    f.chmod(mode)
    with pytest.raises(WatermarkKeyError, match=rf"mode {mode:04o}.*chmod 600") as info:
        WatermarkKey.from_file(f)
    assert SECRET.hex() not in str(info.value)
    assert WatermarkKey.from_file(f, allow_shared=True) == WatermarkKey(SECRET)
    f.chmod(0o600)
    assert WatermarkKey.from_file(f) == WatermarkKey(SECRET)


@pytest.mark.parametrize("mode", [0o644, 0o666, 0o400])
def test_overwriting_gives_a_private_file_whatever_was_there(tmp_path, mode):
    """keygen --force over an existing file: the new secret is in a 0600 file (not the old
    file's mode), written whole (a rename), and no temporary file is left behind."""
    f = tmp_path / "wm.key"
    f.write_text("old contents\n")
    f.chmod(mode)
    k = WatermarkKey.generate()
    k.save(f, overwrite=True)
    assert os.stat(f).st_mode & 0o777 == 0o600
    assert WatermarkKey.from_file(f) == k
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wm.key"]


def test_keygen_force_in_the_cli(tmp_path, capsys):
    from dflash2rt.cli import main

    f = tmp_path / "wm.key"
    f.write_text("x\n")
    f.chmod(0o644)
    assert main(["watermark", "keygen", "--out", str(f)]) == 2          # kept without --force
    assert f.read_text() == "x\n"
    assert main(["watermark", "keygen", "--out", str(f), "--force"]) == 0
    assert os.stat(f).st_mode & 0o777 == 0o600 and WatermarkKey.from_file(f)


def _key_texts(key: WatermarkKey) -> list[str]:
    """Every way key material could be printed: the secret (hex, bytes) and each subkey word
    (decimal, hex, and as the signed int64 a tensor holds)."""
    out = [key._secret.hex(), key._secret.hex().upper(), repr(key._secret)]
    for s in (key.draft, key.target, key.coin):
        for w in (s.k0, s.k1, s.word):
            if w >= 1000:                                   # too short to be told apart
                out += [str(w), f"{w:x}", f"{w:#x}"]
    return out


def _reachable(roots, limit=200_000):
    """Objects reachable from ``roots`` through gc referents (modules and types excluded)."""
    import gc
    import types

    seen, todo, out = set(), list(roots), []
    while todo and len(out) < limit:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (types.ModuleType, type, types.FunctionType)):
            continue
        seen.add(id(obj))
        out.append(obj)
        todo.extend(gc.get_referents(obj))
    return out


def test_no_object_of_a_watermarked_run_prints_the_key(monkeypatch, caplog):
    """During a watermarked run (graph runners included, through a replaying fake adapter),
    walk everything the engine and the batch state hold: no dflash2rt object's repr or str,
    no stats field, no JSON and no log line shows any key material."""
    import json
    import logging

    import torch

    from dflash2rt.backend import TorchOpsBackend
    from dflash2rt.engine.engine import Engine
    from dflash2rt.engine.request import Request, SamplingParams

    from test_engine_graphs import ReplayAdapter
    from tiny_models import tiny_pair

    key = WatermarkKey(SECRET)
    texts = _key_texts(key)
    be = TorchOpsBackend("cpu-graphs", "cpu", (torch.float32, torch.float64))
    be.graph_adapter = ReplayAdapter()
    engine = Engine(tiny_pair("dflash2", block=4, seed=3), be)
    held = []
    real = engine.runner.step

    def spy(st, block, *a, **k):
        held.append((engine.runner, st))
        return real(st, block, *a, **k)
    monkeypatch.setattr(engine.runner, "step", spy)
    caplog.set_level(logging.DEBUG)
    reqs = [Request((1, 2, 3), SamplingParams(max_new_tokens=10, temperature=1.0, seed=s))
            for s in range(3)]
    outs, stats = engine.generate(reqs, block_size=4, watermark=key)
    assert held and any(st.wm is not None for _, st in held)
    shown = [json.dumps(stats.as_dict(), default=str), repr(stats), repr(outs),
             caplog.text]
    objs = _reachable([engine, stats, outs, *[x for pair in held for x in pair]])
    ours = [o for o in objs if type(o).__module__.startswith("dflash2rt")]
    assert any(type(o).__name__ == "WatermarkBatch" for o in ours)
    assert any(type(o).__name__ == "Bucket" for o in ours)
    for o in ours:
        shown += [repr(o), str(o)]
    leaks = [(t, s[:120]) for s in shown for t in texts if t in s]
    assert not leaks, leaks
    engine.close()
