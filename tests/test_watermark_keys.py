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
    assert WatermarkKey.from_file(f) == WatermarkKey(SECRET)


@pytest.mark.parametrize("content", [b"", b"00" * 31, b"zz" * 32, SECRET + b"x", b"00" * 33])
def test_from_file_rejects_malformed_without_echoing(tmp_path, content):
    f = tmp_path / "k"
    f.write_bytes(content)
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
