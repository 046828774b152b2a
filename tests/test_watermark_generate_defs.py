"""The watermark's device state (``watermark/generate.py``) against its definitions, written anew
from the module's docstrings over plain Python lists: a position's context is the hash of the
``width`` tokens before it (-1 before the start, prompt included); the record holds the contexts
of the committed generated positions in order and ``used`` counts them; a slot is fresh when its
context is neither recorded nor an earlier slot's; the walk's slot j draws ``draw_sparse`` under
subkey A at the context of its path where that is fresh and the row is not greedy, else takes the
ordinary draw; record capacities round up to ``CAPACITY_STEP``.

Classes of bug held: a record capacity smaller than the positions it must hold; a record entry
past ``used`` (stale or never written) counted as used, or one written by a commit; a walk that
reuses the keyed values of an earlier slot's context or moves the keyed draw off its winner;
the key's subkey words in the batch's repr."""

from __future__ import annotations

import random

import torch

from dflash2rt.watermark import WatermarkKey
from dflash2rt.watermark.generate import CAPACITY_STEP, WatermarkBatch, capacity_for
from dflash2rt.watermark.keys import words_of
from dflash2rt.watermark.sampler import draw_sparse
from dflash2rt.watermark.values import context_hash

KEY = WatermarkKey(bytes(range(40, 72)))


def ctx_of(seq: list[int], width: int) -> int:
    """The context of the position after ``seq``: its last ``width`` tokens, -1 before 0."""
    window = ([-1] * width + list(seq))[-width:]
    return int(context_hash(torch.tensor([window], dtype=torch.int64))[0])


def test_capacity_is_the_least_multiple_of_the_step_that_holds_the_positions():
    for n in list(range(0, 3 * CAPACITY_STEP + 3)) + [10_000, 65_537]:
        want = CAPACITY_STEP
        while want < n:
            want += CAPACITY_STEP
        assert capacity_for(n) == want, n


def test_marks_and_commits_follow_the_definitions_over_random_sequences():
    """Small vocabulary and width 2, so contexts repeat within and across blocks: after every
    commit the record's first ``used`` entries are the committed positions' contexts, entries
    past them are untouched, the window is the last tokens; every slot's freshness is the
    definition's."""
    rnd = random.Random(7)
    width, cap = 2, 64
    prompts = [(1,), (2, 1, 2), (), (3, 3)]
    wm = WatermarkBatch.build(KEY, prompts, cap, width, "cpu")
    seqs = [list(p) for p in prompts]           # prompt + committed tokens
    recs: list[list[int]] = [[] for _ in prompts]
    for _ in range(6):
        t = rnd.randint(0, 4)
        block = [[rnd.randint(1, 3) for _ in range(t)] for _ in prompts]
        tokens = torch.tensor(block, dtype=torch.int64).view(len(prompts), t)
        m = wm.marks(tokens)
        for r, seq in enumerate(seqs):
            ctxs = [ctx_of(seq + block[r][:s], width) for s in range(t + 1)]
            fresh = [c not in recs[r] and c not in ctxs[:s] for s, c in enumerate(ctxs)]
            assert m.ctx[r].tolist() == ctxs
            assert m.fresh[r].tolist() == fresh, (r, seq, block[r])
        if not t:
            continue
        count = [rnd.randint(0, t) for _ in prompts]
        before = wm.record.clone()
        wm.commit_(tokens, torch.tensor(count))
        for r, seq in enumerate(seqs):
            for j in range(count[r]):
                recs[r].append(ctx_of(seq, width))
                seq.append(block[r][j])
            used = len(recs[r])
            assert wm.used[r].item() == used
            assert wm.record[r, :used].tolist() == recs[r]
            assert torch.equal(wm.record[r, used:], before[r, used:]), "past used: untouched"
            assert wm.window[r].tolist() == ([-1] * width + seq)[-width:]


def test_a_record_holds_as_many_positions_as_its_capacity():
    """``capacity`` positions committed (the last block ending exactly at it): all recorded."""
    width, cap = 2, 6
    wm = WatermarkBatch.build(KEY, [(1,), (2, 3)], cap, width, "cpu")
    seqs, recs = [[1], [2, 3]], [[], []]
    for block in ([[4, 5], [6, 7]], [[8, 9, 4, 5], [1, 1, 2, 2]]):
        wm.commit_(torch.tensor(block), torch.tensor([len(block[0])] * 2))
        for r, seq in enumerate(seqs):
            for tok in block[r]:
                recs[r].append(ctx_of(seq, width))
                seq.append(tok)
    assert wm.used.tolist() == [cap, cap]
    assert wm.record.tolist() == recs


