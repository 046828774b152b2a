"""The target model's contract (``TargetModel``) against definitions written out: its input
checks each alone at their edges, tap layer ids' domain, the causal mask against a loop over
its rule, taps against each decoder layer's output caught by a hook, ``ctx_len`` and
``logits_at`` against the plain forward, tied heads."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dflash2rt.errors import InvalidInputError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.kv_cache import KVCache
from dflash2rt.models.target import TargetModel, TargetOutput, causal_mask

from tiny_models import target_dict

F64 = torch.float64
LAYERS, MAX_LEN = 3, 12


def _cfg(**kw):
    return TargetConfig.from_dict({**target_dict("qwen3", layers=LAYERS), **kw})


def _model(taps=(), seed=0, **kw):
    torch.manual_seed(seed)
    m = TargetModel(_cfg(**kw), taps).to(F64)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    return m.eval()


def _cache(m, batch=2, max_len=MAX_LEN, dtype=F64, layers=None, heads=None, hd=None):
    c = m.cfg
    return KVCache.empty(layers or c.num_hidden_layers, batch, max_len,
                         heads or c.num_key_value_heads, hd or c.head_dim, dtype, "cpu")


def _inputs(lens=(3, 0), t=4, vocab=61, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (len(lens), t), generator=g)
    lens = torch.tensor(lens)
    return ids, lens.view(-1, 1) + torch.arange(t), lens


# ---- input checks, each alone ------------------------------------------------------------

def _ok():
    m = _model()
    ids, pos, lens = _inputs()
    return m, dict(input_ids=ids, positions=pos, cache=_cache(m), lens=lens)


BAD = {
    "ids 3-d": lambda m, a: {**a, "input_ids": a["input_ids"][..., None]},
    "ids 1-d": lambda m, a: {**a, "input_ids": a["input_ids"][0]},
    "ids int32": lambda m, a: {**a, "input_ids": a["input_ids"].int()},
    "positions shape": lambda m, a: {**a, "positions": a["positions"][:, :-1]},
    "positions rows": lambda m, a: {**a, "positions": a["positions"][:1]},
    "positions int32": lambda m, a: {**a, "positions": a["positions"].int()},
    "lens shape": lambda m, a: {**a, "lens": a["lens"][:1]},
    "lens 2-d": lambda m, a: {**a, "lens": a["lens"].view(2, 1)},
    "lens int32": lambda m, a: {**a, "lens": a["lens"].int()},
    "cache layers": lambda m, a: {**a, "cache": _cache(m, layers=LAYERS - 1)},
    "cache batch": lambda m, a: {**a, "cache": _cache(m, batch=3)},
    "cache kv heads": lambda m, a: {**a, "cache": _cache(m, heads=1)},
    "cache head dim": lambda m, a: {**a, "cache": _cache(m, hd=4)},
    "cache dtype": lambda m, a: {**a, "cache": _cache(m, dtype=torch.float32)},
    "rows past max_len": lambda m, a: {**a, "cache": _cache(m, max_len=3)},
    "ctx_len -1": lambda m, a: {**a, "ctx_len": -1},
    "ctx_len max_len + 1": lambda m, a: {**a, "ctx_len": MAX_LEN + 1},
}


@pytest.mark.parametrize("bad", list(BAD))
def test_each_input_check_alone(bad):
    m, good = _ok()
    with torch.no_grad():
        m(**good)                                                     # the good inputs pass
        with pytest.raises(InvalidInputError):
            m(**BAD[bad](m, good))


def test_the_heads_error_names_the_caches_heads():
    m, good = _ok()
    with pytest.raises(InvalidInputError, match=r"cache heads \(1, 8\) do not match"):
        m(**{**good, "cache": _cache(m, heads=1)})
    with pytest.raises(InvalidInputError, match=r"cache heads \(2, 4\) do not match"):
        m(**{**good, "cache": _cache(m, hd=4)})


@pytest.mark.parametrize("ctx_len", [0, 3, MAX_LEN, None])
def test_ctx_len_in_its_domain_is_accepted(ctx_len):
    m, good = _ok()
    with torch.no_grad():
        m(**{**good, "ctx_len": ctx_len})


def test_as_many_new_rows_as_the_cache_holds_is_accepted():
    m = _model()
    ids, pos, lens = _inputs(lens=(0, 0), t=MAX_LEN)
    with torch.no_grad():
        out = m(ids, pos, _cache(m), lens)
    assert out.logits.shape == (2, MAX_LEN, 61)


# ---- tap layer ids -------------------------------------------------------------------------

@pytest.mark.parametrize("taps", [(0, 0), (-1,), (LAYERS,), (1, 2, 1), (LAYERS + 5,)])
def test_bad_tap_layer_ids_are_refused(taps):
    with pytest.raises(InvalidInputError, match="tap_layer_ids"):
        TargetModel(_cfg(), taps)


@pytest.mark.parametrize("taps", [(), (0,), (LAYERS - 1,), (2, 0), (0, 1, 2)])
def test_good_tap_layer_ids_are_kept_in_order(taps):
    assert TargetModel(_cfg(), taps).tap_layer_ids == taps


@pytest.mark.parametrize("taps", [(2, 0), (1,), (0, 1, 2), ()])
@pytest.mark.parametrize("cached", [True, False])
def test_taps_are_each_named_layers_output_in_the_order_given(taps, cached):
    m = _model(taps)
    seen = {}
    hooks = [layer.register_forward_hook(lambda mod, inp, out, i=i: seen.__setitem__(i, out))
             for i, layer in enumerate(m.model.layers)]
    ids, pos, lens = _inputs()
    with torch.no_grad():
        out = m(ids, pos, _cache(m), lens) if cached else \
            m.forward_full(ids, pos, torch.ones_like(ids, dtype=torch.bool))
    for h in hooks:
        h.remove()
    assert out.taps.shape == (2, 4, len(taps), m.cfg.hidden_size)
    for k, i in enumerate(taps):
        assert torch.equal(out.taps[:, :, k], seen[i])
    ref = seen[LAYERS - 1]
    norm = ref / torch.sqrt((ref * ref).mean(-1, keepdim=True) + m.cfg.rms_norm_eps)
    assert torch.allclose(out.logits, (norm * m.model.norm.weight) @ m.lm_head.weight.T,
                          atol=1e-12)


# ---- the causal mask -----------------------------------------------------------------------

def test_causal_mask_against_its_rule():
    """m[r, j, k] = k <= j and (valid[r, k] or k == j), for every pattern of 4 rows."""
    pats = [[(b >> i) & 1 == 1 for i in range(4)] for b in range(16)]
    valid = torch.tensor(pats)
    got = causal_mask(valid)
    assert got.shape == (16, 4, 4) and got.dtype == torch.bool
    for r, pat in enumerate(pats):
        for j in range(4):
            for k in range(4):
                assert bool(got[r, j, k]) == (k <= j and (pat[k] or k == j)), (pat, j, k)


def test_the_full_forward_equals_the_cached_prefill_on_valid_rows():
    """An invalid row hides from every later row: the valid rows after it read as if it were
    absent, which the cached forward gives by leaving it out."""
    m = _model((1,))
    ids, pos, _ = _inputs(lens=(0,), t=5)
    valid = torch.tensor([[True, False, True, True, False]])
    keep = [0, 2, 3]
    with torch.no_grad():
        full = m.forward_full(ids, torch.tensor([[0, 9, 1, 2, 9]]), valid)
        alone = m(ids[:, keep], torch.tensor([[0, 1, 2]]), _cache(m, batch=1),
                  torch.tensor([0]))
    assert torch.allclose(full.logits[:, keep], alone.logits, atol=1e-10)
    assert torch.allclose(full.taps[:, keep], alone.taps, atol=1e-10)


# ---- ctx_len, logits_at, decode ------------------------------------------------------------

def _prefill(m, lens, seed=2):
    """The cache after a prefill of random prompts of the given lengths (one at a time)."""
    cache = _cache(m, batch=len(lens))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for r, n in enumerate(lens):
            one = _cache(m, batch=1)
            if n:
                ids = torch.randint(0, 61, (1, n), generator=g)
                m(ids, torch.arange(n).view(1, -1), one, torch.tensor([0]))
            for i in range(LAYERS):
                cache.k[i][r] = one.k[i][0]
                cache.v[i][r] = one.v[i][0]
    return cache


def test_ctx_len_and_logits_at_read_as_the_plain_forward():
    """ctx_len = the longest context reads every key the rows need; logits_at picks rows."""
    m = _model((0, 2))
    lens = (5, 2)
    ids, pos, ln = _inputs(lens=lens, t=3)
    with torch.no_grad():
        plain = m(ids, pos, _prefill(m, lens), ln)
        bounded = m(ids, pos, _prefill(m, lens), ln, ctx_len=max(lens))
        at = m(ids, pos, _prefill(m, lens), ln, ctx_len=max(lens),
               logits_at=torch.tensor([2, 0]))
    assert torch.allclose(bounded.logits, plain.logits, atol=1e-12)
    assert torch.allclose(bounded.taps, plain.taps, atol=1e-12)
    assert at.logits.shape == (2, 1, 61)
    assert torch.allclose(at.logits[0, 0], plain.logits[0, 2], atol=1e-12)
    assert torch.allclose(at.logits[1, 0], plain.logits[1, 0], atol=1e-12)
    assert torch.allclose(at.taps, plain.taps, atol=1e-12)


def test_stale_cache_rows_past_the_new_ones_are_never_read():
    """Rows at and past lens[r] + t hold garbage; a row reads keys [0, its position] only."""
    m = _model()
    lens = (4, 1)
    ids, pos, ln = _inputs(lens=lens, t=2)
    clean = _prefill(m, lens)
    dirty = _prefill(m, lens)
    for r, n in enumerate(lens):
        for i in range(LAYERS):
            dirty.k[i][r, n:] = 50.0
            dirty.v[i][r, n:] = -50.0
    with torch.no_grad():
        a = m(ids, pos, clean, ln).logits
        b = m(ids, pos, dirty, ln).logits
        c = m(ids[:, :1], pos[:, :1], _prefill(m, lens), ln).logits
    assert torch.allclose(a, b, atol=1e-12)
    assert torch.allclose(a[:, :1], c, atol=1e-12)       # row 0 never reads row 1


def test_tied_head_is_the_embedding():
    m = TargetModel(_cfg(tie_word_embeddings=True))
    assert m.lm_head.weight is m.model.embed_tokens.weight
    untied = TargetModel(_cfg(tie_word_embeddings=False))
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    assert "rope_inv_freq_bits" not in untied.state_dict()
    assert untied.lm_head.bias is None


def test_the_output_is_frozen():
    out = TargetOutput(logits=torch.zeros(1, 1, 2), taps=torch.zeros(1, 1, 0, 2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.logits = torch.ones(1)
