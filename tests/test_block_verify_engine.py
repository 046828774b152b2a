"""Block verification through the engine, the API, the server's request bodies and the CLI:
greedy requests are unchanged, a request's tokens are its own whatever its batch, the run
stats count it, a kernel backend reports the torch-ops verify, and what it cannot do (target
only, the watermark, no float64, an unknown rule) is refused with what to change."""

from __future__ import annotations

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.extensions import BLOCK_VERIFY_OPS, BlockVerify
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.engine.verification import block_rows, check_rule
from dflash2rt.errors import InvalidInputError, SamplingParamsError
from dflash2rt.serve import protocol
from dflash2rt.serve.errors import APIError
from dflash2rt.watermark import WatermarkKey

from stub_constraint import Pattern as Regex
from tiny_models import tiny_pair

BLOCK = 4


@pytest.fixture(scope="module")
def engine():
    return Engine(tiny_pair("dflash2", block=BLOCK, seed=6, dtype=torch.float32),
                  get_backend("cpu"))


def _req(prompt, rule="token", temperature=1.0, top_p=1.0, seed=0, key=0, n=12):
    return Request(tuple(prompt), SamplingParams(max_new_tokens=n, temperature=temperature,
                                                 top_p=top_p, seed=seed, ignore_eos=True,
                                                 verification=rule), key=key)


def test_greedy_block_requests_decode_as_the_target_alone(engine):
    reqs = [_req((3, 1, 4), "block", 0.0, key=0), _req((2, 7), "block", 0.0, key=1)]
    spec, stats = engine.generate(reqs, block_size=BLOCK)
    alone, _ = engine.generate([_req((3, 1, 4), "token", 0.0, key=0),
                                _req((2, 7), "token", 0.0, key=1)], spec=False)
    assert [o.token_ids for o in spec] == [o.token_ids for o in alone]
    assert stats.block_verified == 2


def test_each_request_is_verified_by_its_own_rule_whatever_its_batch(engine):
    reqs = [_req((3, 1, 4), "block", 1.0, seed=1, key=0),
            _req((3, 1, 4), "token", 1.0, seed=1, key=1),
            _req((5, 9), "block", 0.7, top_p=0.9, seed=2, key=2),
            _req((2, 6, 5), "token", 0.0, key=3)]
    batch, stats = engine.generate(reqs, block_size=BLOCK)
    for i, q in enumerate(reqs):
        alone, _ = engine.generate([q], block_size=BLOCK)
        assert batch[i].token_ids == alone[0].token_ids, i
    assert stats.block_verified == 2 and BLOCK_VERIFY_OPS not in stats.fallbacks


def test_the_rule_changes_the_draws_of_a_sampled_request():
    """On the bundled pair (whose draft the target often accepts: on random tiny models a
    block is mostly rejected at its first slot, where the two rules agree), a sampled
    request's tokens differ between the rules under some seed: the rule is not ignored."""
    import json

    from dflash2rt.bundled import bundled_path
    from dflash2rt.models.pair import load_pair

    bp = bundled_path("stdlib-code")
    eng = Engine(load_pair(bp / "target", bp / "draft"), get_backend("cpu"))
    prompt = json.loads((bp / "heldout_prompts.json").read_text())[0]["prompt_ids"]
    differ = 0
    for seed in range(3):
        tok, _ = eng.generate([_req(prompt, "token", 1.0, seed=seed, n=24)], block_size=8)
        blk, st = eng.generate([_req(prompt, "block", 1.0, seed=seed, n=24)], block_size=8)
        differ += tok[0].token_ids != blk[0].token_ids
        assert len(blk[0].token_ids) == 24 and st.block_verified == 1
    assert differ > 0


def test_target_only_and_watermarked_runs_refuse_block_verification(engine):
    with pytest.raises(InvalidInputError, match="target-only"):
        engine.generate([_req((1, 2), "block")], spec=False)
    with pytest.raises(InvalidInputError, match="watermark"):
        engine.generate([_req((1, 2), "block")], block_size=BLOCK,
                        watermark=WatermarkKey(bytes(range(32))))
    engine.generate([_req((1, 2), "token")], block_size=BLOCK,
                    watermark=WatermarkKey(bytes(range(32))))          # token: fine