def test_record_entries_past_used_are_not_the_requests():
    """``in_record`` reads only the first ``used`` entries: the same contexts lying past them
    (stale entries) leave a slot fresh."""
    width = 2
    wm = WatermarkBatch.build(KEY, [(4, 4), (4, 4)], 8, width, "cpu")
    c = ctx_of([4, 4], width)
    wm.record[:, :3] = torch.tensor([[c, 11, 12], [11, c, 12]])
    wm.used = torch.tensor([1, 1])              # row 0 used c; row 1's c lies past its count
    fresh = wm.marks(torch.zeros(2, 0, dtype=torch.int64)).fresh[:, 0].tolist()
    assert fresh == [False, True]
    wm.used = torch.tensor([0, 2])
    assert wm.in_record(torch.tensor([[c], [c]]))[:, 0].tolist() == [False, True]


def walk_reference(prompt, used_ctxs, width, laws, cands, plains, greedy):
    """Row-wise walk of a block by the definition: slot j's context is that of its path; where
    fresh and not greedy, the keyed candidate (draw_sparse under subkey A; no law: flagged),
    else the ordinary draw."""
    path, seen, out = list(prompt), [], []
    for law, cand, plain in zip(laws, cands, plains):
        c = ctx_of(path, width)
        fresh = c not in used_ctxs and c not in seen
        seen.append(c)
        drawn = int(draw_sparse(KEY.draft, torch.tensor([c]), torch.tensor([cand]),
                                torch.tensor([law], dtype=torch.float64))[0])
        use = fresh and not greedy
        pos = plain if not use else max(drawn, 0)
        out.append((pos, use and drawn < 0))
        path.append(cand[pos])
    return out


def test_the_walk_draws_keyed_only_at_fresh_contexts_of_its_path():
    """Rows whose law sends the walk back to the same context (width 2, one token repeated)
    must fall back to the ordinary draw at the repeat; a keyed winner at position 0 stays 0;
    greedy rows never take the keyed draw; a row with no law is flagged."""
    width, k = 2, 3
    prompts = [(5, 5), (5, 5), (1, 2), (5, 5), (1, 2)]
    greedy = [False, False, False, True, False]
    cands = [[5, 6, 7], [6, 5, 7], [5, 6, 7], [5, 6, 7], [8, 9, 10]]
    laws = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.2, 0.5, 0.3], [1.0, 0.0, 0.0], None]
    plain = [2, 2, 1, 2, 1]
    wm = WatermarkBatch.build(KEY, prompts, 16, width, "cpu")
    wm.commit_(torch.tensor([[5], [9], [3], [5], [4]]), torch.tensor([0, 0, 0, 0, 1]))
    used = [[], [], [], [], [ctx_of([1, 2], width)]]
    walk = wm.walk()
    got = [[] for _ in prompts]
    rnd = random.Random(3)
    steps = 4
    row_laws = [[laws[r] if laws[r] is not None else
                 ([0.0] * k if j == 1 else [0.3, 0.3, 0.4]) for j in range(steps)]
                for r in range(len(prompts))]
    for j in range(steps):
        row_laws[2][j] = [rnd.random() for _ in range(k)]
        law = torch.tensor([row_laws[r][j] for r in range(len(prompts))], dtype=torch.float64)
        pos, bad = walk.pick(j, law, torch.tensor(cands), torch.tensor(plain),
                             torch.tensor(greedy))
        for r in range(len(prompts)):
            got[r].append((int(pos[r]), bool(bad[r])))
    for r, p in enumerate(prompts):
        want = walk_reference(list(p) + ([4] if r == 4 else []), used[r], width,
                              row_laws[r], [cands[r]] * steps, [plain[r]] * steps, greedy[r])
        assert got[r] == want, (r, got[r], want)
    assert got[0][0] == (0, False) and got[0][1] == (2, False)   # 55 again: the plain draw
    assert any(b for _, b in got[4])


def test_the_key_words_are_not_in_the_batch_repr():
    wm = WatermarkBatch.build(KEY, [(1, 2, 3)], 8, 4, "cpu")
    text = repr(wm) + str(wm) + repr(wm.take([0]))
    for w in words_of(KEY, "cpu").tolist():
        assert str(w) not in text
    assert "words" not in text


def test_a_block_past_the_records_end_keeps_the_last_committed_context():
    """Capacity 4 with 3 used: a block of 4 tokens of which 1 is committed fills the last entry
    with that token's context, though the uncommitted tail's writes land on the same index;
    with none committed the entry stays as it was."""
    for t in (2, 4, 7):
        for count in (0, 1):
            wm = WatermarkBatch.build(KEY, [(1, 2)], 4, 2, "cpu")
            wm.commit_(torch.tensor([[3, 1, 2]]), torch.tensor([3]))
            before = wm.record.clone()
            block = [2, 3, 1, 3, 2, 1, 1][:t]
            wm.commit_(torch.tensor([block]), torch.tensor([count]))
            want = before.clone()
            if count:
                want[0, 3] = ctx_of([1, 2, 3, 1, 2], 2)
            assert torch.equal(wm.record, want), (t, count)
            assert int(wm.used[0]) == 3 + count
