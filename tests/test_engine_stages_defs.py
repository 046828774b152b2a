"""The decode stages (``engine/stages.py``) against their definitions in the module's docstrings
and docs/design.md §1, each checked by a computation of its own:

- the draft forward runs over [anchor, MASK × γ] (the anchor first, then γ mask tokens);
- DFlash v1 selects the per-slot argmax of the draft logits, also for sampled rows;
- after speculative steps the draft cache holds the committed positions' context K/V, as a
  prefill of the committed sequence writes it (``commit_kv`` without deferral);
- the token at absolute position p is decided by the uniform of p whichever stage draws it: a
  target-only step's token is the first token of a prefill of the longer prompt;
- a hook that at most one row extension answers refuses two answers.

Classes of bug held: the anchor written into a mask slot; v1 sampling among more than one
candidate per slot; a speculative step that leaves the draft context to a catch-up that never
comes; a target-only step that reads the uniform of another position."""

from __future__ import annotations

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.backend import Fallbacks
from dflash2rt.engine import stages
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams

from tiny_models import tiny_pair

PROMPTS = [(1, 2, 3), (5, 9, 11, 13, 17), (7,)]


def _reqs(temps, n=12, seed=5):
    return [Request(p, SamplingParams(max_new_tokens=n, temperature=t, seed=seed,
                                      ignore_eos=True)) for p, t in zip(PROMPTS, temps)]


def _started(pair, reqs, block):
    """An eager cpu runner's batch after prefill."""
    engine = Engine(pair, get_backend("cpu"))
    st = engine.runner.start(reqs, True, block, None, Fallbacks().report, {})
    first = engine.runner.prefill(st, [q.prompt_ids for q in reqs])
    return engine, st, [h[0] for h in first]


def test_the_draft_forward_reads_the_anchor_then_masks(monkeypatch):
    pair, block = tiny_pair("dflash2", block=4, seed=2), 4
    with torch.inference_mode():
        engine, st, first = _started(pair, _reqs((0.0, 1.0, 0.5)), block)
        seen = []
        real = pair.draft.embed

        def spy(ids, *a, **k):
            seen.append(ids.clone())
            return real(ids, *a, **k)
        monkeypatch.setattr(pair.draft, "embed", spy)
        pos = stages.block_positions(st, block)
        h = stages.draft_block(pair, st, engine.backend, pos, None)
    assert len(seen) == 1
    mask = pair.draft.cfg.mask_token_id
    assert seen[0].tolist() == [[a] + [mask] * (block - 1) for a in first]
    assert h.shape[:2] == (len(PROMPTS), block - 1)


def test_dflash1_drafts_are_the_per_slot_argmax_for_sampled_rows():
    pair, block = tiny_pair("dflash1", block=8, seed=4), 8
    temps = (1.0, 1.5, 2.0)
    with torch.inference_mode():
        engine, st, _ = _started(pair, _reqs(temps), block)
        pos = stages.block_positions(st, block)
        h = stages.draft_block(pair, st, engine.backend, pos, None)
        noise = engine.backend.noise(st.seed, st.key, st.lens, block - 1)
        sel = stages.select_block(pair, st, engine.backend, h, noise)
        logits = pair.draft.logits(h, pair.target)                       # [R, γ, V]
    want = [[max(range(len(slot)), key=lambda v, s=slot: s[v]) for slot in row]
            for row in logits.tolist()]
    assert sel.draft.tolist() == want


def _committed(reqs, first, steps):
    """Each request's prompt followed by the tokens committed before its anchor."""
    seqs = [list(q.prompt_ids) + [f] for q, f in zip(reqs, first)]
    for s in steps:
        for i, h in enumerate(s.host):
            seqs[i] += h[2:3 + h[0]]
    return [tuple(s[:-1]) for s in seqs]                                 # the anchor: not yet


def test_speculative_steps_leave_the_committed_draft_context_in_the_cache():
    pair, block = tiny_pair("dflash2", block=4, seed=6), 4
    reqs = _reqs((0.0, 1.0, 0.7))
    with torch.inference_mode():
        engine, st, first = _started(pair, reqs, block)
        steps = []
        for _ in range(3):
            steps.append(engine.runner.step(st, block))
            st.host_lens = st.lens.tolist()
        longer = _committed(reqs, first, steps)
        assert st.lens.tolist() == [len(s) for s in longer]
        ref = Engine(pair, get_backend("cpu")).runner.start(reqs, True, block, None, print, {})
        stages.prefill(pair, ref, engine.backend, longer)
    for i, s in enumerate(longer):
        n = len(s)
        for got, want in zip(st.draft_storage.k + st.draft_storage.v,
                             ref.draft_storage.k + ref.draft_storage.v):
            torch.testing.assert_close(got[i, :n], want[i, :n])


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_a_target_only_token_is_the_first_token_of_the_longer_prompt(temperature):
    """The uniform that decides a position is keyed by that position: a target-only step's
    token after prompt + t_1..t_k equals the first token of a run on that longer prompt (same
    seed and request key), for every k."""
    engine = Engine(tiny_pair("dflash2", block=4, seed=8), get_backend("cpu"))
    prompt = (4, 9, 2)

    def run(p, n):
        q = Request(p, SamplingParams(max_new_tokens=n, temperature=temperature, seed=21,
                                      ignore_eos=True))
        return engine.generate([q], spec=False)[0][0].token_ids

    out = run(prompt, 6)
    for k in range(1, 6):
        assert run(prompt + tuple(out[:k]), 1) == [out[k]], k


def test_a_hook_only_one_extension_answers_refuses_two():
    assert stages._only(iter([None, None]), "x") is None
    assert stages._only(iter([None, 3, None]), "x") == 3
    with pytest.raises(AssertionError, match="two row extensions give the x"):
        stages._only(iter([1, None, 2]), "x")
