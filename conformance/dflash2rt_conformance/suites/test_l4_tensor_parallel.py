"""L4 tensor parallel: the engine with the target sharded over 2 ranks (``dflash2rt.run(tp=2)``,
spawned processes on gloo; docs/tensor-parallel.md) decodes by the same per-token law as
target-only steps with the same TP, and its ranks agree.

* Greedy: TP=2 speculative tokens equal TP=2 target-only tokens, and both equal TP=1
  target-only tokens, except where the unsharded float64 reference's top-2 margin is within
  float32 decision noise (each exception listed; the all-reduce adds partial sums in another
  order than one matmul).
* Sampled, T = 1, top-k 3: a χ² test of the joint law of the first two generated tokens of
  TP=2 speculative and of TP=2 target-only runs against the float64 reference law (L4's
  sampled test, with TP), sized to detect a TV of 0.05 (0.1 quick). The per-token law itself
  is proved exactly at L2/L3 and to TV 0.01 by L4's unsharded test; what sharding can break
  (a shard on the wrong rank, a missing all-reduce, ranks drawing other coins) moves the law
  by far more, and rank disagreement is caught exactly by the step hash check.
* Ranks agree: every run has the step hash check on (a rank committing other tokens raises),
  and each rank writes its outputs, which must be identical on both ranks, seeded T = 1
  outputs included.

CPU backends only (the ranks' device group is gloo); on other devices the tests skip with
the reason: NCCL / XCCL tensor parallelism is not qualified by this suite.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist

from dflash2rt.backend import TRITON_INTERPRETER
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt_conformance import models, stats
from dflash2rt_conformance.capability import skip_tp_elsewhere
from dflash2rt_conformance.near_tie import greedy_near_tie
from dflash2rt_conformance.reference.model import target_forward
from dflash2rt_conformance.reference.sampling import probs_row

pytestmark = pytest.mark.dflash2rt_level("L4")
DTYPE = "float32"
TP = 2


@pytest.fixture(scope="module")
def tp_backend(backend):
    """The backend's registry name, for the spawned ranks to select again."""
    if backend.device.type != "cpu":
        skip_tp_elsewhere(f"{backend.name} runs on {backend.device.type} (the NCCL / XCCL groups "
                          "are not exercised by this suite)")
    if TRITON_INTERPRETER in backend.implementation.values():
        skip_tp_elsewhere(f"{backend.name} runs its kernels in the Triton interpreter, one "
                          "program at a time (two ranks decoding there take many minutes)")
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("this torch build has no torch.distributed gloo backend")
    return backend.name


def _ranks(pair, backend_name, runs, out_dir):
    """On each rank (its target sharded, the step hash check and rank 0's schedule on, as
    ``run(tp=2)`` sets them up): every run of ``runs`` (name → prompts, SamplingParams
    keywords, seeds, spec); each rank writes its tokens to out_dir/rank{r}.json, rank 0
    returns them."""
    from dflash2rt.distributed.rank_setup import rank_setup
    from dflash2rt.distributed.consensus import RankZero, StepCheck
    from dflash2rt.engine.engine import Engine
    from dflash2rt.engine.request import Request, SamplingParams
    from dflash2rt.engine.policy.adaptive import AdaptivePolicy
    from dflash2rt.registry import Registry

    a = dict(model=pair, tp=TP, tp_check=True, backend=backend_name)
    be, group, p = rank_setup(a, Registry.discover().select(backend_name).backend)
    got = {}
    with Engine(p, be) as eng:
        eng.policy = AdaptivePolicy.measured(p.draft.cfg.block_size, eng.table,
                                             agree=RankZero(group))
        eng.step_check = StepCheck(group)
        for name, r in runs.items():
            reqs = [Request(tuple(pr), SamplingParams(**r["params"], seed=seed))
                    for seed in r["seeds"] for pr in r["prompts"]]
            outs, _ = eng.generate(reqs, spec=r["spec"], block_size=r.get("block_size"))
            got[name] = [list(o.token_ids) for o in outs]
    with open(os.path.join(out_dir, f"rank{group.rank}.json"), "w") as f:
        json.dump(got, f)
    return got if group.is_main else None


def _spawn(pair, backend_name, runs, tmp_path):
    from dflash2rt.distributed import launch

    return launch.spawn(_ranks, TP, (pair, backend_name, runs, str(tmp_path)), timeout_s=120)


def _prompts(vocab: int, lengths=(1, 5, 13)):
    g = np.random.default_rng(5)
    return [[int(x) for x in g.integers(0, vocab, n)] for n in lengths]


