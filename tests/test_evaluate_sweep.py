"""``train.evaluate`` against its definitions: ``measure`` with the engine and the timing
replaced by recorders (the requests it builds, the contenders it asks for, and every field of
its result, summed and divided by hand), and ``topk_mass`` on a tiny float64 pair against a
float64 loop over the anchors (the draft's top-K candidates, ties to the lower id, against the
target's law after temperature and top-p, one-hot on its argmax at T = 0)."""

from __future__ import annotations

import dataclasses
import math
import types

import pytest
import torch

from dflash2rt.backend import TorchOpsBackend
from dflash2rt.bench.measure import Sample
from dflash2rt.train import distill, evaluate
from dflash2rt.train.target import lm_forward

from tiny_models import tiny_pair

BACKEND = TorchOpsBackend("cpu", "cpu", (torch.float32, torch.float64))


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


# ---------------------------------------------------------------- measure

def _stats(block_sizes, hist):
    return types.SimpleNamespace(block_sizes=block_sizes, accept_hist=hist)


def _measurements(tonly_seconds=(1.0, 2.0)):
    """spec: two prompts, 4 + 8 tokens in 0.5 + 1.5 s, steps {4: 3} + {4: 2, 2: 5}, accept
    histograms [1, 2] + [0, 1, 0, 4]; target-only: the same tokens, prompt 1's output differs."""
    spec = types.SimpleNamespace(
        tau=2.5, stats=[_stats({4: 3}, [1, 2]), _stats({4: 2, 2: 5}, [0, 1, 0, 4])],
        samples=[Sample([[1, 2]], 0.5, 4), Sample([[3, 4]], 1.5, 8)],
        outputs=[[1, 2], [3, 4]], capture_s=0.25)
    tonly = types.SimpleNamespace(
        tau=0.0, stats=[], samples=[Sample([[1, 2]], tonly_seconds[0], 4),
                                    Sample([[3, 5]], tonly_seconds[1], 8)],
        outputs=[[1, 2], [3, 5]], capture_s=0.5)
    return {"spec": spec, "target_only": tonly}


class Recorders:
    def __init__(self, monkeypatch, tonly_seconds=(1.0, 2.0)):
        self.engines, self.contenders, self.measured, self.masses = [], [], [], []
        meas = _measurements(tonly_seconds)
        rec = self

        class Engine:
            def __init__(self, pair, backend):
                rec.engines.append((pair, backend))

        def contender(name, engine, batches, spec, block=None):
            rec.contenders.append((name, engine, batches, spec, block))
            return name

        def measure_all(contenders, repeats):
            rec.measured.append((list(contenders), repeats))
            return {c: meas[c] for c in contenders}

        def mass(pair, prompts, outputs, temperature, top_p=1.0):
            rec.masses.append((pair, prompts, outputs, temperature, top_p))
            return {"topk_mass": 0.375, "topk_mass_per_slot": [0.5, 0.25]}

        monkeypatch.setattr(evaluate, "Engine", Engine)
        monkeypatch.setattr(evaluate, "resolve_backend", lambda b: ("resolved", b))
        monkeypatch.setattr(evaluate, "engine_contender", contender)
        monkeypatch.setattr(evaluate, "measure_contenders", measure_all)
        monkeypatch.setattr(evaluate, "topk_mass", mass)


PAIR = types.SimpleNamespace(draft=types.SimpleNamespace(cfg=types.SimpleNamespace(block_size=8)))
PROMPTS = [[5, 6, 7], [9]]


