"""``dflash2rt inspect`` (``dflash2rt.models.inspection``) on synthetic checkpoints: formats,
shapes, fit checks with their fixes, weight memory per dtype, and that nothing but configs and
safetensors headers is read."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from dflash2rt.cli import main
from dflash2rt.errors import CheckpointError, DraftMismatchError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.draft_loader import expected_tensors
from dflash2rt.models.hf_loader import target_tensors
from dflash2rt.models.inspect_read import detect_format
from dflash2rt.models.inspection import inspect_models
from dflash2rt.models.pair import load_pair

from hub_cache import add_repo, files_of
from tiny_models import MASK, draft_dict, save_pair_dir, target_dict, tiny_pair

QWEN3_VOCAB = 151936


def write_checkpoint(path, cfg: dict, shapes: dict, extra: dict | None = None):
    """config.json and a model.safetensors of zeros (bfloat16) with ``shapes`` (+ ``extra``)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    state = {n: torch.zeros(s, dtype=torch.bfloat16) for n, s in shapes.items()}
    state.update(extra or {})
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.fixture
def no_weight_reads(monkeypatch):
    """Any read of tensor data fails the test: inspect reads configs and headers only."""
    import safetensors
    import safetensors.torch

    def refuse(*a, **k):
        raise AssertionError("a weight was read")

    monkeypatch.setattr(safetensors, "safe_open", refuse)
    monkeypatch.setattr(safetensors.torch, "load_file", refuse)
    monkeypatch.setattr(torch, "load", refuse)


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory):
    return save_pair_dir(tmp_path_factory.mktemp("pair"), tiny_pair(dtype=torch.float32))


@pytest.fixture(scope="module")
def qwen_vocab(tmp_path_factory):
    """A narrow target with Qwen3's 151,936-token vocabulary (tied embeddings), a DFlash v1
    draft declaring a 32,000-token vocabulary, and the same draft with d2t/t2d tensors."""
    root = tmp_path_factory.mktemp("qwen-vocab")
    t = {**target_dict("qwen3", QWEN3_VOCAB, 32, 2), "tie_word_embeddings": True,
         "eos_token_id": 151645}
    target = write_checkpoint(root / "target", t, target_tensors(TargetConfig.from_dict(t)))
    d = draft_dict("dflash1", block=16, layers=1, taps=(0, 1), vocab=32000)
    shapes = expected_tensors(DraftConfig.from_dict(d))
    draft = write_checkpoint(root / "draft-32k", d, shapes)
    mapped = write_checkpoint(root / "draft-32k-mapped", d, shapes, {
        "d2t": torch.zeros(32000, dtype=torch.int64),
        "t2d": torch.zeros(QWEN3_VOCAB, dtype=torch.bool)})
    return target, draft, mapped


def _params(module) -> int:
    return sum(t.numel() for t in module.state_dict().values())


def test_a_dflash2_pair(pair_dir, no_weight_reads):
    r = inspect_models(pair_dir, device="cpu")
    assert r.format == "dflash2" and r.runnable and not r.problems
    d, t = r.draft, r.target
    assert (t["layers"], t["hidden"], t["heads"], t["vocab"]) == (3, 32, 4, 61)
    assert (d["layers"], d["hidden"], d["vocab"], d["block_size"], d["tap_layers"],
            d["mask_token_id"]) == (2, 32, 61, 8, [0, 2], MASK)
    assert [c.name for c in r.checks] == ["vocabulary", "hidden size", "tap layers",
                                          "mask token", "tokenizer"]
    assert r.device["device"] == "cpu" and r.device["fits"]["float32"] is True


def test_memory_is_the_loaded_weights(pair_dir):
    r = inspect_models(pair_dir)
    pair = load_pair(pair_dir / "target", pair_dir / "draft")
    n_t, n_d = _params(pair.target), _params(pair.draft)
    assert (r.target["parameters"], r.draft["parameters"]) == (n_t, n_d)
    for dt, size in (("float32", 4), ("bfloat16", 2), ("float16", 2)):
        assert r.memory[dt] == {"target": n_t * size, "draft": n_d * size,
                                "total": (n_t + n_d) * size}


