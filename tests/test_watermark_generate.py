"""Watermarked generation: sampled output detectable under its key and not under
another, greedy output bit-identical with and without a watermark, the same tokens on cpu and
triton-interpret (where the kernels draw), repeated contexts fall back to the ordinary
uniforms, the key stays out of stats / JSON / CLI output, and what runs instead of kernels or
graphs is reported."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.api import run
from dflash2rt.backend import TorchOpsBackend
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.extensions import WATERMARK_OPS
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.errors import InvalidInputError
from dflash2rt.registry import Registry
from dflash2rt.watermark import WatermarkKey, detect
from dflash2rt.watermark.generate import WatermarkBatch
from dflash2rt.watermark.sampler import WatermarkUnsupportedError

from backends import available
from test_engine_graphs import ReplayAdapter
from tiny_models import fixed_policy, tiny_pair

KEY = WatermarkKey(bytes(range(32)))
OTHER = WatermarkKey(bytes(range(1, 33)))
PROMPTS = [(1, 2), (3, 4, 5, 6), (7,)]
MODES = {"target-only": dict(spec=False), "spec-b8": dict(block_size=8),
         "adaptive": dict(block_size=None)}


def _reqs(temp, n=48, seed=1, top_p=1.0):
    return [Request(p, SamplingParams(max_new_tokens=n, temperature=temp, seed=seed,
                                      top_p=top_p, ignore_eos=True)) for p in PROMPTS]


@pytest.fixture(scope="module")
def engine():
    e = Engine(tiny_pair("dflash2", block=8, seed=3), get_backend("cpu"))
    e.policy = fixed_policy(8)   # adaptive choices (so tokens) independent of the machine
    return e


@pytest.mark.parametrize("mode", list(MODES))
def test_sampled_output_is_detectable_only_under_its_key(engine, mode):
    outs, stats = engine.generate(_reqs(1.0), watermark=KEY, **MODES[mode])
    assert stats.watermarked
    plain, _ = engine.generate(_reqs(1.0), **MODES[mode])
    for o, p in zip(outs, plain):
        assert detect(KEY, o.token_ids).p_value < 1e-6, (mode, o.token_ids)
        assert detect(OTHER, o.token_ids).p_value > 1e-3
        assert detect(KEY, p.token_ids).p_value > 1e-3


@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_output_is_bit_identical_with_a_watermark(engine, mode):
    marked, _ = engine.generate(_reqs(0.0), watermark=KEY, **MODES[mode])
    plain, _ = engine.generate(_reqs(0.0), **MODES[mode])
    assert [o.token_ids for o in marked] == [o.token_ids for o in plain]


def test_mixed_batch_marks_only_sampled_rows(engine):
    reqs = _reqs(1.0)[:2] + _reqs(0.0)[2:]
    marked, _ = engine.generate(reqs, watermark=KEY, block_size=8)
    plain, _ = engine.generate(_reqs(0.0)[2:], block_size=8)
    assert marked[2].token_ids == plain[0].token_ids
    assert all(detect(KEY, o.token_ids).p_value < 1e-6 for o in marked[:2])


@pytest.mark.slow                       # a long run (over 10 s on 2 cores)
def test_same_key_and_prompt_same_tokens_on_cpu_and_triton_interpret():
    interp = available()
    pair = tiny_pair("dflash2", block=4, seed=3, dtype=torch.float32)
    reqs = [Request(p, SamplingParams(max_new_tokens=12, temperature=t, top_p=0.95, seed=4))
            for p, t in zip(PROMPTS, (1.0, 0.7, 0.0))]
    got, stats = Engine(pair, interp).generate(reqs, block_size=4, watermark=KEY)
    want, _ = Engine(pair, get_backend("cpu")).generate(reqs, block_size=4, watermark=KEY)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert interp.implementation["watermark"] == "triton interpreter"   # the kernels' draws
    assert WATERMARK_OPS not in stats.fallbacks


def test_kernel_backend_whose_watermark_is_torch_ops_reports_it():
    """A backend whose select / verify are kernels but whose keyed draws (given the watermark's
    draw source) are the torch ops reports WATERMARK_OPS; the torch backend does not."""
    class KernelClaims(TorchOpsBackend):
        @property
        def implementation(self):
            return {**super().implementation, "select": "triton kernel",
                    "verify": "triton kernel"}

    pair = tiny_pair("dflash2", block=4, seed=3)
    be = KernelClaims("claims", "cpu", (torch.float32, torch.float64))
    _, stats = Engine(pair, be).generate(_reqs(1.0, n=6), block_size=4, watermark=KEY)
    assert WATERMARK_OPS in stats.fallbacks
    _, stats = Engine(pair, get_backend("cpu")).generate(_reqs(1.0, n=6), block_size=4,
                                                         watermark=KEY)
    assert WATERMARK_OPS not in stats.fallbacks


def test_graph_backend_replays_watermarked_steps():
    """Watermarked steps are captured: the key words and the state (window, record, count)
    are static inputs, so replays over them give the eager engine's tokens, for both modes
    and a batch that shrinks across buckets; nothing runs eagerly."""
    pair = tiny_pair("dflash2", block=4, seed=3)
    be = TorchOpsBackend("cpu-graphs", "cpu", (torch.float32, torch.float64))
    adapter = ReplayAdapter()
    be.graph_adapter = adapter
    engine = Engine(pair, be)
    for spec in (True, False):
        reqs = _reqs(1.0, n=10) + _reqs(0.7, n=3)
        got, stats = engine.generate(reqs, spec=spec, block_size=4 if spec else None,
                                     watermark=KEY)
        want, _ = Engine(pair, get_backend("cpu")).generate(
            reqs, spec=spec, block_size=4 if spec else None, watermark=KEY)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        assert not stats.fallbacks, stats.fallbacks
        runs = [c for g in stats.graphs.values() for c in g.values()]
        assert sum(c["replays"] for c in runs) > 0 and sum(c["eager"] for c in runs) == 0
    assert adapter.replays > 0


def test_one_graph_serves_every_key():
    """A second key replays the graphs captured under the first (the key is an input, not a
    constant of the capture) and gives that key's eager tokens, not the first key's."""
    pair = tiny_pair("dflash2", block=4, seed=3)
    be = TorchOpsBackend("cpu-graphs", "cpu", (torch.float32, torch.float64))
    adapter = ReplayAdapter()
    be.graph_adapter = adapter
    engine = Engine(pair, be)
    other = WatermarkKey.from_bytes(bytes(range(1, 33)))
    outs = {}
    for key in (KEY, other):
        got, _ = engine.generate(_reqs(1.0, n=10), block_size=4, watermark=key)
        want, _ = Engine(pair, get_backend("cpu")).generate(_reqs(1.0, n=10), block_size=4,
                                                             watermark=key)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        outs[key.fingerprint] = [o.token_ids for o in got]
    assert len({str(v) for v in outs.values()}) == 2
    captures = adapter.captures
    engine.generate(_reqs(1.0, n=10), block_size=4, watermark=KEY)
    assert adapter.captures == captures          # nothing captured again for a known key


def test_repeated_contexts_use_the_ordinary_uniforms():
    """A context already committed, or an earlier slot's, is not fresh (its draws take the
    ordinary uniforms); the record and the window advance by the committed count only."""
    wm = WatermarkBatch.build(KEY, [(5, 5, 5, 5), (1, 2)], 16, 4, "cpu")
    assert wm.marks(torch.zeros(2, 0, dtype=torch.int64)).fresh.all()
    wm.commit_(torch.tensor([[5, 9], [3, -1]]), torch.tensor([2, 1]))   # row 0: ctx 5555 twice
    assert wm.used.tolist() == [2, 1]
    assert wm.window.tolist() == [[5, 5, 5, 9], [-1, 1, 2, 3]]
    m = wm.marks(torch.tensor([[5, 5, 5, 5, 5], [7, 7, 7, 7, 7]]))
    assert m.fresh.tolist() == [[True] * 4 + [False] * 2,        # 5555 recorded
                                [True] * 5 + [False]]            # 7777 is slot 4's context
    m = wm.marks(torch.tensor([[5, 5, 5, 9, 5, 5, 5], [7] * 7]))
    assert m.fresh.tolist() == [[True] * 4 + [False] * 4, [True] * 5 + [False] * 3]
    # The walk: a recorded context returns the unkeyed position; a fresh one the keyed draw.
    walk = WatermarkBatch.build(KEY, [(5, 5, 5, 5), (1, 2)], 16, 4, "cpu")
    walk.commit_(torch.tensor([[5], [3]]), torch.tensor([1, 1]))     # row 0: 5555 recorded
    law = torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]])
    cand = torch.tensor([[5, 6, 7], [5, 6, 7]])
    plain = torch.tensor([2, 2])
    pos, bad = walk.walk().pick(0, law, cand, plain, torch.tensor([False, False]))
    assert pos[0].item() == 2 and pos[1].item() in (0, 1) and not bad.any()
    pos, _ = walk.walk().pick(0, law, cand, plain, torch.tensor([True, True]))   # greedy rows
    assert pos.tolist() == [2, 2]


def test_text_with_repeats_stays_valid_and_detectable(engine):
    """A low temperature repeats contexts; repeated positions draw with the ordinary uniforms,
    the detector skips them, and the text is still detected."""
    outs, _ = engine.generate(_reqs(0.3, n=64), watermark=KEY, block_size=8)
    for o in outs:
        d = detect(KEY, o.token_ids)
        assert d.tokens_scored + d.repeated_skipped == len(o.token_ids) - 4


def test_bad_watermark_arguments_raise(engine, tmp_path):
    with pytest.raises(InvalidInputError, match="WatermarkKey"):
        engine.generate(_reqs(1.0), watermark=b"\0" * 32)
    nofp64 = Registry.discover().select("cpu-nofp64").backend
    with pytest.raises(WatermarkUnsupportedError, match="float64"):
        Engine(tiny_pair("dflash2", block=4, dtype=torch.float32), nofp64).generate(
            _reqs(1.0), watermark=KEY)
    with pytest.raises(InvalidInputError, match="key file"):
        run(tiny_pair("dflash2", block=4), "cpu", prompts=[[1, 2]], watermark=tmp_path / "nope")
    with pytest.raises(InvalidInputError, match="WatermarkKey or the path"):
        run(tiny_pair("dflash2", block=4), "cpu", prompts=[[1, 2]], watermark=42)


def test_api_key_file_and_no_key_in_stats_or_json(tmp_path):
    kf = KEY.save(tmp_path / "wm.key")
    pair = tiny_pair("dflash2", block=4, seed=3)
    kw = dict(prompts=[[1, 2, 3]], max_new_tokens=40, temperature=1.0, seed=2, block_size=4)
    res = run(pair, "cpu", watermark=str(kf), **kw)     # a fixed block: adaptive choices
    same = run(pair, "cpu", watermark=KEY, **kw)        # follow the timings between calls
    assert res.tokens == same.tokens
    assert detect(KEY, res.tokens[0]).p_value < 1e-6
    text = json.dumps(res.as_dict(), default=str) + repr(res.stats)
    secret = bytes(range(32)).hex()
    assert secret not in text and KEY.fingerprint not in text
    assert res.stats.watermarked is True


def test_cli_run_with_key_file(tmp_path, capsys):
    from dflash2rt.cli import main
    from tiny_models import save_pair_dir

    root = save_pair_dir(tmp_path / "pair", tiny_pair("dflash2", block=4, seed=3))
    kf = KEY.save(tmp_path / "wm.key")
    rc = main(["run", "--backend", "cpu", "--model", str(root), "--prompt", "abc",
               "--max-new-tokens", "40", "--temperature", "1", "--block-size", "4",
               "--watermark-key-file", str(kf), "--json"])
    captured = capsys.readouterr()
    assert rc == 0
    res = json.loads(captured.out)
    assert res["stats"]["watermarked"] is True
    assert detect(KEY, res["tokens"][0]).p_value < 1e-4
    secret = bytes(range(32)).hex()
    assert secret not in captured.out + captured.err
    assert np.all(np.array(res["tokens"][0]) >= 0)
