"""One decode step, eager or graphed: the same bodies, the same StepOut; and each run's
fallbacks are its own, even for engines that share a backend."""

from __future__ import annotations

import torch

from dflash2rt import get_backend
from dflash2rt.backend import Fallbacks
from dflash2rt.engine import stages
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.bodies import BAD_DRAFT, BAD_LATTICE, BAD_Q, BAD_TARGET, StepOut, pack_flags

from test_engine_graphs import ReplayAdapter, _backend, _reqs
from tiny_models import tiny_pair


def _two_steps(backend, spec: bool) -> list[StepOut]:
    """Prefill, then two decode steps through the Runner (graphed: capture + checked replay,
    then a replay): each step's device results (its ``StepOut``, seen through the Runner's
    body hook) and its one host transfer."""
    pair, reqs = tiny_pair("dflash2", block=4), _reqs((0.0, 1.0, 0.6))
    engine, clock, outs = Engine(pair, backend), {"draft": 0.0, "verify": 0.0}, []
    runner, last = engine.runner, []

    def keep(kind, block, clock, run):          # the last body's outputs: the StepOut fields
        out = run()
        if kind != "draft":
            last[:] = [StepOut.of(out)]
        return out
    runner.timer = keep
    with torch.inference_mode():
        st = runner.start(reqs, spec, 4, None, Fallbacks().report, clock)
        runner.prefill(st, [q.prompt_ids for q in reqs])
        for _ in range(2):
            step = runner.step(st, 4 if spec else 1)
            res = last[0]
            assert type(res) is StepOut and step.host == res.for_host().tolist()
            outs.append(StepOut(*(t.clone() for t in (res.accept_len, res.tokens, res.flags,
                                                      res.lens, res.anchor))))
            assert st.lens.tolist() == res.lens.tolist()           # committed by the Runner
            st.host_lens = res.lens.tolist()
    engine.close()
    return outs


def test_eager_and_graphed_steps_return_equal_step_outs():
    for spec in (True, False):
        eager = _two_steps(get_backend("cpu"), spec)
        adapter = ReplayAdapter()
        graphed = _two_steps(_backend(adapter), spec)
        assert adapter.replays >= 2
        for e, g in zip(eager, graphed):
            for name in ("accept_len", "tokens", "flags", "lens", "anchor"):
                a, b = getattr(e, name), getattr(g, name)
                assert a.dtype == b.dtype == torch.int64 and torch.equal(a, b), (spec, name)
            assert e.tokens.shape == ((3, 4) if spec else (3, 1))
            assert e.for_host().shape == (3, 2 + e.tokens.shape[1])
        if not spec:
            assert all(int(o.accept_len.abs().sum()) == 0 for o in eager)


def test_flags_are_packed_once_with_distinct_bits():
    t, f = torch.tensor([True, False]), torch.tensor([False, False])
    assert pack_flags(t).tolist() == [BAD_TARGET, 0]
    assert pack_flags(f, t, t, t).tolist() == [BAD_Q | BAD_DRAFT | BAD_LATTICE, 0]
    assert len({BAD_TARGET, BAD_Q, BAD_DRAFT, BAD_LATTICE}) == 4


def test_engines_sharing_a_backend_keep_their_run_fallbacks_apart():
    """Engine A's graphs are refused (it runs them eagerly, and says so in each of its runs);
    engine B, on the same backend and run from inside A's run (its on_tokens), captures fine:
    B never reports A's fallbacks, and A's run keeps its own after B's run ended. (A fixed
    block: an adaptive call may be planned target-only from timings, which would take
    other graphs.)"""
    pair, adapter = tiny_pair("dflash2", block=4), ReplayAdapter()
    backend = _backend(adapter)
    backend.report_fallback("standing: example")
    a, b = Engine(pair, backend), Engine(pair, backend)
    inner = []

    def run_b_first(i, ids):
        if not inner:
            inner.append(b.generate(_reqs((0.0,) * 3), block_size=4)[1])
            adapter.fail = True                   # A's captures (its steps come later) fail

    _, a_stats = a.generate(_reqs((0.0,) * 3), block_size=4, on_tokens=run_b_first)
    assert inner[0].fallbacks == ["standing: example"]
    assert a_stats.fallbacks[0] == "standing: example"
    assert any("refuses to capture" in f for f in a_stats.fallbacks[1:])
    adapter.fail = False
    _, b_again = b.generate(_reqs((0.0,) * 3), block_size=4)
    _, a_again = a.generate(_reqs((0.0,) * 3), block_size=4)
    assert b_again.fallbacks == ["standing: example"]
    assert any("refuses to capture" in f for f in a_again.fallbacks)   # its kept eager buckets
    assert backend.standing_fallbacks == ("standing: example",)


