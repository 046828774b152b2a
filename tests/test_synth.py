"""``dflash2rt synth``: published shapes and on-disk layout, loadable with no flag but the path.

The full shapes (0.6B–27B) run in the benchmark and device scripts; here one reduced-depth
Qwen3-0.6B pair (real 151,936-token vocabulary, tied embeddings, sharded with an index) and the
configs of every shape."""

from __future__ import annotations

import json

import pytest
import torch

import dflash2rt
from dflash2rt.errors import InvalidInputError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.hf_loader import INDEX_FILE
from dflash2rt.models.pair import load_pair
from dflash2rt.synth import SHAPES, synthesize
from dflash2rt.synth.shapes import PUBLISHED_DRAFT, draft_config, get_shape, tap_layers
from dflash2rt.synth.write import GB, plan_shards, tensor_for


def test_every_shape_gives_a_target_and_a_draft_that_fits_it():
    for name in SHAPES:
        shape = get_shape(name)
        tcfg = TargetConfig.from_dict(shape.target)
        dcfg = DraftConfig.from_dict(draft_config(shape))
        dcfg.check_target(tcfg)
        assert dcfg.mask_token_id == shape.mask_token_id < tcfg.vocab_size
        assert shape.regular_tokens + len(shape.specials) <= tcfg.vocab_size
    assert SHAPES["qwen3-0.6b"].target["tie_word_embeddings"] is True
    assert SHAPES["qwen3-8b"].target["tie_word_embeddings"] is False
    assert {s.target["vocab_size"] for s in SHAPES.values()} == {151936, 128256, 202048}


def test_the_published_drafts_target_gives_back_the_published_draft_config():
    """The draft written for the target the published config implies is that config."""
    assert draft_config(get_shape("published-draft")) == PUBLISHED_DRAFT
    assert tap_layers(52) == [1, 13, 25, 37, 49] and tap_layers(36) == [1, 9, 17, 25, 33]


def test_weights_are_seeded_per_tensor_and_shards_respect_their_size():
    a = tensor_for("model.layers.0.mlp.up_proj.weight", (4, 3), 7, torch.bfloat16)
    assert torch.equal(a, tensor_for("model.layers.0.mlp.up_proj.weight", (4, 3), 7, torch.bfloat16))
    assert not torch.equal(a, tensor_for("model.layers.1.mlp.up_proj.weight", (4, 3), 7,
                                         torch.bfloat16))
    assert torch.equal(tensor_for("model.norm.weight", (5,), 7, torch.float32), torch.ones(5))
    shapes = {"a": (10,), "b": (10,), "c": (30,), "d": (1,)}
    assert plan_shards(shapes, 4, 80) == [["a", "b"], ["c"], ["d"]]
    with pytest.raises(InvalidInputError, match="unknown shape"):
        get_shape("qwen9-1t")
    with pytest.raises(InvalidInputError, match="layers"):
        get_shape("qwen3-0.6b", 29)


