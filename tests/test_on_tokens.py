"""What ``on_tokens(i, ids)`` receives: the streaming callback of ``Engine.generate``.

On the stop cases of ``test_stops`` (32 requests that finish at different steps, so the batch
shrinks and its rows move), spec with a fixed block, adaptive and target-only, greedy and
sampled, plus constrained requests that reach a dead end:

- ``i`` is the request's index in the list given, whatever row it has in the batch;
- each call brings at least one token, and the chunks of request i, joined, are exactly its
  output's ``token_ids`` (nothing past a stop, a constraint's end or ``max_new_tokens``,
  nothing twice, nothing retracted);
- the first call is the prefill's one token, and then one call per step at most, each no longer
  than that step can commit (its block + 1): tokens stream as steps commit them;
- the ids are plain ints in a list the caller owns (changing it changes no output).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from dflash2rt import get_backend
from dflash2rt.constraints import TokenAutomaton
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams

from test_stops import BLOCK, TOK, _requests, pair  # noqa: F401  (the pair fixture)
from tiny_models import fixed_policy

MODES = {"spec": dict(block_size=BLOCK), "adaptive": dict(block_size=None),
         "target-only": dict(spec=False)}


class Recorder:
    def __init__(self):
        self.calls: list[tuple[int, list[int]]] = []

    def __call__(self, i, ids):
        assert isinstance(ids, list) and all(type(t) is int for t in ids), ids
        self.calls.append((i, list(ids)))
        ids.append(-12345)                 # the caller's list: must not reach the output
        ids.clear()


def _check(requests, outs, stats, calls, most):
    chunks = defaultdict(list)
    for i, ids in calls:
        assert 0 <= i < len(requests)
        assert ids, f"request {i}: an empty call"
        chunks[i].append(ids)
    for i, o in enumerate(outs):
        got = chunks.get(i, [])
        assert [t for c in got for t in c] == o.token_ids, f"request {i}"
        if o.token_ids:
            assert got[0] == o.token_ids[:1], f"request {i}: the prefill's token first"
        assert all(len(c) <= most for c in got), f"request {i}: {list(map(len, got))}"
        assert len(got) <= stats.steps + 1


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("mode", list(MODES))
def test_chunks_join_to_the_output_of_the_request_they_name(pair, mode, temperature):  # noqa: F811
    engine = Engine(pair, get_backend("cpu"))
    engine.policy = fixed_policy(BLOCK)
    reqs = _requests(temperature)
    rec = Recorder()
    outs, stats = engine.generate(reqs, on_tokens=rec, **MODES[mode])
    plain, _ = engine.generate(_requests(temperature), **MODES[mode])
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]   # nothing leaked back
    most = 1 if mode == "target-only" else 2 * BLOCK + 1
    _check(reqs, outs, stats, rec.calls, most)
    finished = {o.finish_reason for o in outs}
    assert {"stop_token", "stop_string", "length"} <= finished
    if mode != "target-only":
        assert max(len(c) for _, c in rec.calls) > 1          # whole accepted runs stream


def test_a_constraints_end_is_streamed_and_nothing_after_it(pair):  # noqa: F811
    """Constrained requests whose automaton ends (a dead end) mid-block."""
    engine = Engine(pair, get_backend("cpu"))
    v = pair.target.cfg.vocab_size
    reqs = []
    for n in (1, 3, 6, 10):             # any n tokens of the vocabulary, then nothing
        table = [[k + 1] * v for k in range(n)] + [[-1] * v]
        auto = TokenAutomaton(np.array(table), 0)
        reqs.append(Request((1, 2), SamplingParams(max_new_tokens=30, constraint=auto)))
    rec = Recorder()
    outs, stats = engine.generate(reqs, on_tokens=rec, block_size=BLOCK)
    assert [len(o.token_ids) for o in outs] == [1, 3, 6, 10]
    assert all(o.finish_reason == "constraint" for o in outs)
    _check(reqs, outs, stats, rec.calls, BLOCK + 1)