def test_check_rule_and_block_rows():
    reqs = [_req((1,), "block"), _req((1,), "token"), _req((2,), "block", 0.0)]
    assert block_rows(reqs) == 2 and block_rows(reqs[1:2]) == 0
    check_rule(reqs, True)
    check_rule(reqs[1:2], False, watermark=object())
    with pytest.raises(InvalidInputError, match="speculate"):
        check_rule(reqs[2:], False)
    with pytest.raises(InvalidInputError, match="'token' for watermarked"):
        check_rule(reqs[:1], True, watermark=object())


def test_the_extension_holds_the_rows_that_asked():
    assert BlockVerify.build(["token", "token"], torch.device("cpu")) is None
    ext = BlockVerify.build(["token", "block", "block"], torch.device("cpu"))
    assert ext.verify_rows().tolist() == [False, True, True]
    assert ext.take([2, 0]).verify_rows().tolist() == [True, False]
    assert ext.reports("verify", {"verify": "triton kernel"}) == [BLOCK_VERIFY_OPS]
    assert ext.reports("verify", {"verify": "torch ops"}) == []
    assert ext.reports("draft", {"verify": "triton kernel"}) == []


@pytest.mark.parametrize("value", ["Block", "", None, 1, "tokens"])
def test_an_unknown_rule_is_a_sampling_params_error(value):
    with pytest.raises(SamplingParamsError, match="verification must be one of"):
        SamplingParams(verification=value)


def test_without_float64_the_engine_refuses_block_rows():
    from dflash2rt.backend import TorchOpsBackend
    from dflash2rt.errors import BackendError

    be = TorchOpsBackend("cpu", "cpu", (torch.float32,), has_fp64=False)
    eng = Engine(tiny_pair("dflash2", block=BLOCK, seed=6, dtype=torch.float32), be)
    with pytest.raises(BackendError, match="float64"):
        eng.generate([_req((1, 2), "block")], block_size=BLOCK)
    eng.generate([_req((1, 2), "token")], block_size=BLOCK)           # token: fine


def test_on_a_kernel_backend_block_rows_verify_with_torch_ops_and_say_so():
    from backends import available

    interp, cpu = available(), get_backend("cpu")
    pair = tiny_pair("dflash2", block=BLOCK, seed=6, dtype=torch.float32)
    reqs = [_req((3, 1, 4), "block", 1.0, seed=3, n=6), _req((5, 9), "token", 1.0, n=6, key=1)]
    got, stats = Engine(pair, interp).generate(reqs, block_size=BLOCK)
    want, _ = Engine(pair, cpu).generate(reqs, block_size=BLOCK)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert BLOCK_VERIFY_OPS in stats.fallbacks


def _limits(block=8):
    return protocol.Limits(("m",), 64, block, 50, Regex)


@pytest.mark.parametrize("block,body,want", [
    (8, {}, "token"), (8, {"verification": "token"}, "token"),
    (8, {"verification": "block"}, "block"), (None, {"verification": "block"}, "block"),
    (1, {"verification": "token"}, "token"), (1, {"verification": "block"}, None),
    (8, {"verification": "Block"}, None), (8, {"verification": ["block"]}, None),
    (8, {"verification": None}, None), (8, {"verification": 1}, None),
])
def test_server_bodies_take_the_rule_or_name_the_field(block, body, want):
    if want is not None:
        assert protocol.sampling_params(body, _limits(block), 4, None, "logprobs"
                                        ).verification == want
        return
    with pytest.raises(APIError) as info:
        protocol.sampling_params(body, _limits(block), 4, None, "logprobs")
    assert info.value.status == 400 and info.value.param == "verification"
    assert ("--no-spec" in info.value.message) == (block == 1)


def test_the_cli_takes_the_rule():
    from dflash2rt.cli import build_parser

    args = build_parser().parse_args(["run", "--prompt", "x", "--verification", "block"])
    assert args.verification == "block"
    assert build_parser().parse_args(["run", "--prompt", "x"]).verification == "token"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--prompt", "x", "--verification", "blok"])


def test_the_stats_line_counts_block_verified_requests():
    from types import SimpleNamespace

    from dflash2rt.cli import stats_line

    assert stats_line.counts(SimpleNamespace(candidates={}, block_verified=0)) == ""
    assert stats_line.counts(SimpleNamespace(candidates={}, block_verified=2)) == \
        "block-verified 2, "
    assert stats_line.counts(SimpleNamespace(candidates={16: 1}, block_verified=1)) == \
        "candidates 16x1, block-verified 1, "
