"""``inspect``'s safetensors header reader against headers written by hand: sizes and dtypes as
the file declares them, and every malformed header a CheckpointError (never a shape made up
from a string's characters, a float's integer part or a negative size)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from dflash2rt.errors import CheckpointError
from dflash2rt.models.inspect_read import read_header


def _file(tmp_path, header, n=None) -> object:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    f = tmp_path / "x.safetensors"
    f.write_bytes((len(raw) if n is None else n).to_bytes(8, "little") + raw)
    return f


def test_a_real_file(tmp_path):
    f = tmp_path / "m.safetensors"
    save_file({"a": torch.zeros(2, 3), "b": torch.zeros(0, dtype=torch.bfloat16),
               "s": torch.tensor(1, dtype=torch.int64)}, str(f), metadata={"k": "v"})
    assert read_header(f) == {"a": ((2, 3), "F32"), "b": ((0,), "BF16"), "s": ((), "I64")}


def test_a_header_by_hand(tmp_path):
    h = {"__metadata__": {"x": "y"}, "w": {"dtype": "F16", "shape": [4, 1], "data_offsets": [0, 8]}}
    assert read_header(_file(tmp_path, h)) == {"w": ((4, 1), "F16")}


@pytest.mark.parametrize("info", [
    {"dtype": "F32", "shape": "12"}, {"dtype": "F32", "shape": [1.7]},
    {"dtype": "F32", "shape": ["3"]}, {"dtype": "F32", "shape": [-1]},
    {"dtype": "F32", "shape": [True]}, {"dtype": "F32", "shape": None}, {"dtype": "F32"},
    {"shape": [1]}, {"dtype": 5, "shape": [1]}, {"dtype": None, "shape": [1]},
    [1, 2], "F32", 3, None])
def test_malformed_tensor_entries(tmp_path, info):
    with pytest.raises(CheckpointError, match=r"x\.safetensors: malformed safetensors header "
                                              r"\(tensor 'w'"):
        read_header(_file(tmp_path, {"w": info}))


@pytest.mark.parametrize("raw, n, match", [
    (b"[1, 2]", None, "malformed safetensors header$"),
    (b"{ ", None, "cannot read the safetensors header"),
    (b"\xff\xfe{}", None, "cannot read the safetensors header"),
    (b"{}", 1, r"not a safetensors file \(header size 1\)"),
    (b"{}", 2**62, r"not a safetensors file \(header size 4611686018427387904\)"),
])
def test_malformed_files(tmp_path, raw, n, match):
    with pytest.raises(CheckpointError, match=match):
        read_header(_file(tmp_path, raw, n))