def test_formats_are_detected(tmp_path, pair_dir):
    v1 = save_pair_dir(tmp_path / "v1", tiny_pair("dflash1", dtype=torch.float32))
    assert inspect_models(v1).format == "dflash"
    assert inspect_models(v1 / "draft").format == "dflash"           # a draft on its own
    alone = inspect_models(pair_dir / "draft")
    assert alone.target is None and alone.runnable is None and alone.format == "dflash2"
    target_only = inspect_models(pair_dir / "target")
    assert target_only.format is None and target_only.runnable is True
    assert detect_format({"speculators_model_type": "eagle3"}) == "speculators"
    assert detect_format({"model_type": "qwen3"}) == "target"


def test_speculators_drafts_are_detected_not_run(tmp_path, pair_dir):
    tl = {k: v for k, v in target_dict("llama", 61, 32, 1).items()}
    cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
           "draft_vocab_size": 40, "eagle_aux_hidden_state_layer_ids": [0, 1, 2],
           "transformer_layer_config": tl,
           "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                  "proposal_methods": [{"proposal_type": "greedy",
                                                        "speculative_tokens": 3}],
                                  "verifier": {"name_or_path": "tiny-org/tiny-target"}}}
    spec = write_checkpoint(tmp_path / "eagle3", cfg, {"fc.weight": (32, 96),
                                                       "lm_head.weight": (40, 32)}, {
        "d2t": torch.zeros(40, dtype=torch.int64), "t2d": torch.zeros(61, dtype=torch.bool)})
    r = inspect_models(pair_dir / "target", draft=spec)
    assert r.format == "speculators" and r.draft["algorithm"] == "eagle3"
    assert r.draft["verifier"] == "tiny-org/tiny-target" and r.draft["block_size"] == 4
    assert r.draft["vocab_mapping"] == {"d2t": [40], "t2d": [61]}
    assert not r.problems and r.runnable is False
    assert any("speculators" in n for n in r.notes)
    assert r.as_dict()["format"] == "speculators"


def test_a_32k_drafter_on_a_qwen3_target_is_refused_before_any_weight(qwen_vocab,
                                                                      no_weight_reads):
    target, draft, _ = qwen_vocab
    r = inspect_models(target, draft=draft)
    assert [c.name for c in r.problems] == ["vocabulary"]
    with pytest.raises(DraftMismatchError, match=r"32000-token vocabulary.*151936.*no d2t/t2d"
                       r".*use a draft trained for this target's vocabulary"):
        r.raise_for_fit()
    # loading refuses it the same way, before its weights are read
    with pytest.raises(DraftMismatchError, match="vocab_size=32000 does not match.*151936"):
        load_pair(target, draft)


def test_a_mapped_vocabulary_fits_but_is_not_run(qwen_vocab):
    target, _, mapped = qwen_vocab
    r = inspect_models(target, draft=mapped)
    assert not r.problems and r.runnable is False
    assert r.draft["vocab_mapping"] == {"d2t": [32000], "t2d": [QWEN3_VOCAB]}
    assert "mapped" in r.checks[0].detail


def test_cli_inspect_mismatch_prints_the_report_and_fails(qwen_vocab, capsys):
    target, draft, _ = qwen_vocab
    assert main(["inspect", str(target), "--draft", str(draft), "--json"]) == 2
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    assert out["format"] == "dflash" and out["fit"]["ok"] is False
    bad = [c for c in out["fit"]["checks"] if not c["ok"]]
    assert bad[0]["check"] == "vocabulary" and "d2t/t2d" in bad[0]["fix"]
    assert "DraftMismatchError" in cap.err and "vocabulary" in cap.err
    assert out["target"]["parameters"] > QWEN3_VOCAB * 32          # the embedding, tied
    assert out["memory"]["bfloat16"]["target"] == 2 * out["target"]["parameters"]


