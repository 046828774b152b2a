"""Every key of a config.json, at any depth, replaced by each ill-typed JSON value (or removed):
reading the config and checking the pair is either fine or a CheckpointError (a typed error
with a message), never a TypeError, KeyError or MemoryError from inside the reader. The
bundled target and draft, the draft in the speculators format, and the published draft."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from dflash2rt.bundled import bundled_path
from dflash2rt.errors import CheckpointError, DFlash2Error
from dflash2rt.models.config import MAX_LAYERS, TargetConfig
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.draft_config_write import draft_config_dict

ROOT = bundled_path("stdlib-code")
TARGET = json.loads((ROOT / "target" / "config.json").read_text(encoding="utf-8"))
DRAFT = json.loads((ROOT / "draft" / "config.json").read_text(encoding="utf-8"))
PUBLISHED = Path(__file__).parent / "data" / "dflash2-draft-config.json"
VALUES = [None, True, False, 0, -1, 1, 2, 7, 10**12, 0.5, float("nan"), float("inf"), "", "x",
          "7", [], [1], [0, 0], [-1], ["x"], [[1]], {}, {"a": 1}]


def paths(value, at=()):
    """Every key path (dict keys and list indices) inside ``value``."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for k, v in items:
        yield at + (k,)
        if isinstance(v, (dict, list)):
            yield from paths(v, at + (k,))


def edited(d, path, value=None, drop=False):
    out = copy.deepcopy(d)
    node = out
    for k in path[:-1]:
        node = node[k]
    if drop:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


def variants(d):
    for path in paths(d):
        yield path, "removed", edited(d, path, drop=True)
        for v in VALUES:
            yield path, v, edited(d, path, v)


def _untyped(read, d) -> list[str]:
    bad = []
    for path, value, cfg in variants(d):
        try:
            read(cfg)
        except DFlash2Error:
            pass
        except Exception as exc:        # the class of bug this file is for
            bad.append(f"{'.'.join(map(str, path))} = {value!r}: {type(exc).__name__}: {exc}")
    return bad


def _read_target(cfg):
    TargetConfig.from_dict(cfg)


def _read_draft(cfg):
    DraftConfig.from_dict(cfg).check_target(TargetConfig.from_dict(TARGET))


def test_target_config_values():
    assert _untyped(_read_target, TARGET) == []


@pytest.mark.parametrize("form", ["native", "speculators", "published"])
def test_draft_config_values(form):
    if form == "published":
        d = json.loads(PUBLISHED.read_text(encoding="utf-8"))
    else:
        d = draft_config_dict(DraftConfig.from_dict(copy.deepcopy(DRAFT)), form) \
            if form == "speculators" else DRAFT
    assert _untyped(_read_draft, d) == []


@pytest.mark.parametrize("key, value", [("model_type", ["qwen3"]), ("model_type", {"a": 1}),
                                        ("model_type", 3)])
def test_a_model_type_that_is_not_a_string(key, value):
    with pytest.raises(CheckpointError, match=r"^model_type .* is not supported"):
        TargetConfig.from_dict({**TARGET, key: value})


@pytest.mark.parametrize("archs", [True, 3, 0.5, "DFlash2DraftModel", {"a": 1}])
def test_draft_architectures_that_are_not_a_list(archs):
    with pytest.raises(CheckpointError, match=r"^draft architectures .* is not "):
        DraftConfig.from_dict({**copy.deepcopy(DRAFT), "architectures": archs})


@pytest.mark.parametrize("rope_type", [["yarn"], {"a": 1}, 3])
def test_a_rope_type_that_is_not_a_string(rope_type):
    d = {**TARGET, "rope_parameters": {"rope_type": rope_type,
                                       "rope_theta": TARGET.get("rope_theta", 10000.0)}}
    d.pop("rope_scaling", None)
    with pytest.raises(CheckpointError, match="^rope type must be a string"):
        TargetConfig.from_dict(d)


def test_layer_counts_past_the_bound_are_refused_before_per_layer_lists():
    assert TargetConfig.from_dict({**TARGET, "num_hidden_layers": MAX_LAYERS}) \
        .num_hidden_layers == MAX_LAYERS
    for layers in (MAX_LAYERS + 1, 10**12):
        with pytest.raises(CheckpointError, match=f"num_hidden_layers={layers} is more than "
                                                  f"dflash2rt loads \\(at most 65,536\\)"):
            TargetConfig.from_dict({**TARGET, "num_hidden_layers": layers})


@pytest.mark.parametrize("name", ["generation_config.json", "tokenizer_config.json",
                                  "config.json"])
def test_tokenizer_side_files(tmp_path, name):
    """The files read beside tokenizer.json (EOS / BOS ids, the chat template), each key of
    the bundled target's set to each value: the tokenizer loads and round-trips, or a typed
    error."""
    from dflash2rt.models.tokenizer import load_tokenizer
    from dflash2rt.serve.chat import find_template

    for f in (ROOT / "target").glob("*.json"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    original = json.loads((ROOT / "target" / name).read_text(encoding="utf-8"))

    def read(cfg):
        (tmp_path / name).write_text(json.dumps(cfg), encoding="utf-8")
        tok = load_tokenizer(tmp_path)
        assert tok.decode(tok.encode("def f(x):", add_special_tokens=False)) == "def f(x):"
        find_template(tmp_path, None)

    assert _untyped(read, original) == []


@pytest.mark.parametrize("name", ["config.json", "generation_config.json",
                                  "model.safetensors.index.json"])
def test_json_nested_past_the_parsers_depth_is_a_checkpoint_error(tmp_path, name):
    from dflash2rt.models.hf_loader import read_config, tensor_files
    from dflash2rt.models.tokenizer import read_json_object

    (tmp_path / name).write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                 encoding="utf-8")
    read = {"config.json": lambda: read_config(tmp_path),
            "generation_config.json": lambda: read_json_object(tmp_path / name),
            "model.safetensors.index.json": lambda: tensor_files(tmp_path)}[name]
    with pytest.raises(CheckpointError, match=re.escape(str(tmp_path / name))):
        read()
