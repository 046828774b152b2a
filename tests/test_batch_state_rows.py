"""``BatchState`` against its definition: a new batch's host mirror equals its device lengths and
each row carries its own request's seed, key and sampling parameters; ``eager_only`` holds
exactly when min-p is staged or some extension is not graphed, each condition alone; each
feature's state is read from its own extension."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dflash2rt.engine import extensions
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.engine.state import new_state
from dflash2rt.models.kv_cache import KVCache

MAX_LEN, VOCAB = 6, 32
CPU = torch.device("cpu")


def _state(params: list[SamplingParams], vocab: int | None = None):
    r = len(params)
    reqs = [Request((1 + i, 2), p, key=40 + 3 * i) for i, p in enumerate(params)]
    target = KVCache.empty(1, max(r, 1), MAX_LEN, 1, 2, torch.float64, "cpu")
    return new_state(reqs, target, None, CPU, vocab)


@pytest.mark.parametrize("r", [1, 2, 4])
def test_a_new_batch_mirrors_its_lengths_and_carries_each_request_s_own_values(r):
    params = [SamplingParams(temperature=[0.0, 0.7, 1.5, 0.0][i], top_k=[0, 5, 0, 2][i],
                             top_p=[1.0, 0.5, 0.9, 1.0][i], seed=[9, 3, 70, 1][i])
              for i in range(r)]
    st = _state(params)
    assert st.size == r and st.rows == list(range(r))
    assert st.lens.tolist() == [0] * r and st.anchor.tolist() == [0] * r
    assert st.host_lens == st.lens.tolist(), "the host mirror equals the device lengths"
    assert st.seed.tolist() == [p.seed for p in params]
    assert st.key.tolist() == [40 + 3 * i for i in range(r)]
    assert st.sampling.temperature.tolist() == pytest.approx([p.temperature for p in params])
    assert st.sampling.top_k.tolist() == [p.top_k for p in params]
    assert st.sampling.top_p.tolist() == pytest.approx([p.top_p for p in params])
    assert st.live.tolist() == [True] * r
    assert st.draft_cache is None and st.target_cache.batch_size == r


def _with(st, *exts, min_p: bool = False):
    sampling = st.sampling
    if min_p:
        r = st.size
        sampling = type(sampling).build([1.0] * r, [0] * r, [1.0] * r, min_p=[0.2] * r)
    return dataclasses.replace(st, sampling=sampling, extensions=tuple(exts))


PROCS, WM, CONSTRAINT = object(), object(), object()


@pytest.mark.parametrize("min_p, exts, eager", [
    (False, (), False),
    (True, (), True),                                      # min-p alone
    (False, ("wm",), False),                               # a graphed extension alone
    (False, ("procs",), True),                             # an ungraphed one alone
    (False, ("constraint",), True),
    (False, ("procs", "wm"), True),                        # ungraphed beside graphed
    (False, ("wm", "constraint"), True),
    (True, ("wm",), True),                                 # min-p beside graphed
])
def test_eager_only_is_min_p_or_an_ungraphed_extension_each_condition_alone(min_p, exts, eager):
    made = {"procs": extensions.Procs(PROCS), "wm": extensions.Watermark(WM),
            "constraint": extensions.Constraint(CONSTRAINT)}
    st = _with(_state([SamplingParams(temperature=1.0)] * 2), *(made[e] for e in exts),
               min_p=min_p)
    assert (st.sampling.min_p is not None) == min_p
    assert st.eager_only is eager


def test_each_feature_s_state_is_its_own_extension_s():
    base = _state([SamplingParams()] * 2)
    assert (base.procs, base.wm, base.constraint, base.candidates) == (None, None, None, None)
    every = (extensions.Procs(PROCS), extensions.Watermark(WM),
             extensions.Constraint(CONSTRAINT))
    for exts in (every, every[::-1], every[1:], every[:1]):
        st = _with(base, *exts)
        kinds = {type(e) for e in exts}
        assert st.procs is (PROCS if extensions.Procs in kinds else None)
        assert st.wm is (WM if extensions.Watermark in kinds else None)
        assert st.constraint is (CONSTRAINT if extensions.Constraint in kinds else None)


def test_a_batch_built_with_min_p_or_logprobs_runs_eagerly_and_a_plain_one_does_not():
    plain = _state([SamplingParams(temperature=1.0), SamplingParams()], VOCAB)
    assert plain.eager_only is False
    assert _state([SamplingParams(), SamplingParams(temperature=1.0, min_p=0.1)],
                  VOCAB).eager_only is True
    assert _state([SamplingParams(logprobs=2), SamplingParams()], VOCAB).eager_only is True
