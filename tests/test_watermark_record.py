"""The watermark's record of used contexts, through the engine: what it holds after every step,
and what it changes in the output.

- After each step (spec with a fixed block, adaptive, target-only; eager and graph replay; a
  batch whose rows finish at different steps, so rows move), each running row's record holds
  exactly the contexts of its request's committed positions, in order, the first token's
  included, and its window the last tokens: checked against contexts recomputed from the
  prompt and the output.
- Under one key the seed matters only at repeated contexts: two seeds give the same tokens up
  to the first position whose context repeats an earlier one, and differ somewhere after it
  (the repeated positions draw with the seeded noise).
"""

from __future__ import annotations

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.backend import TorchOpsBackend
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.watermark import WatermarkKey
from dflash2rt.watermark.values import context_hash

from test_engine_graphs import ReplayAdapter
from tiny_models import fixed_policy, tiny_pair

KEY = WatermarkKey(bytes(range(7, 39)))
WIDTH = 4
PROMPTS = [(1, 2), (3, 4, 5, 6, 7), (9,), (2, 2, 2, 2)]
MODES = {"block-4": dict(block_size=4), "adaptive": dict(block_size=None),
         "target-only": dict(spec=False)}


def contexts(prompt, out) -> list[int]:
    """The context hash of each generated position (the WIDTH tokens before it, -1 before the
    start)."""
    seq = [-1] * WIDTH + list(prompt) + list(out)
    n = len(prompt) + WIDTH
    windows = torch.tensor([seq[n + t - WIDTH:n + t] for t in range(len(out))],
                           dtype=torch.int64).view(-1, WIDTH)
    return context_hash(windows).tolist()


def _engine(graphs: bool) -> Engine:
    if graphs:
        be = TorchOpsBackend("cpu-graphs", "cpu", (torch.float32, torch.float64))
        be.graph_adapter = ReplayAdapter()
    else:
        be = get_backend("cpu")
    engine = Engine(tiny_pair("dflash2", block=4, seed=5), be)
    engine.policy = fixed_policy(4)
    return engine


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("mode", list(MODES))
def test_each_rows_record_is_its_committed_contexts_after_every_step(monkeypatch, mode, graphs):
    engine = _engine(graphs)
    reqs = [Request(p, SamplingParams(max_new_tokens=n, temperature=t, seed=3, ignore_eos=True))
            for p, n, t in zip(PROMPTS, (9, 23, 14, 30), (1.0, 0.4, 1.0, 0.0))]
    checked, got = [], {i: [] for i in range(len(reqs))}
    real = engine.runner.step

    def spy(st, block, *a, **k):           # before each step: the live rows after the last
        wm = st.wm
        for r, i in enumerate(st.rows):     # (finished ones dropped, their record ran on)
            want = contexts(reqs[i].prompt_ids, got[i])
            used = int(wm.used[r])
            assert used == len(got[i]), (i, used, len(got[i]))
            assert wm.record[r, :used].tolist() == want, f"request {i} after a step"
            tail = ([-1] * WIDTH + list(reqs[i].prompt_ids) + got[i])[-WIDTH:]
            assert wm.window[r].tolist() == tail, f"request {i}'s window"
            checked.append(i)
        return real(st, block, *a, **k)
    monkeypatch.setattr(engine.runner, "step", spy)
    outs, stats = engine.generate(reqs, watermark=KEY, on_tokens=lambda i, ids: got[i].extend(ids),
                                  **MODES[mode])
    assert [len(o.token_ids) for o in outs] == [9, 23, 14, 30]
    assert set(checked) == {0, 1, 2, 3} and len(checked) >= stats.steps
    if graphs:
        runs = [c for g in stats.graphs.values() for c in g.values()]
        assert sum(c["replays"] for c in runs) > 0 and sum(c["eager"] for c in runs) == 0


@pytest.mark.parametrize("mode", ["block-4", "target-only"])
def test_the_seed_matters_only_from_the_first_repeated_context(mode):
    engine = _engine(False)

    def run(seed):
        reqs = [Request(p, SamplingParams(max_new_tokens=48, temperature=0.5, seed=seed,
                                          ignore_eos=True)) for p in PROMPTS]
        return [o.token_ids for o in engine.generate(reqs, watermark=KEY, **MODES[mode])[0]]

    a, b = run(1), run(2)
    diverged = 0
    for prompt, x, y in zip(PROMPTS, a, b):
        ctx = contexts(prompt, x)
        first = next((t for t in range(len(ctx)) if ctx[t] in ctx[:t]), len(ctx))
        assert x[:first] == y[:first], f"prompt {prompt}: seeds differ before position {first}"
        diverged += x != y
    assert diverged, "no request's repeated contexts changed with the seed"