def test_a_failed_model_pass_is_in_every_run_of_every_engine_on_those_models():
    """The model pass runs once per module and backend; its failure is a fact about those
    models, reported by each run of each engine made on them (not kept on the backend)."""
    calls = []

    def failing(modules):
        calls.append(len(modules))
        raise ZeroDivisionError("fake pass")

    pair, backend = tiny_pair("dflash2", block=4), _backend(None)
    backend.model_pass = failing
    for _ in range(2):
        _, stats = Engine(pair, backend).generate(_reqs((0.0,)))
        assert [f for f in stats.fallbacks if "model pass skipped (ZeroDivisionError" in f]
    assert calls == [2] and backend.standing_fallbacks == ()
    _, other = Engine(tiny_pair("dflash2", block=4), get_backend("cpu")).generate(_reqs((0.0,)))
    assert other.fallbacks == []


def test_target_only_steps_of_an_adaptive_run_defer_the_draft_context_to_a_catch_up():
    """Adaptive runs mix target-only steps (block 1) into speculation: such a step keeps the
    draft's context hidden of its token in the side buffer and defers the K/V projection;
    ``catch_up_draft`` projects the pending positions in one batch, after which the draft cache
    equals that of a prefill of the longer sequence (the next spec step drafts from a complete
    context). Before the catch-up the deferred rows are not yet in the draft's K/V."""
    pair, reqs = tiny_pair("dflash2", block=4), _reqs((0.0, 1.0, 0.6))
    engine, pending = Engine(pair, get_backend("cpu")), 3
    runner = engine.runner
    with torch.inference_mode():
        st = runner.start(reqs, True, 4, None, Fallbacks().report, {})
        toks = [[h[0] for h in runner.prefill(st, [q.prompt_ids for q in reqs])]]
        for _ in range(pending):
            step = runner.step(st, 1)
            st.host_lens = st.lens.tolist()                       # the step's ctx_len
            toks.append([h[2] for h in step.host])
        longer = [q.prompt_ids + tuple(t[i] for t in toks[:-1]) for i, q in enumerate(reqs)]
        ref = Engine(pair, get_backend("cpu")).runner.start(reqs, True, 4, None, print, {})
        stages.prefill(pair, ref, engine.backend, longer)
        before = [b.clone() for b in st.draft_storage.k]
        stages.catch_up_draft(pair, st, pending)
    assert st.lens.tolist() == [len(p) for p in longer]
    for i, p in enumerate(longer):
        n = len(p)
        assert not torch.allclose(before[0][i, n - pending:n], ref.draft_storage.k[0][i, n - pending:n])
        for got, want in zip(st.draft_storage.k + st.draft_storage.v,
                             ref.draft_storage.k + ref.draft_storage.v):
            torch.testing.assert_close(got[i, :n], want[i, :n])


def test_settle_projects_the_deferred_context_once_and_the_next_spec_step_does_not_again():
    """``Runner.settle`` (before rows join a server's batch) projects the context that
    target-only steps deferred, as the next speculative step's catch-up would, and resets the
    count: that step then catches up nothing. With nothing deferred it does nothing."""
    pair, reqs = tiny_pair("dflash2", block=4), _reqs((0.0, 1.0))
    runs = []
    for settle in (False, True):
        runner = Engine(pair, get_backend("cpu")).runner
        with torch.inference_mode():
            st = runner.start(reqs, True, 4, None, Fallbacks().report, {})
            runner.prefill(st, [q.prompt_ids for q in reqs])
            assert runner.settle(st) == (0, 0.0)
            for _ in range(2):
                runner.step(st, 1)
                st.host_lens = st.lens.tolist()
            settled = runner.settle(st) if settle else (0, 0.0)
            step = runner.step(st, 4)
        runs.append((settled, step.deferred, [t.clone() for t in st.draft_storage.k]))
    (s0, d0, k0), (s1, d1, k1) = runs
    assert s0 == (0, 0.0) and d0 == 2                  # the spec step caught up 2 positions
    assert s1[0] == 2 and s1[1] > 0 and d1 == 0        # settled first: nothing left to do
    for a, b in zip(k0, k1):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
