"""The server's batch primitives (``serve.batching``) against their definitions, written out
here (docs/serving.md, "continuous batching"): ``allocate`` asks the Runner for ``slots``
placeholder requests of one prompt token and ``max_model_len - 1`` output tokens (prompt +
output = the model length; a length below 2 holds no output token and is refused); a
``cohort`` of k joining requests lives in slots [start, start + k) of the one storage (writes
through it land there; a cohort past the last slot is refused); ``merge`` makes one batch of
the parts in order over the whole storage (device rows concatenated, each row's sampling
parameters and row extensions built again, the extensions advanced by each row's committed
tokens) and refuses per-row lists of another length."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.errors import InvalidInputError
from dflash2rt.models.kv_cache import KVCache
from dflash2rt.serve import batching

CPU = torch.device("cpu")
VOCAB = 32
SLOTS, MAXLEN = 5, 6


def _cache(layers: int, side: bool) -> KVCache:
    """Storage of SLOTS slots whose every entry says its slot (k: s, v: 100 + s, side: 200 + s)."""
    slot = torch.arange(SLOTS, dtype=torch.float32).view(-1, 1, 1, 1)
    k = tuple(slot.expand(SLOTS, MAXLEN, 2, 3).clone() for _ in range(layers))
    v = tuple((100 + slot).expand(SLOTS, MAXLEN, 2, 3).clone() for _ in range(layers))
    s = (200 + slot.view(-1, 1, 1)).expand(SLOTS, MAXLEN, 4).clone()
    return KVCache(k, v, (s,) if side else ())


def _caches(draft: bool = True) -> batching.Caches:
    return _cache(2, False), (_cache(1, True) if draft else None)


def _req(i: int, **kw) -> Request:
    return Request((1 + i, 2 + i), SamplingParams(max_new_tokens=8, seed=50 + i, **kw), key=i)


class _Runner:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def start(self, *args):
        self.calls.append(args)
        return SimpleNamespace(target_storage="target", draft_storage="draft")


@pytest.mark.parametrize("max_model_len", [2, 3, 40])
def test_allocate_asks_for_slots_placeholders_of_the_model_length(max_model_len):
    runner = _Runner()
    engine = SimpleNamespace(runner=runner)
    report, clock = object(), {}
    got = batching.allocate(engine, True, 8, 3, max_model_len, report, clock)
    assert got == ("target", "draft")
    (template, spec, room, *rest), = runner.calls
    assert (spec, room) == (True, 8) and rest[1] is report and rest[2] is clock
    assert len(template) == 3
    for q in template:
        assert len(q.prompt_ids) == 1
        assert len(q.prompt_ids) + q.params.max_new_tokens == max_model_len


@pytest.mark.parametrize("max_model_len", [1, 0])
def test_allocate_refuses_a_length_without_an_output_token(max_model_len):
    runner = _Runner()
    with pytest.raises(InvalidInputError, match=f"max_model_len must be >= 2, got {max_model_len}"):
        batching.allocate(SimpleNamespace(runner=runner), True, 8, 3, max_model_len, None, {})
    assert runner.calls == []


@pytest.mark.parametrize("draft", [True, False])
@pytest.mark.parametrize("start,k", [(0, 2), (2, 3), (4, 1), (1, 4)])
def test_a_cohort_is_a_view_of_its_slots(draft, start, k):
    caches = _caches(draft)
    rows = [70 + i for i in range(k)]
    st = batching.cohort(caches, start, [_req(i) for i in range(k)], rows, CPU, VOCAB)
    assert st.rows == rows and st.size == k
    want = torch.arange(start, start + k, dtype=torch.float32)
    pairs = [(st.target_storage, caches[0])]
    if draft:
        pairs.append((st.draft_storage, caches[1]))
    else:
        assert st.draft_storage is None
    for view, storage in pairs:
        assert view.batch_size == k and view.max_len == MAXLEN
        assert view.num_layers == storage.num_layers and len(view.side) == len(storage.side)
        for b in (*view.k, *view.v, *view.side):
            base = b[:, 0].reshape(k, -1)[:, 0]
            assert torch.equal(base % 100, want)
        for j, (b, whole) in enumerate(zip((*view.k, *view.v, *view.side),
                                           (*storage.k, *storage.v, *storage.side))):
            b[k - 1, 1] = -1.0 - j                 # a write through the view ...
            assert torch.all(whole[start + k - 1, 1] == -1.0 - j)   # ... lands in its slot
            others = [s for s in range(SLOTS) if s != start + k - 1]
            assert not torch.any(whole[others] < 0)


@pytest.mark.parametrize("draft", [True, False])
@pytest.mark.parametrize("start,k", [(0, 6), (4, 2), (5, 1), (3, 3)])
def test_a_cohort_past_the_last_slot_is_refused(draft, start, k):
    with pytest.raises(InvalidInputError,
                       match=f"^{start + k} rows do not fit the server's {SLOTS} cache slots$"):
        batching.cohort(_caches(draft), start, [_req(i) for i in range(k)], list(range(k)),
                        CPU, VOCAB)


def _parts(caches, reqs, split):
    """A live batch of ``reqs[:split]`` in slots [0, split) and a cohort of the rest after it,
    with lengths and anchors set as a prefill would set them."""
    live = batching.cohort(caches, 0, reqs[:split], list(range(split)), CPU, VOCAB)
    join = batching.cohort(caches, split, reqs[split:], list(range(10, 10 + len(reqs) - split)),
                           CPU, VOCAB)
    for st, base in ((live, 0), (join, split)):
        n = st.size
        st.lens.copy_(torch.arange(n) + 3 * base + 4)
        st.anchor.copy_(torch.arange(n) + 20 + base)
        st.host_lens[:] = [int(x) for x in st.lens]
    return live, join


@pytest.mark.parametrize("draft", [True, False])
def test_merge_concatenates_the_parts_in_order_over_the_whole_storage(draft):
    caches = _caches(draft)
    temps = [0.0, 0.7, 1.3, 0.0]
    reqs = [_req(i, temperature=t) for i, t in enumerate(temps)]
    live, join = _parts(caches, reqs, 3)
    empty = batching.cohort(caches, 4, [], [], CPU, VOCAB)
    parts = [empty, live, empty, join, empty]
    st = batching.merge(caches, parts, reqs, [[1]] * 4, VOCAB)
    assert st.target_storage is caches[0] and st.draft_storage is caches[1]
    assert st.rows == [0, 1, 2, 10]
    assert st.lens.tolist() == [4, 5, 6, 13] and st.host_lens == [4, 5, 6, 13]
    assert st.anchor.tolist() == [20, 21, 22, 23]
    assert st.seed.tolist() == [50, 51, 52, 53] and st.key.tolist() == [0, 1, 2, 3]
    assert st.sampling.temperature.tolist() == pytest.approx(temps)
    assert st.extensions == ()


def test_merge_advances_each_rows_extensions_by_its_committed_tokens():
    caches = _caches()
    reqs = [_req(0, presence_penalty=0.5), _req(1), _req(2, frequency_penalty=0.2),
            _req(3, logprobs=1)]
    committed = [[3, 3, 7], [], [9], [4, 5, 4, 4, 0]]
    st = batching.merge(caches, _parts(caches, reqs, 2), reqs, committed, VOCAB)
    want = torch.zeros(4, VOCAB, dtype=torch.int64)
    for r, toks in enumerate(committed):
        for t, n in Counter(toks).items():
            want[r, t] = n
    assert st.procs is not None
    assert torch.equal(st.procs.counts.to(torch.int64), want)


@pytest.mark.parametrize("n_reqs,n_committed", [(3, 4), (5, 4), (4, 3), (4, 5), (3, 3)])
def test_merge_refuses_per_row_lists_of_another_length(n_reqs, n_committed):
    caches = _caches()
    reqs = [_req(i) for i in range(5)]
    parts = _parts(caches, reqs[:4], 2)
    with pytest.raises(InvalidInputError,
                       match=f"^merge: 4 rows, {n_reqs} requests and {n_committed} committed"):
        batching.merge(caches, parts, reqs[:n_reqs], [[1]] * n_committed, VOCAB)
