"""The decode engine: lossless greedy equality, seeds, DFlash2 ⊃ v1, bad requests, one sync."""

from __future__ import annotations

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.errors import InvalidInputError, NonFiniteLogitsError, SamplingParamsError

from tiny_models import oracle_pair, successor, tiny_pair

PROMPTS = [(1, 2, 3), (5, 9, 11, 13, 17, 19, 23), tuple(range(30, 42)), (7,)]


def _reqs(n_new=24, prompts=PROMPTS, **kw):
    return [Request(p, SamplingParams(max_new_tokens=n_new, **kw)) for p in prompts]


def naive_greedy(pair, prompt, n_new):
    """Greedy decoding by full recomputation, no cache reuse: the reference."""
    seq = list(prompt)
    t = pair.target
    for _ in range(n_new):
        ids = torch.tensor([seq])
        out = t.forward_full(ids, torch.arange(len(seq)).view(1, -1),
                             torch.ones_like(ids, dtype=torch.bool))
        seq.append(int(torch.argmax(out.logits[0, -1])))
    return seq[len(prompt):]


@pytest.mark.parametrize("block", [2, 4, 8, 16])
def test_greedy_spec_equals_target_only_bad_draft(block):
    pair = tiny_pair("dflash2", block=block, seed=block)
    eng = Engine(pair, get_backend("cpu"))
    spec, s = eng.generate(_reqs(), spec=True)
    ar, _ = eng.generate(_reqs(), spec=False)
    assert [o.token_ids for o in spec] == [o.token_ids for o in ar]
    assert s.tau < 1.5, "a random draft should be nearly always rejected"
    if block == 8:
        assert ar[1].token_ids == naive_greedy(pair, PROMPTS[1], 24)


@pytest.mark.parametrize("block", [2, 4, 8, 16])
def test_greedy_spec_equals_target_only_good_draft(block):
    pair = oracle_pair(block)
    eng = Engine(pair, get_backend("cpu"))
    prompts = [(1, 2), (3, 4, 5, 6, 7), (8,)]
    spec, s = eng.generate(_reqs(prompts=prompts), spec=True, block_size=block)
    ar, _ = eng.generate(_reqs(prompts=prompts), spec=False)
    assert [o.token_ids for o in spec] == [o.token_ids for o in ar]
    assert s.tau == block and s.accept_hist[-1] == s.request_steps
    chain = [successor(prompts[0][-1], 29)]
    while len(chain) < 24:
        chain.append(successor(chain[-1], 29))
    assert spec[0].token_ids == chain


def test_identity_conv_and_zero_successor_equal_dflash1_drafts():
    from dflash2rt.engine import stages
    from dflash2rt.models.draft import DraftModel
    from dflash2rt.models.draft_config import DraftConfig
    from dflash2rt.models.pair import ModelPair
    from tiny_models import draft_dict

    v2 = tiny_pair("dflash2", block=6, seed=3)
    with torch.no_grad():
        for layer in v2.draft.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                conv.base_kernel.zero_()
                conv.base_kernel[:, 0] = 1.0
                conv.kernel_projection.weight.zero_()
        v2.draft.candidate_selector.successor_codebook.zero_()
    v1_draft = DraftModel(DraftConfig.from_dict(draft_dict("dflash1", 6))).double()
    shared = {k: v for k, v in v2.draft.state_dict().items()
              if "conv" not in k and "candidate_selector" not in k}
    v1_draft.load_state_dict(shared, strict=True)
    v1 = ModelPair(v2.target, v1_draft.eval())
    for pair_ in (v2, v1):
        eng = Engine(pair_, get_backend("cpu"))
        reqs = _reqs(prompts=PROMPTS)
        with torch.inference_mode():
            st = eng.runner.start(reqs, True, 6, None, print, {})
            stages.prefill(pair_, st, eng.backend, PROMPTS)
            pos = stages.block_positions(st, 6)
            h = stages.draft_block(pair_, st, eng.backend, pos, max(map(len, PROMPTS)))
            noise = eng.backend.noise(st.seed, st.key, st.lens, 5)
            sel = stages.select_block(pair_, st, eng.backend, h, noise)
        if pair_ is v2:
            want, hidden = sel.draft, h
        else:
            assert torch.equal(h, hidden)
            assert torch.equal(sel.draft, want)