def test_measure_greedy_with_baseline_and_mass(monkeypatch):
    rec = Recorders(monkeypatch)
    res = evaluate.measure(PAIR, "cpu", PROMPTS, 6)
    assert rec.engines == [(PAIR, ("resolved", "cpu"))]
    [(name, engine, batches, spec, block), tonly] = rec.contenders
    assert (name, spec, block) == ("spec", True, 8)
    assert tonly[0] == "target_only" and tonly[2] is batches and tonly[3] is False
    assert tonly[4] is None
    assert len(batches) == 2 and all(len(b) == 1 for b in batches)
    for i, [req] in enumerate(batches):
        assert req.prompt_ids == tuple(PROMPTS[i]) and req.key == i
        p = req.params
        assert (p.max_new_tokens, p.temperature, p.top_p, p.seed, p.ignore_eos) == \
            (6, 0.0, 1.0, 0, True)
    assert rec.measured == [(["spec", "target_only"], 1)]
    assert rec.masses == [(PAIR, PROMPTS, [[1, 2], [3, 4]], 0.0, 1.0)]
    assert res == {
        "prompts": 2, "new_tokens": 6, "temperature": 0.0, "top_p": 1.0, "block_size": 8,
        "tau": 2.5, "accept_hist": [1, 3, 0, 4], "steps_per_block": {4: 5, 2: 5},
        "spec_tokens_per_s": 12 / 2.0, "capture_s": 0.75,
        "target_only_tokens_per_s": 12 / 3.0, "speedup_vs_target_only": 6.0 / 4.0,
        "target_tokens_per_s": 12 / 3.0, "speedup": 6.0 / 4.0, "greedy_mismatches": [1],
        "topk_mass": 0.375, "topk_mass_per_slot": [0.5, 0.25]}


def test_measure_sampled_at_a_fixed_block_without_baseline_or_mass(monkeypatch):
    rec = Recorders(monkeypatch)
    res = evaluate.measure(PAIR, "cpu", PROMPTS, 3, 0.7, block_size=3, seed=4, baseline=False,
                           top_p=0.95, mass=False)
    [(name, _, batches, spec, block)] = rec.contenders
    assert (name, spec, block) == ("spec", True, 3)
    p = batches[1][0].params
    assert (p.max_new_tokens, p.temperature, p.top_p, p.seed) == (3, 0.7, 0.95, 4)
    assert rec.measured == [(["spec"], 1)] and rec.masses == []
    assert res == {"prompts": 2, "new_tokens": 3, "temperature": 0.7, "top_p": 0.95,
                   "block_size": 3, "tau": 2.5, "accept_hist": [1, 3, 0, 4],
                   "steps_per_block": {4: 5, 2: 5}, "spec_tokens_per_s": 6.0,
                   "capture_s": 0.25}


def test_measure_sampled_with_baseline_has_no_greedy_check(monkeypatch):
    """At T > 0 outputs differ by design: no greedy check; a target-only run timed at 0 s has
    rate 0 and the speedup over the 1e-9 floor."""
    Recorders(monkeypatch, tonly_seconds=(0.0, 0.0))
    res = evaluate.measure(PAIR, "cpu", PROMPTS, 6, 1.0)
    assert "greedy_mismatches" not in res
    assert res["target_only_tokens_per_s"] == res["target_tokens_per_s"] == 0.0
    assert res["speedup_vs_target_only"] == res["speedup"] == 6.0 / 1e-9


# ---------------------------------------------------------------- topk_mass

def _law(row, temperature, top_p):
    """The target's law of one row of logits (floats): one-hot on the argmax (lowest id) at
    T = 0, else softmax(logits / T) cut to the top-p prefix (mass strictly ahead < top_p, ties
    by lower id) and renormalised."""
    v = len(row)
    if temperature == 0:
        best = max(range(v), key=lambda t: (row[t], -t))
        return [1.0 if t == best else 0.0 for t in range(v)]
    top = max(row)
    e = [math.exp((x - top) / temperature) for x in row]
    z = sum(e)
    p = [x / z for x in e]
    order = sorted(range(v), key=lambda t: (-p[t], t))
    keep, ahead = set(), 0.0
    for t in order:
        if ahead < top_p:
            keep.add(t)
        ahead += p[t]
    z = sum(p[t] for t in keep)
    return [p[t] / z if t in keep else 0.0 for t in range(v)]


