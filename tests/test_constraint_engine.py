"""Constrained requests through the engine: on the bundled pair, the automaton that
allows only digits and a closing bracket, spec on and off — identical tokens at T = 0, every
emitted token allowed at T = 0 and T = 1, logprobs equal; dead ends finish with "constraint";
generic hooks (host masks, also under speculation); graph mode runs constrained batches eagerly and says so."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.backend import TorchOpsBackend
from dflash2rt.bundled import bundled_path
from dflash2rt.constraints import TokenAutomaton
from dflash2rt.constraints.regex import CharDFA
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.policy.adaptive import AdaptivePolicy
from dflash2rt.api import measured_table
from dflash2rt.engine.extensions import EAGER_PROCS
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.errors import ConstraintError, InvalidInputError
from dflash2rt.models.pair import load_pair

from test_engine_graphs import ReplayAdapter
from tiny_models import tiny_pair

DIGITS = r"[0-9]+\]"


@pytest.fixture(scope="module")
def bundled():
    root = bundled_path("stdlib-code")
    pair = load_pair(root / "target", root / "draft")
    prompts = json.loads((root / "heldout_prompts.json").read_text(encoding="utf-8"))
    ids = [tuple(pair.tokenizer.encode(p["prompt"])[-48:]) for p in prompts[:3]]
    # and one open subscript, whose natural end is "]": the closing / dead-end path must be
    # exercised whatever the held-out prompts' digit runs do (the pair is retrained at times)
    ids.append(tuple(pair.tokenizer.encode("        return self.args[")))
    return Engine(pair, get_backend("cpu")), ids


def _walk(a: TokenAutomaton, tokens) -> int:
    """The state after ``tokens``; fails on a forbidden one."""
    s = a.initial()
    for t in tokens:
        assert a.allowed(s)[t], f"token {t} is not allowed at state {s}"
        s = a.advance(s, t)
    return s


def _digits(engine: Engine, eos: bool = True) -> TokenAutomaton:
    pair = engine.pair
    return TokenAutomaton.from_regex(DIGITS, pair.tokenizer, pair.target.cfg.vocab_size,
                                     eos=pair.eos_token_ids if eos else ())


@pytest.mark.parametrize("eos", [True, False], ids=["with-eos", "dead-end"])
def test_greedy_spec_equals_target_only_and_every_token_is_allowed(bundled, eos):
    eng, ids = bundled
    a = _digits(eng, eos)
    reqs = [Request(p, SamplingParams(max_new_tokens=40, constraint=a, logprobs=3))
            for p in ids]
    ref, _ = eng.generate(reqs, spec=False)
    for block in (8, None):
        got, stats = eng.generate(reqs, spec=True, block_size=block)
        assert [o.token_ids for o in got] == [o.token_ids for o in ref]
        assert stats.syncs == stats.steps and stats.constraint_host_masks == 0
        for g, r in zip(got, ref):
            assert g.finish_reason == r.finish_reason
            assert g.logprobs == pytest.approx(r.logprobs, abs=1e-4)
            assert all(np.isfinite(g.logprobs))              # each token allowed: p > 0
    for o in ref:
        s = _walk(a, o.token_ids)
        if o.finish_reason == "constraint":                  # ends on "…]" with nothing after
            assert not eos and a.dead[s] and o.text.endswith("]")
        if eos:
            assert o.finish_reason in ("stop_token", "length")
    assert any(o.text.endswith("]") for o in ref), [o.text for o in ref]


def test_sampled_tokens_are_all_allowed_spec_and_target_only(bundled):
    eng, ids = bundled
    a = _digits(eng)
    reqs = [Request(p, SamplingParams(max_new_tokens=30, temperature=1.0, seed=s,
                                      ignore_eos=True, constraint=a))
            for s, p in enumerate(ids * 2)]
    for spec in (True, False):
        outs, _ = eng.generate(reqs, spec=spec, block_size=8 if spec else None)
        for o in outs:
            s = _walk(a, o.token_ids)
            assert o.finish_reason in ("constraint", "length")
            if o.finish_reason == "constraint":          # ignore_eos: EOS leads to the end
                assert a.dead[s]


def test_state_that_changes_every_token_is_followed_inside_blocks(bundled):
    """Even ids, then odd ids, alternating: every verify row's mask differs from the row
    before it, so a block masked with row 0's state would emit a forbidden token (the host
    walk raises) or differ from target-only decoding."""
    eng, ids = bundled
    v = eng.pair.target.cfg.vocab_size
    t = np.full((2, v), -1)
    t[0, 0::2], t[1, 1::2] = 1, 0
    a = TokenAutomaton(t)
    reqs = [Request(p, SamplingParams(max_new_tokens=40, constraint=a)) for p in ids]
    ref, _ = eng.generate(reqs, spec=False)
    got, stats = eng.generate(reqs, spec=True, block_size=8)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert stats.num_accepted_tokens > 0
    for o in got:
        assert all(tok % 2 == i % 2 for i, tok in enumerate(o.token_ids))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_side_proposes_what_the_constraint_allows(bundled, monkeypatch, temperature):
    """The engine's draft side under a constraint: the walk gets the batch's automaton
    (``ConstraintBatch.walk``) and slot 0's candidates come from the committed state, so at
    every slot where some candidate is allowed (after the path so far) the draft is an allowed
    one, and q puts no mass on a forbidden candidate there. Parity automaton: the allowed set
    flips at every token, so a walk that keeps the committed state fails."""
    from dflash2rt.engine import stages
    eng, ids = bundled
    v = eng.pair.target.cfg.vocab_size
    t = np.full((2, v), -1)
    t[0, 0::2], t[1, 1::2] = 1, 0
    seen, real = [], stages.ops_selector.select

    def spy(*args, mask=None, **kw):
        start = None if mask is None else mask.state.clone()
        out = real(*args, mask=mask, **kw)
        seen.append((start, out))
        return out
    monkeypatch.setattr(stages.ops_selector, "select", spy)
    a = TokenAutomaton(t)                                  # one automaton: table offset 1
    reqs = [Request(p, SamplingParams(max_new_tokens=24, temperature=temperature, seed=2,
                                      constraint=a)) for p in ids]
    _, stats = eng.generate(reqs, spec=True, block_size=8)
    assert seen and all(start is not None for start, _ in seen)
    checked = 0
    for start, out in seen:
        for r in range(out.draft.shape[0]):
            s = int(start[r]) - 1                          # batch table: state 0 is free
            for e in range(out.draft.shape[1]):
                cand = out.candidates[r, e].tolist()
                ok = [t[s, c] >= 0 for c in cand]
                if not any(ok):
                    break
                d = int(out.draft[r, e])
                assert t[s, d] >= 0, f"slot {e}: draft {d} forbidden at state {s}"
                assert all(float(out.q[r, e, i]) == 0.0 for i in range(len(cand)) if not ok[i])
                checked += 1
                s = int(t[s, d])
    assert checked >= stats.num_draft_tokens // 2 and stats.num_accepted_tokens > 0


def test_unconstrained_rows_of_a_mixed_batch_are_unchanged(bundled):
    eng, ids = bundled
    plain = Request(ids[1], SamplingParams(max_new_tokens=20))
    both, _ = eng.generate([Request(ids[0], SamplingParams(max_new_tokens=20,
                                                           constraint=_digits(eng))), plain],
                           spec=True, block_size=8)
    alone, _ = eng.generate([plain], spec=True, block_size=8)
    assert both[1].token_ids == alone[0].token_ids


class DigitsHook:
    """A generic (host) hook: the same law as a token automaton, through the Python contract."""

    def __init__(self, a: TokenAutomaton):
        self.a = a

    def initial(self):
        return ("state", self.a.initial())

    def allowed(self, state):
        return torch.from_numpy(np.array(self.a.allowed(state[1])))

    def advance(self, state, token):
        return ("state", self.a.advance(state[1], token))


class CompleteHook(DigitsHook):
    """A generic hook that says where its output is complete."""

    def accepting(self, state):
        return self.a.accepting(state[1])


class NeverCompleteHook(DigitsHook):
    def accepting(self, state):
        return False


@pytest.mark.parametrize("spec", [False, True])
def test_a_dead_end_says_whether_the_output_is_complete(bundled, spec):
    """A request whose constraint allows no more token ends "constraint" only where the hook
    says the output is a match there; a hook that cannot say, or says no, ends
    "constraint_unsatisfiable" — never as if matched. Same tokens either way."""
    eng, ids = bundled
    a = _digits(eng, eos=False)                      # "…]" is a dead end, and a full match
    runs = {}
    for name, make in (("auto", lambda: a), ("complete", lambda: CompleteHook(a)),
                       ("plain", lambda: DigitsHook(a)), ("never", lambda: NeverCompleteHook(a))):
        reqs = [Request(p, SamplingParams(max_new_tokens=30, constraint=make())) for p in ids]
        runs[name], _ = eng.generate(reqs, spec=spec, block_size=8 if spec else None)
    tokens = [o.token_ids for o in runs["auto"]]
    ended = [i for i, o in enumerate(runs["auto"]) if o.finish_reason != "length"]
    assert ended, [o.text for o in runs["auto"]]
    for name, want in (("auto", "constraint"), ("complete", "constraint"),
                       ("plain", "constraint_unsatisfiable"),
                       ("never", "constraint_unsatisfiable")):
        assert [o.token_ids for o in runs[name]] == tokens, name
        for i in ended:
            o = runs[name][i]
            assert o.finish_reason == want, (name, o.text)
            assert CharDFA(DIGITS).matches(o.text)         # the same (complete) text


def test_generic_hook_runs_target_only_with_counted_host_masks(bundled):
    eng, ids = bundled
    a = _digits(eng)
    want, _ = eng.generate([Request(p, SamplingParams(max_new_tokens=25, constraint=a))
                            for p in ids], spec=False)
    hooks = [Request(p, SamplingParams(max_new_tokens=25, constraint=DigitsHook(a)))
             for p in ids]
    got, stats = eng.generate(hooks, spec=False)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert stats.syncs == stats.steps and 0 < stats.constraint_host_masks <= stats.steps + 2


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("block", [8, None])
def test_generic_hook_under_speculation_matches_the_automaton(bundled, temperature, block):
    """A generic hook in speculative decoding: its verify rows are masked from the host (row j
    with the hook's state after d_1..d_j), so it gives the automaton's tokens exactly — the
    same masks, the same noise — greedy and sampled, fixed and adaptive blocks; the extra
    round trip per speculative step is counted in syncs and constraint_host_masks. Sampled,
    the automaton's drafts are masked at every slot and the hook's at slot 0 only (its later
    states are on the host), so the proposals and the tokens differ; every token must still
    be one the automaton allows along the output."""
    eng, ids = bundled
    a = _digits(eng)
    kw = dict(max_new_tokens=25, temperature=temperature, seed=4)
    want, wstats = eng.generate([Request(p, SamplingParams(**kw, constraint=a))
                                 for p in ids], spec=True, block_size=8)
    hooks = [Request(p, SamplingParams(**kw, constraint=DigitsHook(a))) for p in ids]
    if block is None:        # adaptive, never planned target-only (the test needs spec steps)
        eng = Engine(eng.pair, eng.backend)
        eng.policy = AdaptivePolicy.measured(eng.pair.draft.cfg.block_size,
                                             measured_table(eng.pair, eng.backend.device), track=0.0)
    got, stats = eng.generate(hooks, spec=True, block_size=block)
    if block == 8 and temperature == 0:
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        assert [o.finish_reason for o in got] == [o.finish_reason for o in want]
    if temperature == 0:
        tonly, _ = eng.generate(hooks, spec=False)
        assert [o.token_ids for o in got] == [o.token_ids for o in tonly]
    for o in got + want:
        s = a.initial()
        for t in o.token_ids:
            assert a.allowed(s)[t], f"token {t} of {o.token_ids} is not allowed"
            s = a.advance(s, t)
    spec_steps = stats.steps - stats.block_sizes.get(1, 0)
    assert spec_steps > 0 and stats.syncs == stats.steps + spec_steps    # (not calibration)
    assert stats.constraint_host_masks >= spec_steps


def test_graph_mode_runs_constrained_batches_eagerly_and_reports_it():
    pair = tiny_pair("dflash2", block=4)
    v = pair.target.cfg.vocab_size
    a = TokenAutomaton.token_set(range(3, v, 3), v)
    reqs = [Request((1, 2, 3), SamplingParams(max_new_tokens=12, temperature=t, seed=1,
                                              constraint=a)) for t in (0.0, 1.0)]
    be = TorchOpsBackend("cpu-graphs", "cpu", (torch.float32, torch.float64))
    be.graph_adapter = ReplayAdapter()
    got, stats = Engine(pair, be).generate(reqs, block_size=4)
    ref, _ = Engine(pair, get_backend("cpu")).generate(reqs, block_size=4)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert EAGER_PROCS in stats.fallbacks
    assert all(t % 3 == 0 for o in got for t in o.token_ids)


def test_api_and_cli_take_a_regex(bundled):
    import dflash2rt
    from test_api import _cli
    eng, _ = bundled
    res = dflash2rt.run(eng.pair, "cpu", prompts=["x = [1, 2, "], regex=DIGITS,
                        max_new_tokens=12)
    assert CharDFA(DIGITS).matches(res.texts[0]) or (
        res.outputs[0].finish_reason == "length" and res.texts[0].isdigit()), res.texts
    with pytest.raises(InvalidInputError, match="not both"):
        dflash2rt.run(eng.pair, "cpu", prompts=["x"], regex=DIGITS,
                      constraint=_digits(eng))
    with pytest.raises(ConstraintError, match="unclosed"):
        dflash2rt.run(eng.pair, "cpu", prompts=["x"], regex="[0-9")
    out = _cli("run", "--backend", "cpu", "--prompt", "x = [1, 2, ", "--regex", DIGITS,
               "--max-new-tokens", "12", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["tokens"] == res.tokens


@pytest.mark.parametrize("spec", [False, True])
def test_a_generic_hook_beside_plain_and_automaton_rows(bundled, spec):
    """One batch holding a generic hook's row, an unconstrained row and a token automaton's
    row: each row gives the tokens it gives alone. The host builds masks for the hook's row
    only; the others are left to the device (the automaton) or unmasked (plain)."""
    eng, ids = bundled
    a = _digits(eng)
    kw = dict(max_new_tokens=20)
    reqs = [Request(ids[0], SamplingParams(**kw, constraint=DigitsHook(a))),
            Request(ids[1], SamplingParams(**kw)),
            Request(ids[3], SamplingParams(**kw, constraint=a)),
            Request(ids[2], SamplingParams(**kw, constraint=DigitsHook(a)))]
    block = 8 if spec else None
    mixed, _ = eng.generate(reqs, spec=spec, block_size=block)
    for q, got in zip(reqs, mixed):
        alone, _ = eng.generate([q], spec=spec, block_size=block)
        assert (got.token_ids, got.finish_reason) == (alone[0].token_ids,
                                                      alone[0].finish_reason)
    s = a.initial()
    for t in mixed[0].token_ids:
        assert a.allowed(s)[t]
        s = a.advance(s, t)


@pytest.mark.parametrize("spec", [False, True])
def test_host_masks_are_counted_once_per_round_trip(bundled, spec):
    """Generic hooks: one host→device mask copy for the first token, one after every step
    but the last (the next token's), and with speculation one more per speculative step (the
    verify rows' masks, after the drafts came back) — exactly, not at most."""
    eng, ids = bundled
    a = _digits(eng)
    reqs = [Request(p, SamplingParams(max_new_tokens=17, constraint=DigitsHook(a)))
            for p in ids]
    _, stats = eng.generate(reqs, spec=spec, block_size=8 if spec else None)
    spec_steps = stats.steps - stats.block_sizes.get(1, 0) if spec else 0
    assert stats.steps > 1
    assert stats.constraint_host_masks == 1 + stats.steps + spec_steps
    assert stats.syncs == stats.steps + spec_steps
