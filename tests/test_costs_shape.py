"""``dflash2rt bench --costs --shape NAME``: the cost model on a synthetic pair built in memory
(``synth/in_memory.py``: synth's configs, names and shapes, seeded weights drawn where the
models run, no checkpoint), with transformers built from the same config on the same tensors
(``HFGreedy.on_weights``)."""

from __future__ import annotations

import json

import pytest
import torch

from dflash2rt.cli import build_parser, main
from dflash2rt.models.pair import load_pair
from dflash2rt.synth import synthesize
from dflash2rt.synth.in_memory import build_pair


def test_the_in_memory_pair_is_the_pair_synth_writes(tmp_path):
    """Same configs, tensor names, shapes and (CPU, float32) values as ``synthesize`` writes;
    the same seed builds the same weights, another seed others."""
    synthesize("toy-llama3", tmp_path, seed=3, layers=3, draft_layers=2, dtype=torch.float32)
    disk = load_pair(tmp_path / "target", tmp_path / "draft", torch.float32)
    pair, built = build_pair("toy-llama3", "cpu", torch.float32, seed=3, layers=3,
                             draft_layers=2)
    assert pair.tokenizer is None and built["target_layers"] == 3 and built["draft_layers"] == 2
    assert json.loads((tmp_path / "target" / "config.json").read_text()) == \
        built["target_config"]
    assert pair.target.cfg == disk.target.cfg and pair.draft.cfg == disk.draft.cfg
    for ours, theirs in ((pair.target, disk.target), (pair.draft, disk.draft)):
        a, b = ours.state_dict(), theirs.state_dict()
        assert list(a) == list(b)
        assert all(torch.equal(a[n], b[n]) for n in a)
    again, _ = build_pair("toy-llama3", "cpu", torch.float32, seed=3, layers=3, draft_layers=2)
    other, _ = build_pair("toy-llama3", "cpu", torch.float32, seed=4, layers=3, draft_layers=2)
    name = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(again.target.state_dict()[name], pair.target.state_dict()[name])
    assert not torch.equal(other.target.state_dict()[name], pair.target.state_dict()[name])


@pytest.mark.parametrize("shape", ["toy-qwen3", "toy-llama3"])
def test_transformers_built_on_our_weights_computes_our_logits(shape):
    """transformers' model from the config (meta device, then our tensors): no weight of its
    own, and our target's logits for the same tokens (float32: both sides keep the same
    float32 islands; only summation order differs)."""
    pytest.importorskip("transformers", reason="the peer baseline needs transformers")
    from dflash2rt.bench.hf_baseline import HFGreedy

    pair, built = build_pair(shape, "cpu", torch.float32, seed=1)
    hf, shared = HFGreedy.on_weights(built["target_config"], pair.target)
    ours = {t.data_ptr() for t in pair.target.state_dict().values()}
    assert shared == len(hf.model.state_dict())
    assert {p.data_ptr() for p in hf.model.parameters()} <= ours
    ids = torch.tensor([[5, 900, 17, 3, 250, 64, 1000]])
    pos = torch.arange(ids.shape[1]).view(1, -1)
    want = pair.target.forward_full(ids, pos, torch.ones_like(ids, dtype=torch.bool)).logits
    with torch.inference_mode():
        got = hf.model(input_ids=ids).logits
    scale = want.abs().max().item()
    assert scale > 0 and (got - want).abs().max().item() <= 1e-5 * scale


def test_shape_is_for_the_cost_model_and_excludes_model():
    parse = build_parser().parse_args
    with pytest.raises(SystemExit, match="exclusive"):
        main(["bench", "--costs", "--shape", "toy-qwen3", "--model", "stdlib-code"])
    with pytest.raises(SystemExit, match="add --costs"):
        main(["bench", "--shape", "toy-qwen3"])
    with pytest.raises(SystemExit, match="--layers sizes the in-memory pair"):
        main(["bench", "--costs", "--layers", "2"])
    args = parse(["bench", "--costs", "--shape", "qwen3-8b", "--layers", "3", "--draft-layers",
                  "1", "--seed", "7"])
    assert (args.shape, args.layers, args.draft_layers, args.seed, args.model) == \
        ("qwen3-8b", 3, 1, 7, None)
    with pytest.raises(SystemExit):
        parse(["bench", "--costs", "--shape", "no-such-shape"])


def _costs(tmp_path, shape: str, *extra: str) -> dict:
    out = tmp_path / "costs.json"
    assert main(["bench", "--costs", "--backend", "cpu", "--shape", shape, "--dtype", "float32",
                 "--contexts", "128", "--batches", "1", "--blocks", "2", "--reps", "1",
                 *extra, "--json-out", str(out)]) == 0
    return json.loads(out.read_text())


def test_costs_on_an_in_memory_toy_pair(tmp_path, capsys):
    res = _costs(tmp_path, "toy-qwen3", "--seed", "5", "--no-hf")
    assert res["pair"] == ("in memory, seeded (no checkpoint): toy-qwen3, seed 5, 4 target "
                           "layers, 5 draft layers")
    (row,) = res["rows"]
    assert (row["batch"], row["context"]) == (1, 128) and "transformers" not in row
    assert set(row["blocks"]) == {"2"} and "2" in row["projected_speedup"]
    assert res["skipped_rows"] == [] and res["transformers_prefill_logits"] is None
    assert "projected speedup" in capsys.readouterr().out


@pytest.mark.slow          # the device check's dry-run costs section, at Qwen3-0.6B's widths
@pytest.mark.parametrize("no_hf", [True, False])
def test_costs_on_the_qwen3_0_6b_shape_as_the_device_check_dry_run(tmp_path, no_hf):
    """The device check's dry run: 2 target layers, 1 draft layer, float32, one row; with
    transformers when it is installed."""
    if not no_hf:
        pytest.importorskip("transformers", reason="the peer baseline needs transformers")
    res = _costs(tmp_path, "qwen3-0.6b", "--layers", "2", "--draft-layers", "1",
                 *(["--no-hf"] if no_hf else []))
    assert res["pair"].startswith("in memory, seeded (no checkpoint): qwen3-0.6b, seed 0")
    (row,) = res["rows"]
    assert row["t_target_s"] > 0 and row["estimated_bytes"] > 0 and "2" in row["blocks"]
    if no_hf:
        assert "transformers" not in row and res["transformers_weights"] is None
    else:
        assert row["transformers"]["cache"] == "static" and row["transformers"]["t_step_s"] > 0
        assert row["transformers"]["prefill_logits"] == "last row only (logits_to_keep=1)"
        assert res["transformers_weights"].startswith("shared: ")
