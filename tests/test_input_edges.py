"""Input edges of the API and the CLI: each ends as a typed error or a correct result."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil

import pytest
import torch

import dflash2rt
from dflash2rt.api import resolve_model
from dflash2rt.bundled import bundled_path
from dflash2rt.cli import main
from dflash2rt.cli.run_progress import safe_len
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.errors import (CheckpointError, DFlash2Error, InvalidInputError, ResourceError,
                              SamplingParamsError)
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.hf_loader import read_config
from dflash2rt.ops.sampling import check_sampling_params

MODEL = "stdlib-code"
PROMPT = "def fib(n):"


def _run(**kw):
    return dflash2rt.run(MODEL, "cpu", **{"prompts": [PROMPT], "max_new_tokens": 8, **kw})


def _cli(capsys, *args):
    rc = main(["run", "--backend", "cpu", "--model", MODEL, "--max-new-tokens", "8", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


# 1. --prompt-file: a strict schema, and token-id prompts end to end.

@pytest.mark.parametrize("content", [
    '"abc"', '{"a": "b"}', "[]", '[""]', "[[]]", "[1, 2]", '["a", [1]]', '[[1], "a"]',
    "[[1.5]]", "[[1.0]]", "[[true]]", '[["a"]]', "[null]", '["\\ud800"]', "not json", "",
])
def test_prompt_file_schema_is_strict(tmp_path, capsys, content):
    f = tmp_path / "prompts.json"
    f.write_text(content, encoding="utf-8")
    rc, out, err = _cli(capsys, "--prompt-file", str(f))
    assert rc == 2 and out == ""
    assert "InvalidInputError" in err and str(f) in err, err


def test_prompt_file_missing_or_not_utf8(tmp_path, capsys):
    rc, out, err = _cli(capsys, "--prompt-file", str(tmp_path / "nope.json"))
    assert rc == 2 and out == "" and "nope.json" in err and "cannot read" in err
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b'["caf\xe9"]')
    rc, out, err = _cli(capsys, "--prompt-file", str(bad))
    assert rc == 2 and out == "" and "latin1.json" in err


def test_prompt_file_with_token_ids_streams_their_decoded_text(tmp_path, capsys):
    tok = resolve_model(MODEL).tokenizer
    ids = tok.encode(PROMPT)
    f = tmp_path / "ids.json"
    f.write_text(json.dumps([ids]), encoding="utf-8")
    rc, out, _ = _cli(capsys, "--prompt-file", str(f))
    api = dflash2rt.run(MODEL, "cpu", prompts=[ids], max_new_tokens=8)
    assert rc == 0 and out == tok.decode(ids) + api.texts[0] + "\n"
    rc, out, _ = _cli(capsys, "--prompt-file", str(f), "--prompt-file", str(f), "--json")
    assert rc == 0 and json.loads(out)["tokens"] == api.tokens


# 2. The loaded-pair cache notices a checkpoint replaced on disk.

def test_replaced_checkpoint_is_reloaded(tmp_path):
    from safetensors.torch import load_file, save_file

    root = tmp_path / "pair"
    shutil.copytree(bundled_path(MODEL), root)
    first = dflash2rt.run(root, "cpu", prompts=[PROMPT], max_new_tokens=4)
    assert resolve_model(root) is resolve_model(root)          # unchanged files: a cache hit
    weights = root / "target" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["lm_head.weight"] = -tensors["lm_head.weight"]      # greedy now picks other tokens
    stat = weights.stat()
    save_file(tensors, str(weights))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    again = dflash2rt.run(root, "cpu", prompts=[PROMPT], max_new_tokens=4)
    assert again.tokens != first.tokens
    assert torch.equal(resolve_model(root).target.lm_head.weight,
                       tensors["lm_head.weight"])


# 3 and 5. Block sizes and parameters of the wrong type or range.

@pytest.mark.parametrize("kw, err", [
    (dict(block_size=0), InvalidInputError), (dict(block_size=-2), InvalidInputError),
    (dict(block_size=True), InvalidInputError), (dict(block_size=4.0), InvalidInputError),
    (dict(block_size="4"), InvalidInputError),
    (dict(top_k=float("nan")), SamplingParamsError), (dict(top_k=float("inf")), SamplingParamsError),
    (dict(top_k=2.5), SamplingParamsError), (dict(top_k=True), SamplingParamsError),
    (dict(temperature="0.5"), SamplingParamsError), (dict(top_p="0.5"), SamplingParamsError),
    (dict(temperature=True), SamplingParamsError), (dict(top_p=True), SamplingParamsError),
    (dict(temperature=1e-50), SamplingParamsError), (dict(temperature=1e39), SamplingParamsError),
    (dict(seed=True), SamplingParamsError), (dict(seed=1.0), SamplingParamsError),
    (dict(max_new_tokens=4.0), SamplingParamsError), (dict(max_new_tokens=True), SamplingParamsError),
    (dict(stop_token_ids=[1.0]), SamplingParamsError), (dict(stop_token_ids=[True]), SamplingParamsError),
    (dict(stop_token_ids=[10**9]), InvalidInputError),
    (dict(prompts=None), InvalidInputError), (dict(prompts=5), InvalidInputError),
])
def test_bad_arguments_raise_typed_errors(kw, err):
    with pytest.raises(err):
        _run(**kw)


@pytest.mark.parametrize("prompts, match", [
    ([3], "prompt 0 is int"), (["ok", "\ud800"], "prompt 1 is not valid Unicode text"),
    ([[3, 4.0]], "prompt 0.*4.0"), ([[3], [3, True]], "prompt 1.*True"),
])
def test_bad_prompts_are_named(prompts, match):
    with pytest.raises(InvalidInputError, match=match):
        _run(prompts=prompts)


@pytest.mark.parametrize("spec", ["no", "False", 0, 1, None, [True]])
def test_spec_is_a_bool(spec):
    with pytest.raises(InvalidInputError, match=f"spec must be True .* got {re.escape(repr(spec))}$"):
        _run(spec=spec)


@pytest.mark.parametrize("on_tokens", [3, "print", [print]])
def test_on_tokens_is_checked_before_decoding(on_tokens):
    with pytest.raises(InvalidInputError, match="on_tokens must be None or a callable"):
        _run(on_tokens=on_tokens)


def test_on_tokens_any_callable():
    seen = []
    out = _run(on_tokens=lambda i, ids: seen.extend(ids), max_new_tokens=5).outputs[0]
    assert seen == out.token_ids


def test_a_loaded_pair_runs_in_its_own_dtype():
    pair = resolve_model(MODEL)
    assert pair.dtype == torch.float32
    assert resolve_model(pair, dtype="auto") is pair
    assert resolve_model(pair, dtype=torch.float32) is pair
    for dtype in (torch.bfloat16, torch.float64):
        with pytest.raises(InvalidInputError, match=f"dtype={dtype} for a ModelPair loaded in "
                                                    f"torch.float32"):
            resolve_model(pair, dtype=dtype)
    assert resolve_model(pair, dtype="float32") is pair and resolve_model(pair, dtype="float")
    with pytest.raises(InvalidInputError, match="dtype=torch.bfloat16 for a ModelPair"):
        resolve_model(pair, dtype="bfloat16")
    for dtype in ("float13", "bf16", "Float32", None, 32, torch.int32, torch.bool):
        with pytest.raises(InvalidInputError, match="dtype must be 'auto', a floating-point"):
            resolve_model(pair, dtype=dtype)
    with pytest.raises(InvalidInputError, match="dtype must be 'auto', a floating-point"):
        dflash2rt.run(pair, "cpu", prompts=PROMPT, max_new_tokens=2, dtype="int8")


def test_block_size_none_is_the_default_and_integers_work():
    default = _run()           # a measured schedule: it may plan the whole call target-only
    s = default.stats
    assert s.adaptive and s.block_size == (1 if s.call_plan else 16)   # the largest candidate
    assert _run(block_size=8).tokens == default.tokens
    import numpy as np

    assert _run(block_size=np.int64(4), top_k=np.int64(0)).stats.block_size == 4


def test_sampling_params_fields_are_checked():
    check_sampling_params(1e-30, 0, 0.5)                    # tiny but representable: fine
    for bad in (dict(ignore_eos="yes"), dict(ignore_eos=1), dict(stop_token_ids=5),
                dict(stop_strings="ab"), dict(stop_strings=("\ud800",)), dict(seed=-1),
                dict(seed=2**63)):
        with pytest.raises(SamplingParamsError):
            SamplingParams(**bad)
    with pytest.raises(InvalidInputError, match="integers"):
        Request((1, 2.0)).validate(100)
    with pytest.raises(InvalidInputError):
        Request((1, 2), key=1.5).validate(100)


def test_huge_cache_is_refused_before_allocating(monkeypatch):
    from dflash2rt.models.kv_cache import KVCache
    from dflash2rt.models.pair import load_pair

    root = bundled_path(MODEL)
    pair = load_pair(root / "target", root / "draft")        # a private copy, not the cached one
    pair.target.cfg = dataclasses.replace(pair.target.cfg, max_position_embeddings=10**12)
    allocated = []
    monkeypatch.setattr(KVCache, "empty", lambda *a, **k: allocated.append(a) or 1 / 0)
    with pytest.raises(ResourceError, match="GB.*max_new_tokens") as info:
        dflash2rt.run(pair, "cpu", prompts=[PROMPT], max_new_tokens=10**9)
    assert not allocated
    assert isinstance(info.value, MemoryError) and isinstance(info.value, DFlash2Error)


# 4. Streaming equals the API's text; nothing on stdout before validation.

def test_streamed_stdout_equals_the_api_text_with_a_stop_string(capsys):
    full = _run().texts[0]
    words = full.split()
    stop = words[len(words) // 2][:3]
    assert stop and stop in full
    api = _run(stop=[stop])
    assert api.texts[0] == full[:full.index(stop)]
    rc, out, _ = _cli(capsys, "--prompt", PROMPT, "--stop", stop)
    assert rc == 0 and out == PROMPT + api.texts[0] + "\n"
    rc, out, _ = _cli(capsys, "--prompt", PROMPT, "--stop", full[-2:] + "#never")
    assert rc == 0 and out == PROMPT + full + "\n"


def test_stop_string_tail_is_held_back():
    assert safe_len("x = ab", ["abc"]) == 4
    assert safe_len("x = abc d", ["abc"]) == 4
    assert safe_len("x = a", ["ab", "zz"]) == 4
    assert safe_len("x = y", ["ab"]) == 5


@pytest.mark.parametrize("args", [("--temperature", "-1"), ("--block-size", "0"),
                                  ("--top-p", "0"), ("--model", "./no/such/dir")])
def test_cli_errors_print_nothing_on_stdout(capsys, args):
    rc, out, err = _cli(capsys, "--prompt", PROMPT, *args)
    assert rc == 2 and out == "" and "Error" in err


# 6. Model paths that do not exist.

@pytest.mark.parametrize("spec", ["./missing", "missing-model", "model.bin", "~/missing", "a/b"])
def test_missing_model_directory_is_named(spec):
    with pytest.raises(InvalidInputError, match="no such model directory.*bundled: stdlib-code"):
        resolve_model(spec)


def test_missing_directory_in_a_tuple(tmp_path):
    target = bundled_path(MODEL) / "target"
    with pytest.raises(InvalidInputError, match="no such draft directory"):
        resolve_model((target, tmp_path / "nope"))
    with pytest.raises(InvalidInputError, match="no such target directory"):
        resolve_model((tmp_path / "nope", target))


# 8. hidden_act "swish" is silu.

def test_swish_is_silu():
    root = bundled_path(MODEL)
    target = read_config(root / "target")
    assert TargetConfig.from_dict({**target, "hidden_act": "swish"}) == TargetConfig.from_dict(target)
    draft = read_config(root / "draft")
    assert DraftConfig.from_dict({**draft, "hidden_act": "swish"}) == DraftConfig.from_dict(draft)
    with pytest.raises(CheckpointError, match="gelu"):
        TargetConfig.from_dict({**target, "hidden_act": "gelu"})
    with pytest.raises(CheckpointError, match="gelu"):
        DraftConfig.from_dict({**draft, "hidden_act": "gelu"})


@pytest.mark.parametrize("name", ["", " ", "\t\n"])
def test_an_empty_model_or_draft_name_is_refused(name):
    from dflash2rt.bundled import model_dir

    with pytest.raises(InvalidInputError, match="the model is an empty string"):
        resolve_model(name)
    with pytest.raises(InvalidInputError, match="the draft is an empty string"):
        resolve_model(MODEL, draft=name)
    with pytest.raises(InvalidInputError, match="the target is an empty string"):
        resolve_model((name, None))
    with pytest.raises(InvalidInputError, match="the model is an empty string"):
        model_dir(name)
    assert model_dir(".").is_dir()                     # the current directory, said as such