def test_cli_inspect_text(pair_dir, capsys):
    assert main(["inspect", str(pair_dir), "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "format dflash2" in out and "runnable: yes" in out and "on cpu:" in out
    for dt in ("float32", "bfloat16", "float16"):
        assert dt in out


def _edit(root, fn):
    cfg = json.loads((root / "draft/config.json").read_text())
    fn(cfg)
    (root / "draft/config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("edit, check, message", [
    (lambda d: d["dflash_config"].update(target_layer_ids=[0, 7]), "tap layers",
     r"\[7\] outside the target's 3 layers"),
    (lambda d: d.update(num_target_layers=36), "tap layers", "36-layer target"),
    (lambda d: d["dflash_config"].update(mask_token_id=99), "mask token",
     "99 is outside the target's 61 ids"),
])
def test_each_mismatch_is_named_with_its_fix(tmp_path, pair_dir, edit, check, message):
    root = tmp_path / "pair"
    shutil.copytree(pair_dir, root)
    _edit(root, edit)
    r = inspect_models(root)
    assert [c.name for c in r.problems] == [check] and r.runnable is False
    with pytest.raises(DraftMismatchError, match=message):
        r.raise_for_fit()
    assert "use a draft made for this target" in r.problems[0].fix


def test_hidden_size_mismatch(tmp_path, pair_dir):
    d = draft_dict("dflash1", hidden=48, taps=(0, 2))
    draft = write_checkpoint(tmp_path / "wide", d, expected_tensors(DraftConfig.from_dict(d)))
    r = inspect_models(pair_dir / "target", draft=draft)
    assert [c.name for c in r.problems] == ["hidden size"]
    assert "draft 48, target 32" in r.problems[0].detail


def test_a_draft_with_another_tokenizer(tmp_path, pair_dir):
    root = tmp_path / "pair"
    shutil.copytree(pair_dir, root)
    tok = json.loads((root / "target/tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab)[:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]                      # two ids swapped
    (root / "draft/tokenizer.json").write_text(json.dumps(tok))
    r = inspect_models(root)
    assert [c.name for c in r.problems] == ["tokenizer"]
    assert "differs from the target's" in r.problems[0].detail


def test_wrong_roles_are_refused(pair_dir):
    with pytest.raises(CheckpointError, match="is a dflash2 draft, not a target"):
        inspect_models(pair_dir / "draft", draft=pair_dir / "draft")
    with pytest.raises(CheckpointError, match="is not a draft"):
        inspect_models(pair_dir / "target", draft=pair_dir / "target")


def test_inspect_hub_ids_from_the_cache(tmp_path, pair_dir, monkeypatch, no_weight_reads):
    cache = tmp_path / "cache"
    add_repo(cache, "tiny-org/t", files_of(pair_dir / "target"))
    add_repo(cache, "tiny-org/d", files_of(pair_dir / "draft"))
    add_repo(cache, "tiny-org/d-configs", {"config.json": (pair_dir / "draft/config.json")
                                           .read_bytes()})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = inspect_models("tiny-org/t", draft="tiny-org/d")
    assert r.runnable and r.target["source"] == "tiny-org/t" and r.draft["commit"]
    assert r.memory == inspect_models(pair_dir).memory
    from dflash2rt.errors import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="incomplete.*model.safetensors missing.*"
                       "unset HF_HUB_OFFLINE"):
        inspect_models("tiny-org/t", draft="tiny-org/d-configs")


def test_inspect_online_fetches_configs_and_reads_headers_remotely(tmp_path, pair_dir,
                                                                   monkeypatch):
    """Online, only configs are fetched and the safetensors headers come from the hub (both
    calls intercepted here: no network)."""
    import huggingface_hub
    from huggingface_hub.utils import SafetensorsFileMetadata, TensorInfo

    from dflash2rt.models.inspect_read import read_header

    cache = tmp_path / "cache"
    add_repo(cache, "tiny-org/t", {n: b for n, b in files_of(pair_dir / "target").items()
                                   if n.endswith(".json")})
    add_repo(cache, "tiny-org/d", {"config.json": (pair_dir / "draft/config.json").read_bytes()})
    fetched, headers = [], []
    real = huggingface_hub.snapshot_download

    def fake_snapshot(repo_id, **kw):
        fetched.append(kw["allow_patterns"])
        return real(repo_id, **{**kw, "local_files_only": True})

    def fake_header(self, repo_id, filename, revision=None, **kw):
        headers.append((repo_id, filename, revision))
        sub = "target" if repo_id == "tiny-org/t" else "draft"
        return SafetensorsFileMetadata(metadata={}, tensors={
            n: TensorInfo(dtype=dt, shape=list(s), data_offsets=(0, 0))
            for n, (s, dt) in read_header(pair_dir / sub / filename).items()})

    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    monkeypatch.setattr(huggingface_hub.HfApi, "parse_safetensors_file_metadata", fake_header)
    r = inspect_models("tiny-org/t", draft="tiny-org/d")
    assert r.runnable and r.memory == inspect_models(pair_dir).memory
    assert all(not any(p.endswith(".safetensors") for p in pats) for pats in fetched)
    assert [h[:2] for h in headers] == [("tiny-org/t", "model.safetensors"),
                                        ("tiny-org/d", "model.safetensors")]
    assert all(len(h[2]) == 40 for h in headers)          # pinned to the snapshot's commit