@pytest.fixture(scope="module")
def qwen06(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "qwen3-0.6b"
    summary = synthesize("qwen3-0.6b", out, seed=3, layers=2, draft_layers=1,
                         max_shard_bytes=GB // 5)
    return out, summary


def test_reduced_qwen3_0_6b_has_the_published_layout(qwen06):
    out, summary = qwen06
    t = out / "target"
    index = json.loads((t / INDEX_FILE).read_text())
    shards = sorted(p.name for p in t.glob("model-*-of-*.safetensors"))
    assert summary["target_shards"] == len(shards) >= 2
    assert sorted(set(index["weight_map"].values())) == shards
    assert "lm_head.weight" not in index["weight_map"]                 # tied: not stored
    per_shard = {f: [n for n, g in index["weight_map"].items() if g == f] for f in shards}
    for f, names in per_shard.items():              # at most the limit, or one bigger tensor
        assert (t / f).stat().st_size <= GB // 5 + 2**20 or len(names) == 1, f
    cfg = json.loads((t / "config.json").read_text())
    real = dict(SHAPES["qwen3-0.6b"].target)
    assert {k: v for k, v in cfg.items() if k not in ("num_hidden_layers", "max_window_layers")} \
        == {k: v for k, v in real.items() if k not in ("num_hidden_layers", "max_window_layers")}
    assert index["metadata"]["total_size"] == 2 * summary["target_params"]   # bf16


def test_reduced_qwen3_0_6b_loads_from_its_path_alone_and_greedy_spec_equals_target_only(qwen06):
    out, _ = qwen06
    pair = load_pair(out / "target", out / "draft")
    t = pair.target
    assert t.cfg.vocab_size == 151936 and pair.draft.cfg.block_size == 16
    assert t.lm_head.weight.data_ptr() == t.model.embed_tokens.weight.data_ptr()   # shared
    tok = pair.tokenizer
    assert tok.eos_token_ids == (151645,) and tok.encode("<|im_end|>") == [151645]
    ids = tok.encode("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n")
    assert ids and max(ids) < 151643 and 151669 not in ids
    kw = dict(prompts=[ids], max_new_tokens=6, backend="cpu")
    spec = dflash2rt.run(str(out), block_size=4, **kw)     # fixed: no cost calibration
    ref = dflash2rt.run(str(out), spec=False, **kw)
    assert spec.tokens == ref.tokens and len(ref.tokens[0]) == 6


def test_a_pair_too_big_for_the_device_is_refused_before_any_weight_is_read(qwen06, monkeypatch):
    """published-draft's 27B target cannot fit this machine: loading must refuse with the sizes
    and what to change, before reading weights (here: the 0.6B pair against 0.1 GB free)."""
    from dflash2rt.errors import ResourceError
    from dflash2rt.models import hf_loader, memory

    out, summary = qwen06
    monkeypatch.setattr(memory, "available_bytes", lambda device: 10**8)
    read = []
    monkeypatch.setattr(hf_loader, "load_target", lambda *a, **k: read.append(a))
    with pytest.raises(ResourceError, match=r"parameters in float32\) needs [0-9.]+ GB .*bfloat16"):
        load_pair(out / "target", out / "draft")
    assert read == []
    need = 4 * (summary["target_params"] + summary["draft_params"])
    with pytest.raises(ResourceError, match=f"needs {need / 1e9:.2f} GB .* lower the dtype "
                                            rf"\(in bfloat16 they need {need / 2e9:.2f} GB\)"):
        load_pair(out / "target", out / "draft")
    with pytest.raises(ResourceError, match=r"parameters in bfloat16\) needs "
                                            rf"{need / 2e9:.2f} GB .*; use a device with more "
                                            r"memory$"):          # 16-bit already: no lower dtype
        load_pair(out / "target", out / "draft", dtype=torch.bfloat16)
    assert read == []


def test_dtype_auto_is_float32_on_the_cpu_and_the_checkpoints_dtype_elsewhere(qwen06, tmp_path):
    from dflash2rt.errors import CheckpointError
    from dflash2rt.models.pair import resolve_dtype

    t = qwen06[0] / "target"
    assert resolve_dtype("auto", t, "cpu") == torch.float32
    assert resolve_dtype("auto", t, "cuda") == torch.bfloat16       # config: torch_dtype
    assert resolve_dtype(torch.float64, t, "cuda") == torch.float64
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float16"}))
    assert resolve_dtype("auto", tmp_path, "xpu") == torch.float16
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "int8"}))
    with pytest.raises(CheckpointError, match="pass dtype explicitly"):
        resolve_dtype("auto", tmp_path, "xpu")
    with pytest.raises(InvalidInputError, match="'auto'"):
        resolve_dtype("fp32", t, "cpu")


def test_run_reports_load_time_and_peak_rss_next_to_the_checkpoint_size(qwen06, capsys):
    from dflash2rt.cli import main

    out, _ = qwen06
    rc = main(["run", "--backend", "cpu", "--model", str(out), "--prompt", "def f(x):",
               "--max-new-tokens", "2", "--no-spec", "--json"])
    captured = capsys.readouterr()
    assert rc == 0
    load = json.loads(captured.out)["load"]
    files = list((out / "target").glob("*.safetensors")) + list((out / "draft").glob("*.safetensors"))
    assert load["checkpoint_bytes"] == sum(f.stat().st_size for f in files) > 5 * 10**8
    assert load["peak_rss_bytes"] >= load["rss_before_bytes"] > 0 and load["seconds"] > 0
    assert "peak host RSS" in captured.err and "checkpoint files" in captured.err