@pytest.mark.parametrize("block", [8, None])
def test_same_seed_same_tokens_across_runs_batches_and_positions(block):
    """Fixed block: a request's tokens depend only on its prompt and parameters. Adaptive
    (None): the block sizes follow the batch's outcomes and the schedule's table, which learns
    between calls, so the same batch repeats under the same schedule state (a replica)."""
    pair = oracle_pair(8)
    eng = Engine(pair, get_backend("cpu"))
    params = dict(temperature=1.3, top_p=0.95, seed=11)
    gen = lambda ps, **kw: eng.generate(_reqs(prompts=ps, **kw), block_size=block)  # noqa: E731
    if block is None:
        gen([(1, 2), (3, 4, 5), (6,)], **params)            # calibrates; the table then learns
        eng.policy = eng.policy.replica()                    # this state, learning nothing
    batch, s = gen([(1, 2), (3, 4, 5), (6,)], **params)
    again, _ = gen([(1, 2), (3, 4, 5), (6,)], **params)
    assert [o.token_ids for o in batch] == [o.token_ids for o in again]
    if block is None:
        assert s.adaptive and sum(s.block_sizes.values()) == s.steps
        # every real step timed once, under its block and the batch's bucket
        assert {b: sum(n for n, _ in per.values()) for b, per in s.step_time.items()} \
            == s.block_sizes
        assert all(set(per) <= {1, 2, 4} and all(c > 0 for c in per.values())
                   for per in s.observed_costs.values())
        return
    alone, _ = gen([(3, 4, 5)], **params)
    moved, _ = gen([(6,), (9, 9, 9, 9), (3, 4, 5)], **params)
    assert batch[1].token_ids == alone[0].token_ids == moved[2].token_ids
    other, _ = gen([(3, 4, 5)], temperature=1.3, top_p=0.95, seed=12)
    assert other[0].token_ids != alone[0].token_ids
    assert 1 < s.tau < 8


@pytest.mark.parametrize("bad, err", [
    (dict(prompt=()), InvalidInputError),
    (dict(max_new_tokens=0), SamplingParamsError),
    (dict(temperature=-1.0), SamplingParamsError),
    (dict(top_p=0.0), SamplingParamsError),
    (dict(top_p=1.5), SamplingParamsError),
    (dict(prompt=(1, 999)), InvalidInputError),
])
def test_bad_requests_raise_typed_errors(bad, err):
    eng = Engine(tiny_pair(), get_backend("cpu"))
    prompt = bad.pop("prompt", (1, 2))
    with pytest.raises(err):
        eng.generate([Request(prompt, SamplingParams(**bad))])


def test_engine_takes_a_backend_and_unknown_names_raise():
    """Selecting a backend by name is the API's and the CLI's job; the Engine takes a Backend."""
    from dflash2rt.errors import UnknownBackendError
    for not_a_backend in ("cpu", None):
        with pytest.raises(InvalidInputError, match="get_backend"):
            Engine(tiny_pair(), not_a_backend)
    with pytest.raises(UnknownBackendError):
        get_backend("no-such-backend")


def test_failure_in_a_step_leaves_engine_usable(monkeypatch):
    pair = tiny_pair()
    eng = Engine(pair, get_backend("cpu"))
    good, _ = eng.generate(_reqs(8))
    real = type(pair.target).forward
    calls = {"n": 0}

    def poisoned(self, *a, **kw):
        out = real(self, *a, **kw)
        calls["n"] += 1
        if calls["n"] == 3:      # prefill, step 1 verify, then step 2's verify
            out.logits[1] = float("nan")
        return out

    monkeypatch.setattr(type(pair.target), "forward", poisoned)
    with pytest.raises(NonFiniteLogitsError, match=r"request\(s\) \[1\]"):
        eng.generate(_reqs(8))
    monkeypatch.setattr(type(pair.target), "forward", real)
    again, _ = eng.generate(_reqs(8))
    assert [o.token_ids for o in again] == [o.token_ids for o in good]


class _SyncCounter(torch.overrides.TorchFunctionMode):
    """Counts reads of tensor values into Python (tolist, item, bool/int/float/index) and
    transfers to the host (cpu): each is a device→host sync on an accelerator. ``.numpy()`` is
    not counted: it exists only for CPU tensors (a zero-copy view), which the CPU-only Philox
    fast path uses; accelerators take the tensor path."""

    NAMES = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "cpu"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.NAMES:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("spec, block", [(True, None), (True, 4), (False, None)])
def test_exactly_one_device_to_host_sync_per_step(spec, block):
    """One transfer per decode step (+ the prefill's). An adaptive run first times the block
    sizes at a new batch bucket (calibration steps, one transfer each, results discarded);
    a later run at that bucket makes exactly one transfer per step."""
    pair = tiny_pair("dflash2", block=4)
    eng = Engine(pair, get_backend("cpu"))
    for _ in range(2 if block is None and spec else 1):
        counter = _SyncCounter()
        with counter:
            _, stats = eng.generate(_reqs(10, temperature=0.7), spec=spec, block_size=block)
        assert stats.steps > 3
        assert stats.syncs == stats.steps
        assert counter.count == stats.steps + stats.calibration_steps + 1   # + the prefill's
    assert stats.calibration_steps == 0