def test_tp2_greedy_spec_equals_target_only_and_tp1(conformance, backend, tp_backend, results,
                                                     quick, sizes, tmp_path):

    pair, desc = models.l4_pair(conformance.model, "cpu", torch.float32)
    prompts = _prompts(pair.target.cfg.vocab_size)
    n_new = sizes.l4_greedy_tokens or (12 if quick else 32)
    params = dict(max_new_tokens=n_new, ignore_eos=True)
    reqs = [Request(tuple(p), SamplingParams(**params)) for p in prompts]
    ref = [o.token_ids for o in Engine(pair, backend).generate(reqs, spec=False)[0]]
    greedy = dict(prompts=prompts, params=params, seeds=[0])
    out = _spawn(pair, tp_backend, {"spec": {**greedy, "spec": True},
                                    "target_only": {**greedy, "spec": False}}, tmp_path)
    w, cfg = models.target_reference(pair.target)
    exemptions, compared = [], 0
    for run, other in (("spec", "target_only"), ("spec", "tp1"), ("target_only", "tp1")):
        b_tokens = ref if other == "tp1" else out[other]
        for i, (s, t) in enumerate(zip(out[run], b_tokens)):
            equal, tie = greedy_near_tie(w, cfg, prompts[i], s, t, DTYPE,
                                         f"L4 tp=2 greedy {run} vs {other} request={i}")
            compared += equal
            if tie is not None:
                exemptions.append(dict(run=run, other=other, request=i, position=tie.position,
                                       tokens=[tie.got, tie.want], margin=tie.margin,
                                       noise=tie.noise))
                results.exempt("L4", "tp=2 greedy near-tie", **exemptions[-1])
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(TP)]
    assert all(r == ranks[0] for r in ranks), "[L4 tp=2 greedy] the ranks decoded different tokens"
    results.metric("L4", "tp=2 greedy", dict(model=desc, tokens_equal=compared,
                                             exemptions=len(exemptions), ranks_agree=True))


def test_tp2_sampled_law_of_first_tokens_and_ranks_agree(conformance, tp_backend, results,
                                                         quick, sizes, tmp_path):
    """(t1, t2) of TP=2 spec and TP=2 target-only runs against the reference law; the same
    seeded T = 1 outputs on both ranks."""
    if conformance.model in ("auto", "tiny"):
        pair = models.tiny_pair(3, torch.float32, block=3, vocab=11)
        desc = "tiny random pair (V=11, block 3, seed 3)"
    else:
        pair, desc = models.l4_pair(conformance.model, "cpu", torch.float32)
    prompt, temp, top_k = [2, 7, 8], 1.0, 3
    alpha, power, target_tv = 1e-3, 0.9, (0.1 if quick else 0.05)
    w, cfg = models.target_reference(pair.target)
    p1 = probs_row(target_forward(w, cfg, prompt)[0][-1], temp, top_k, 1.0)
    expected = {}
    for t1 in np.flatnonzero(p1 > 0):
        p2 = probs_row(target_forward(w, cfg, prompt + [int(t1)])[0][-1], temp, top_k, 1.0)
        for t2 in np.flatnonzero(p2 > 0):
            expected[(int(t1), int(t2))] = p1[t1] * p2[t2]
    cells = len(expected)
    n = sizes.l4_samples or stats.samples_for_tv(target_tv, cells, alpha, power)
    law = dict(prompts=[prompt], seeds=list(range(n)),
               params=dict(max_new_tokens=2, temperature=temp, top_k=top_k, ignore_eos=True))
    seeded = dict(prompts=[prompt, [5, 1]], seeds=list(range(4)),
                  params=dict(max_new_tokens=12, temperature=temp, ignore_eos=True))
    out = _spawn(pair, tp_backend, {"law_spec": {**law, "spec": True},
                                    "law_target_only": {**law, "spec": False},
                                    "seeded_spec": {**seeded, "spec": True, "block_size": 3}},
                 tmp_path)
    summary = {}
    for run in ("law_spec", "law_target_only"):
        counts: dict = {}
        for toks in out[run]:
            key = tuple(toks[:2])
            counts[key] = counts.get(key, 0) + 1
        stat, dof, pval = stats.chi2_test(counts, expected, n)
        det = stats.detectable_tv(n, cells, alpha, power)
        summary[run] = dict(samples=n, cells=cells, chi2=round(float(stat), 3), dof=dof,
                            p_value=float(pval), detectable_tv=round(det, 5))
        assert pval >= alpha, \
            f"[L4 tp=2 sampled {run}] χ² = {stat:.2f} on {dof} dof, p = {pval:.3g} < {alpha} " \
            f"(n = {n}, detectable TV {det:.4f})"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(TP)]
    assert all(r == ranks[0] for r in ranks), \
        "[L4 tp=2 sampled] the ranks' seeded T=1 outputs differ"
    summary.update(model=desc, ranks_agree=True, hash_check=True)
    results.metric("L4", "tp=2 sampled first tokens (T=1, top_k=3)", summary)
    print(f"L4 tp=2 sampled law: {summary}")
