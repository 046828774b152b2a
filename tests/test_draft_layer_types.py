"""A draft's attention per layer from its config, against transformers' own Qwen3Config
(the definition the z-lab reference reads): a layer slides when ``use_sliding_window`` is on,
``sliding_window`` is not null and its index is at least ``max_window_layers``; unset keys take
transformers' defaults (off, 4096, 28); ``layer_types`` as written wins. Every combination of
those keys, then each malformed value alone."""

from __future__ import annotations

import itertools

import pytest

from dflash2rt.errors import CheckpointError
from dflash2rt.models.draft_fields import layer_causal, layer_types, layer_windows

transformers = pytest.importorskip("transformers", reason="transformers' Qwen3Config is the "
                                   "reference (a dev dependency)")

ABSENT = object()
LAYERS = (1, 3, 30)
USE = (ABSENT, False, True)
WINDOW = (ABSENT, None, 1, 5, 4096)
START = (ABSENT, 0, 1, 2, 28, 29, 100)


def _config(use, window, start) -> dict:
    return {k: v for k, v in (("use_sliding_window", use), ("sliding_window", window),
                              ("max_window_layers", start)) if v is not ABSENT}


def _reference(d: dict, layers: int) -> tuple[list[str], tuple]:
    cfg = transformers.Qwen3Config(num_hidden_layers=layers, **d)
    window = cfg.sliding_window
    return list(cfg.layer_types), tuple(window if t == "sliding_attention" else None
                                        for t in cfg.layer_types)


@pytest.mark.parametrize("layers", LAYERS)
def test_every_combination_as_transformers_resolves_it(layers):
    for use, window, start in itertools.product(USE, WINDOW, START):
        d = _config(use, window, start)
        types, windows = _reference(d, layers)
        assert layer_types(d, layers) == types, d
        assert layer_windows(d, layers) == windows, d
        assert layer_causal(d, layers) == tuple(t == "sliding_attention" for t in types), d


def test_layer_types_as_written_win():
    written = ["full_attention", "sliding_attention", "sliding_attention"]
    for use, window, start in itertools.product(USE, (ABSENT, 7), START):
        d = {**_config(use, window, start), "layer_types": written}
        assert layer_types(d, 3) == written
        slides = use is True
        assert layer_windows(d, 3) == ((None, 7 if window == 7 else 4096,
                                        7 if window == 7 else 4096) if slides else (None,) * 3)
    assert layer_causal({"layer_types": written, "is_causal": False}, 3) == (False,) * 3
    assert layer_causal({"layer_types": written, "is_causal": True}, 3) == (True,) * 3


@pytest.mark.parametrize("types", [
    "full_attention",                                          # not a list
    ["full_attention"] * 2,                                    # too short
    ["full_attention"] * 4,                                    # too long
    ["full_attention", "linear_attention", "full_attention"],  # an unknown kind
])
def test_malformed_layer_types_each_alone(types):
    with pytest.raises(CheckpointError, match="layer_types must list 3 of"):
        layer_types({"layer_types": types}, 3)


@pytest.mark.parametrize("window", [0, -1, "5", True, 2.0])
def test_a_window_that_is_not_a_positive_integer(window):
    d = {"use_sliding_window": True, "sliding_window": window, "max_window_layers": 0}
    with pytest.raises(CheckpointError, match="sliding_window must be a positive integer"):
        layer_windows(d, 2)
    assert layer_windows({**d, "use_sliding_window": False}, 2) == (None, None)   # unread


@pytest.mark.parametrize("start", [-1, "2", 1.5, True, None])
def test_max_window_layers_an_integer_from_zero(start):
    d = {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": start}
    with pytest.raises(CheckpointError, match="max_window_layers must be an integer >= 0"):
        layer_types(d, 2)


def test_a_target_config_reads_max_window_layers_the_same_way():
    import copy
    import json

    from dflash2rt.bundled import bundled_path
    from dflash2rt.models.config import TargetConfig

    d = json.loads((bundled_path("stdlib-code") / "target" / "config.json").read_text())
    for start in (-1, "2", 1.5):
        bad = {**copy.deepcopy(d), "use_sliding_window": True, "max_window_layers": start}
        with pytest.raises(CheckpointError, match="max_window_layers must be an integer"):
            TargetConfig.from_dict(bad)
    full = {**d, "use_sliding_window": True, "sliding_window": None, "max_window_layers": 0}
    assert TargetConfig.from_dict(full).num_hidden_layers == d["num_hidden_layers"]


def test_a_target_loads_exactly_when_transformers_slides_no_layer():
    import json

    from dflash2rt.bundled import bundled_path
    from dflash2rt.models.config import TargetConfig

    d = json.loads((bundled_path("stdlib-code") / "target" / "config.json").read_text())
    layers = d["num_hidden_layers"]
    written = (ABSENT, ["full_attention"] * layers, ["sliding_attention"] * layers)
    for use, window, start, types in itertools.product(USE, WINDOW, START, written):
        keys = _config(use, window, start)
        if types is not ABSENT:
            keys["layer_types"] = types
        cfg = transformers.Qwen3Config(num_hidden_layers=layers, **keys)
        slides = any(cfg.sliding_window is not None and t == "sliding_attention"
                     for t in cfg.layer_types)
        if slides:
            with pytest.raises(CheckpointError, match="sliding-window attention is not supported"):
                TargetConfig.from_dict({**d, **keys})
        else:
            assert TargetConfig.from_dict({**d, **keys}).num_hidden_layers == layers, keys
