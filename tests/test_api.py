"""``dflash2rt.run`` and ``dflash2rt run``: model resolution, results, JSON, errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import dflash2rt
from dflash2rt.errors import InvalidInputError, SamplingParamsError, UnknownBackendError

from tiny_models import save_pair_dir, tiny_pair


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory):
    return save_pair_dir(tmp_path_factory.mktemp("pair"), tiny_pair(dtype=torch.float32))


def test_run_with_text_and_token_prompts(pair_dir):
    res = dflash2rt.run(pair_dir, "cpu", prompts=["def f(x):", "abc"], max_new_tokens=12)
    assert len(res.texts) == 2 and all(len(t) == 12 for t in res.tokens)
    assert res.stats.backend == "cpu" and res.stats.tau >= 1.0
    base = dflash2rt.run(pair_dir, "cpu", prompts=["def f(x):", "abc"], max_new_tokens=12,
                         spec=False)
    assert base.tokens == res.tokens and base.stats.mode == "target-only"
    ids = dflash2rt.run((pair_dir / "target", pair_dir / "draft"), "cpu",
                        prompts=[[3, 4, 5]], max_new_tokens=5)
    assert len(ids.tokens[0]) == 5


def test_run_is_seeded_and_honours_sampling_parameters(pair_dir):
    kw = dict(prompts=["hello"], max_new_tokens=16, temperature=0.9, top_k=5, seed=4)
    a = dflash2rt.run(pair_dir, "cpu", **kw)
    assert a.stats.adaptive and sum(a.stats.block_sizes.values()) == a.stats.steps
    assert len(a.tokens[0]) == 16
    # a fixed block repeats exactly (adaptive choices follow a table that learns between calls)
    fixed = dflash2rt.run(pair_dir, "cpu", **kw, block_size=4)
    assert not fixed.stats.adaptive and fixed.stats.block_sizes == {4: fixed.stats.steps}
    assert fixed.tokens == dflash2rt.run(pair_dir, "cpu", **kw, block_size=4).tokens
    assert fixed.tokens != dflash2rt.run(pair_dir, "cpu", **{**kw, "seed": 5},
                                         block_size=4).tokens


def test_stop_tokens_and_strings(pair_dir):
    full = dflash2rt.run(pair_dir, "cpu", prompts=["abc"], max_new_tokens=20)
    tok = full.tokens[0][5]
    cut = dflash2rt.run(pair_dir, "cpu", prompts=["abc"], max_new_tokens=20,
                        stop_token_ids=[tok])
    assert cut.tokens[0] == full.tokens[0][:full.tokens[0].index(tok)]
    assert cut.outputs[0].finish_reason == "stop_token"
    text = full.texts[0]
    stop = text[6:8]
    cut = dflash2rt.run(pair_dir, "cpu", prompts=["abc"], max_new_tokens=20, stop=[stop])
    assert cut.outputs[0].finish_reason == "stop_string"
    assert cut.texts[0] == text[:text.index(stop)]


@pytest.mark.parametrize("kw, err", [
    (dict(prompts=[""]), InvalidInputError),
    (dict(prompts=[]), InvalidInputError),
    (dict(prompts=["a"], max_new_tokens=0), SamplingParamsError),
    (dict(prompts=["a"], temperature=-0.5), SamplingParamsError),
    (dict(prompts=["a"], top_p=0.0), SamplingParamsError),
])
def test_bad_requests(pair_dir, kw, err):
    with pytest.raises(err):
        dflash2rt.run(pair_dir, "cpu", **kw)


def test_unknown_backend_and_model(pair_dir):
    with pytest.raises(UnknownBackendError):
        dflash2rt.run(pair_dir, "warp-drive", prompts=["a"])
    with pytest.raises(InvalidInputError):
        dflash2rt.run("no-such-bundled-model", "cpu", prompts=["a"])


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "dflash2rt", *args], capture_output=True,
                          text=True)


def test_cli_run_json(pair_dir):
    out = _cli("run", "--backend", "cpu", "--model", str(pair_dir), "--prompt", "x = 1",
               "--prompt", "def", "--max-new-tokens", "6", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert len(data["texts"]) == 2 and all(len(t) == 6 for t in data["tokens"])
    for key in ("tau", "tokens_per_s", "accept_hist", "time", "fallbacks", "syncs",
                "adaptive", "block_sizes", "costs"):
        assert key in data["stats"], key
    nospec = json.loads(_cli("run", "--model", str(pair_dir), "--prompt", "x = 1", "--prompt",
                             "def", "--max-new-tokens", "6", "--json", "--no-spec").stdout)
    assert nospec["tokens"] == data["tokens"] and nospec["stats"]["tau"] == 1.0


@pytest.mark.slow                       # a long run (over 10 s on 2 cores)
def test_cli_run_streams_text_and_reports_errors(pair_dir):
    out = _cli("run", "--model", str(pair_dir), "--prompt", "ab", "--max-new-tokens", "5")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ab") and "tok/s" in out.stderr and "tau" in out.stderr
    assert "adaptive blocks " in out.stderr
    fixed = _cli("run", "--model", str(pair_dir), "--prompt", "ab", "--max-new-tokens", "5",
                 "--block-size", "4")
    assert fixed.returncode == 0 and "(block 4)" in fixed.stderr, fixed.stderr
    bad = _cli("run", "--model", str(pair_dir), "--prompt", "ab", "--top-p", "2")
    assert bad.returncode == 2 and "SamplingParamsError" in bad.stderr