def forced_anchors(pair, prompts, outputs):
    """One anchor at a time, each prompt + its continuation teacher-forced: (the sequence, the
    anchor a, the draft's hidden states h [γ, H] of its block, their logits [γ][V] as lists,
    the target's logits of the whole sequence [n][V] as float64 lists)."""
    draft, target = pair.draft, pair.target
    gamma = draft.cfg.block_size - 1
    for prompt, out in zip(prompts, outputs):
        seq = list(prompt) + list(out)
        n, p = len(seq), len(prompt)
        fwd = lm_forward(target, [seq])
        logits = fwd.logits[0].double().tolist()
        for a in range(p, n - gamma):
            ids = torch.tensor([[[seq[a]] + [draft.cfg.mask_token_id] * gamma]])
            batch = distill.Batch(fwd.taps, torch.tensor([n]), torch.tensor([[a]]), ids,
                                  ids[..., 1:])
            h = distill.draft_hidden(draft, target, batch, BACKEND)[0, 0, 1:]
            yield seq, a, h, target.lm_head(h).tolist(), logits


def _reference(pair, prompts, outputs, temperature, top_p):
    gamma, k = pair.draft.cfg.block_size - 1, pair.draft.cfg.selector_top_k
    total, count = [0.0] * gamma, 0
    for _, a, _, dl, logits in forced_anchors(pair, prompts, outputs):
        for e in range(gamma):
            cand = sorted(range(len(dl[e])), key=lambda t: (-dl[e][t], t))[:k]
            law = _law(logits[a + e], temperature, top_p)
            total[e] += sum(law[c] for c in cand)
        count += 1
    per = [t / max(count, 1) for t in total]
    return sum(per) / gamma, per


@pytest.fixture(scope="module")
def pair():
    """The tiny pair with K = 24 of the 61 ids as candidates (so that the target's argmax is
    among them at some slots and not at others)."""
    pair = tiny_pair("dflash2", block=4, seed=4)
    pair.draft.cfg = dataclasses.replace(pair.draft.cfg, selector_top_k=24)
    return pair


# prompt 0: anchors 3 .. 5; prompt 1: n - γ = 3 < 4 tokens of prompt, no anchor; prompt 2: one
OUTS = ([5, 6, 7], [8, 9, 10, 11, 12, 13]), ([1, 2, 3, 4], [14, 15]), ([9, 10], [21, 22, 23, 24])


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (1.0, 1.0), (0.7, 0.95),
                                                (1.3, 0.5)])
def test_topk_mass_is_the_laws_mass_on_the_candidates(pair, temperature, top_p):
    prompts, outputs = [p for p, _ in OUTS], [o for _, o in OUTS]
    got = evaluate.topk_mass(pair, prompts, outputs, temperature, top_p)
    mass, per = _reference(pair, prompts, outputs, temperature, top_p)
    assert set(got) == {"topk_mass", "topk_mass_per_slot"}
    assert got["topk_mass_per_slot"] == pytest.approx(per, rel=1e-5, abs=1e-7)
    assert got["topk_mass"] == pytest.approx(mass, rel=1e-5, abs=1e-7)
    assert 0.0 < mass < 1.0


def test_topk_mass_without_an_anchor_is_zero(pair):
    got = evaluate.topk_mass(pair, [[1, 2, 3]], [[4, 5, 6]], 1.0)
    assert got == {"topk_mass": 0.0, "topk_mass_per_slot": [0.0, 0.0, 0.0]}


def test_topk_mass_of_a_single_anchor(pair):
    got = evaluate.topk_mass(pair, [[1, 2, 3]], [[4, 5, 6, 7]], 0.0)
    mass, per = _reference(pair, [[1, 2, 3]], [[4, 5, 6, 7]], 0.0, 1.0)
    assert got["topk_mass_per_slot"] == pytest.approx(per, abs=1e-7)
    assert got["topk_mass"] == pytest.approx(mass, abs=1e-7)
    assert 0.0 < mass < 1.0


def test_topk_mass_builds_no_autograd_graph(pair):
    """Every LM head forward of the measurement, the one over the draft's states included, runs
    without autograd (the recipe measures a draft whose weights may still require gradients)."""
    modes = []
    hook = pair.target.lm_head.register_forward_hook(
        lambda module, args, out: modes.append(torch.is_grad_enabled()))
    try:
        evaluate.topk_mass(pair, [OUTS[0][0]], [OUTS[0][1]], 1.0)
    finally:
        hook.remove()
    assert len(modes) == 2 and not any(modes)      # the target's forward, the draft's states
