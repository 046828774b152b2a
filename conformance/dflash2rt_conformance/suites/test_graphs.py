"""Graph conformance: replay == eager bit for bit — across batch buckets, after the pool is
reused, on a second stream, with mixed greedy / sampled batches (docs/design.md, "Graphs"), for
the target-only step, and when one engine replays its kept graphs in later generate() calls.

These tests run when the backend captures graphs (``backend.graph_adapter`` is set; the engine
then replays its steps per batch-size bucket of ``dflash2rt.engine.runner.BUCKETS``). Eager mode
is the same backend with the adapter removed. They compare Engine outputs (token ids, accept
lengths) of graph mode with eager mode; a backend without graphs skips them with that reason.

Proof of replay: every graph-mode run must show, in its run stats, that each bucket it used was
captured, passed the runner's post-capture check (one replay equal to the eager warm-up) and
was replayed; a refused capture or a differing replay runs that bucket eagerly, which would
compare eager with eager, so it fails the test naming the reason. Per-test replay counts are
recorded as level metrics.

Adaptive runs (the engine's default) compare under one schedule state: every engine here takes
a policy over the process's measured table (``dflash2rt.api.measured_table``) that learns nothing between calls (``track=0``),
so graph mode and eager mode choose the same block sizes from the same outcomes.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

import pytest
import torch

from dflash2rt.engine.engine import Engine
from dflash2rt.engine.runner import BUCKETS
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.api import measured_table
from dflash2rt.engine.policy.adaptive import AdaptivePolicy
from dflash2rt.watermark import WatermarkKey
from dflash2rt_conformance import models
from dflash2rt_conformance.capability import skip_without_fp64

pytestmark = pytest.mark.dflash2rt_level("graphs")


class _Graphs:
    """The backend's graph mode: its buckets, and eager() to run without replay."""

    def __init__(self, backend) -> None:
        self.backend, self.buckets = backend, BUCKETS

    @contextmanager
    def eager(self):
        adapter, self.backend.graph_adapter = self.backend.graph_adapter, None
        try:
            yield
        finally:
            self.backend.graph_adapter = adapter


@pytest.fixture(scope="module")
def graphs(backend):
    if getattr(backend, "graph_adapter", None) is None:
        pytest.skip(f"backend {backend.name} captures no graphs (backend.graph_adapter is None)"
                    ", nothing to replay")
    return _Graphs(backend)


class _Proof:
    """Checks each graph-mode run's ``stats.graphs`` and counts its replays per graph × bucket."""

    def __init__(self) -> None:
        self.replays: Counter[tuple[str, int]] = Counter()

    def check(self, stats, case: str) -> None:
        eager = [f"{name} bucket {size} ran eagerly {b['eager']}x and replayed {b['replays']}x"
                 f" ({b['refused'] or 'not captured'})"
                 for name, buckets in stats.graphs.items() for size, b in buckets.items()
                 if b["eager"] or not b["captured"] or not b["replays"]]
        assert not eager, f"[graphs case={case}] graph mode did not replay every bucket it " \
            f"used (eager compared with eager proves nothing): {'; '.join(eager)}"
        oversize = any("exceeds the largest graph bucket" in f for f in stats.fallbacks)
        assert stats.graphs or not stats.steps or oversize, \
            f"[graphs case={case}] graph mode ran {stats.steps} steps without a replay " \
            f"(fallbacks: {stats.fallbacks})"
        for name, buckets in stats.graphs.items():
            for size, b in buckets.items():
                self.replays[name, size] += b["replays"]


@pytest.fixture
def proof(graphs, results, request):
    """Each test's graph-mode runs, checked; their replays go to the level's metrics."""
    p = _Proof()
    yield p
    results.metric("graphs", f"replays in {request.node.name}",
                   {"total": sum(p.replays.values()),
                    **{f"{name} @{size}": n for (name, size), n in sorted(p.replays.items())}})


@pytest.fixture(scope="module")
def pair(backend):
    dtype = torch.float32 if torch.float32 in backend.dtypes else backend.dtypes[0]
    return models.pair_on(models.tiny_pair(11, dtype, vocab=61), backend.device)


def _requests(n, sampled=lambda i: i % 2 == 1, new=10):
    return [Request((1 + i % 7, 2 + i % 5, 3), SamplingParams(
        max_new_tokens=new, temperature=1.0 if sampled(i) else 0.0, seed=i, ignore_eos=True),
        key=i) for i in range(n)]


def _run(pair, backend, reqs, spec=True, proof=None, case="", watermark=None, engine=None):
    """Tokens and accept histogram of one run; with ``proof``, a graph-mode run that must
    replay every bucket it uses."""
    outs, stats = (engine or _engine(pair, backend)).generate(reqs, spec=spec,
                                                               watermark=watermark)
    if proof is not None:
        proof.check(stats, case)
    return [o.token_ids for o in outs], list(stats.accept_hist)


