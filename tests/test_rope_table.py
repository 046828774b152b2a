"""The models' rope tables (one gather a call) and the draft context written every row."""

from __future__ import annotations

import torch

from dflash2rt.models.kv_cache import KVCache
from dflash2rt.models.rope import rope_cos_sin
from dflash2rt.ops.attention import write_rows

from tiny_models import tiny_pair


def test_the_table_gives_each_position_the_rope_of_that_position():
    """Every position of the table, gathered in any batch shape, is bit for bit what
    ``rope_cos_sin`` gives that position alone and in a block (float32 and bfloat16)."""
    pair = tiny_pair("dflash2", block=4, dtype=torch.float32)
    for model in (pair.target, pair.draft):
        for dtype in (torch.float32, torch.bfloat16):
            pos = torch.tensor([[0, 1, 2, 3], [37, 38, 39, 40], [95, 0, 5, 95]])
            cos, sin = model.rope(pos, dtype, cover=96)
            want = model.rope(pos, dtype)                      # computed, no table
            assert torch.equal(cos, want[0]) and torch.equal(sin, want[1])
            for p in (0, 41, 95):
                one = model.rope(torch.tensor([[p]]), dtype)
                got = model.rope(torch.tensor([[p]]), dtype, cover=96)
                assert torch.equal(got[0], one[0]) and torch.equal(got[1], one[1])


def test_a_longer_cover_grows_the_table_and_keeps_the_old_one():
    pair = tiny_pair("dflash2", block=4, dtype=torch.float32)
    model = pair.target
    first = model.rope_table("cpu", torch.float32, 40)
    assert first.shape[0] == 40 and model.rope_table("cpu", torch.float32, 12) is first
    grown = model.rope_table("cpu", torch.float32, 41)
    assert grown.shape[0] == 80 and torch.equal(grown[:40], first)     # at least doubled
    assert any(t is first for t in model._rope_tables["retired"])      # graphs may read it
    inv, scale = model.rope_inv_freq, model.attention_scaling
    cos, sin = rope_cos_sin(inv, scale, torch.arange(80), torch.float32)
    assert torch.equal(grown, torch.cat((cos, sin), dim=-1))


def test_the_draft_context_written_every_row_is_its_projection():
    """``write_context_kv``: each row's K/V at its position is ``context_kv_of``'s (the torch
    references here), every row, padding included; other positions untouched."""
    pair = tiny_pair("dflash2", block=4, dtype=torch.float32)
    d = pair.draft
    g = torch.Generator().manual_seed(0)
    ctx = torch.randn(2, 3, d.cfg.arch.hidden_size, generator=g)
    pos = torch.tensor([[4, 5, 6], [9, 10, 11]])
    cache = d.empty_cache(2, 16, torch.float32, "cpu")
    for t in (*cache.k, *cache.v):
        t.normal_(generator=g)
    want = KVCache([t.clone() for t in cache.k], [t.clone() for t in cache.v], ())
    for layer, (k, v) in enumerate(d.context_kv_of(ctx, pos)):
        write_rows(want.k[layer], k, pos)
        write_rows(want.v[layer], v, pos)
    d.write_context_kv(ctx, pos, cache)
    for got, ref in zip((*cache.k, *cache.v), (*want.k, *want.v)):
        assert torch.equal(got, ref)


def test_the_prologue_kernel_writes_the_draft_context_without_query_heads():
    """Under a kernel backend the same write is one prologue launch with no query head: the
    references' values (the norm's float32 mean sums in another order)."""
    from dflash2rt.kernels.launch import recording

    from backends import available

    backend = available()
    pair = tiny_pair("dflash2", block=4, dtype=torch.float32)
    d = pair.draft
    ctx = torch.randn(2, 3, d.cfg.arch.hidden_size, generator=torch.Generator().manual_seed(1))
    pos = torch.tensor([[0, 1, 2], [7, 8, 9]])
    ref, got = (d.empty_cache(2, 12, torch.float32, "cpu") for _ in range(2))
    d.write_context_kv(ctx, pos, ref)
    with recording() as rec, torch.no_grad(), backend.run_context():
        d.write_context_kv(ctx, pos, got)
    assert set(rec.per_kernel()) == {"rope._prologue_kernel"} and rec.count == len(d.layers)
    for a, b in zip((*got.k, *got.v), (*ref.k, *ref.v)):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)