def _engine(pair, backend) -> Engine:
    """An engine whose adaptive schedule learns nothing between calls (module docstring)."""
    table = measured_table(pair, backend.device)           # the process's, as the api's
    engine = Engine(pair, backend, table=table)
    engine.policy = AdaptivePolicy.measured(pair.draft.cfg.block_size, table, track=0.0)
    return engine


def _eager(pair, backend, graphs, reqs, spec=True, watermark=None):
    with graphs.eager():
        return _run(pair, backend, reqs, spec, watermark=watermark)


def test_replay_equals_eager_across_buckets(graphs, pair, backend, proof):
    for n in sorted({1, *[int(b) for b in graphs.buckets], max(graphs.buckets) + 1}):
        reqs = _requests(n)
        got = _run(pair, backend, reqs, proof=proof, case=f"bucket-{n}")
        assert got == _eager(pair, backend, graphs, reqs), \
            f"[graphs case=bucket-{n}] replay differs from eager"


def test_replay_equals_eager_after_pool_reuse(graphs, pair, backend, proof):
    big, small = _requests(max(graphs.buckets)), _requests(1)
    first = _run(pair, backend, small, proof=proof, case="pool-reuse")
    _run(pair, backend, big, proof=proof, case="pool-reuse")  # other buckets reuse the pool
    again = _run(pair, backend, small, proof=proof, case="pool-reuse")
    assert again == first == _eager(pair, backend, graphs, small), \
        "[graphs case=pool-reuse] a replay after other buckets ran differs"


def test_replay_on_a_second_stream(graphs, pair, backend, proof):
    mod = torch.get_device_module(backend.device) if backend.device.type != "cpu" else None
    if mod is None or not hasattr(mod, "Stream"):
        pytest.skip(f"device {backend.device} has no streams")
    reqs = _requests(3)
    with mod.stream(mod.Stream()):
        side = _run(pair, backend, reqs, proof=proof, case="second-stream")
    assert side == _eager(pair, backend, graphs, reqs), "[graphs case=second-stream] differs"


def test_mixed_greedy_and_sampled_batch(graphs, pair, backend, proof):
    for pattern in (lambda i: False, lambda i: True, lambda i: i % 3 == 0):
        reqs = _requests(5, pattern)
        got = _run(pair, backend, reqs, proof=proof, case="mixed-greedy-sampled")
        assert got == _eager(pair, backend, graphs, reqs), \
            "[graphs case=mixed-greedy-sampled] replay differs from eager"


def test_target_only_replay_equals_eager(graphs, pair, backend, proof):
    """Target-only decoding is captured as well (forward + sample + commit per bucket)."""
    for n in (1, 3, 5):
        reqs = _requests(n)
        got = _run(pair, backend, reqs, False, proof=proof, case=f"target-only-{n}")
        assert got == _eager(pair, backend, graphs, reqs, False), \
            f"[graphs case=target-only-{n}] replay differs from eager"


def test_kept_graphs_replay_equals_eager_in_later_calls(graphs, pair, backend, proof):
    """One Engine keeps its graphs and caches across generate() calls: later calls with other
    batch sizes, lengths and modes replay them over stale cache rows (or outgrow them and
    capture anew), and every call still equals eager."""
    with _engine(pair, backend) as engine:
        for n, new, spec in ((3, 10, True), (1, 6, True), (3, 12, False), (3, 8, True),
                             (5, 10, True), (2, 7, False), (2, 12, True)):
            outs, stats = engine.generate(_requests(n, new=new), spec=spec)
            case = f"kept-{n}x{new}-{'spec' if spec else 'target-only'}"
            proof.check(stats, case)
            got = [o.token_ids for o in outs], list(stats.accept_hist)
            assert got == _eager(pair, backend, graphs, _requests(n, new=new), spec), \
                f"[graphs case={case}] replay with kept graphs differs from eager"


def test_watermarked_replay_equals_eager(graphs, pair, backend, proof):
    """Watermarked steps are captured too: the key's words and the watermark's state (window,
    record, count) are graph inputs. One engine replays the same graphs under two keys, in
    both modes, on mixed greedy / sampled batches; each run equals eager under its own key."""
    skip_without_fp64(backend)
    keys = [WatermarkKey(bytes(range(i, i + 32))) for i in (0, 1)]
    with _engine(pair, backend) as engine:
        for key, spec, n in ((keys[0], True, 5), (keys[1], True, 5), (keys[0], False, 3),
                             (keys[1], True, 2)):
            reqs = _requests(n, lambda i: i % 3 != 0)
            case = f"watermark-{keys.index(key)}-{'spec' if spec else 'target-only'}-{n}"
            got = _run(pair, backend, reqs, spec, proof, case, key, engine)
            assert got == _eager(pair, backend, graphs, reqs, spec, key), \
                f"[graphs case={case}] replay differs from eager"

