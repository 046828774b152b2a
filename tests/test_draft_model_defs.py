"""The draft model (``DraftModel``) against a float64 forward written anew from its definition:
RMS norms, the grouped dynamic conv as a sum over taps, rope and GQA attention in loops over
each row's visible keys (full, sliding, causal, each layer alone), the context K/V, embeddings,
and a reduced vocabulary's logits placed id by id at ``i + d2t[i]``, −inf elsewhere."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.models.draft import DraftModel
from dflash2rt.models.draft_config import DraftConfig

from tiny_models import draft_dict

B, MAX_LEN, LENS = 4, 16, (9, 2)     # block rows; cache rows; one long context, one short


def _cfg(variant, **kw):
    return replace(DraftConfig.from_dict(draft_dict(variant, block=B, layers=2)), **kw)


def _model(cfg, seed=0):
    torch.manual_seed(seed)
    model = DraftModel(cfg).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    return model.eval()


# ---- the reference, written from the definitions -------------------------------------------

def _rms(x, w, eps):
    """x [..., d] / sqrt(mean(x²) + eps) · w."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _inv_freq(theta, hd):
    """transformers' default rope: theta^(−2i/hd) in float32."""
    return [float(torch.tensor(1.0, dtype=torch.float32)
                  / torch.tensor(theta, dtype=torch.float32)
                  ** torch.tensor(2 * i / hd, dtype=torch.float32)) for i in range(hd // 2)]


def _rotate(x, pos, inv):
    """One head's vector x [hd] at position pos: pairs (i, i + hd/2) turned by pos · inv[i]."""
    half = x.shape[0] // 2
    out = x.clone()
    for i in range(half):
        c, s = math.cos(pos * inv[i]), math.sin(pos * inv[i])
        out[i] = x[i] * c - x[i + half] * s
        out[i + half] = x[i + half] * c + x[i] * s
    return out


def _conv(x, base, delta, taps, gsize):
    """One block x [B, H]: out[i, c] = Σ_t (base[t, c] + δ[i, t, c // gsize]) · x[i − t, c]."""
    out = torch.zeros_like(x)
    for i in range(x.shape[0]):
        for t in range(taps):
            if i - t < 0:
                continue
            for c in range(x.shape[1]):
                out[i, c] += (base[t, c] + delta[i, t, c // gsize]) * x[i - t, c]
    return out


def _kv(attn, x, pos, inv, eps):
    """x [T, H] at positions pos → rotated keys and values, lists over T of [n_kv, hd]."""
    nkv, hd = attn.n_kv_heads, attn.head_dim
    ks, vs = [], []
    for j in range(x.shape[0]):
        k = (x[j] @ attn.k_proj.weight.T).view(nkv, hd)
        v = (x[j] @ attn.v_proj.weight.T).view(nkv, hd)
        ks.append(torch.stack([_rotate(_rms(k[h], attn.k_norm.weight, eps), pos[j], inv)
                               for h in range(nkv)]))
        vs.append(v)
    return ks, vs


def _visible(cfg, layer, start, j):
    """Key positions block row j (at start + j) reads in ``layer``, from docs/models.md."""
    p, win, causal = start + j, cfg.sliding_windows[layer], cfg.causal(layer)
    keys = range(p + 1) if causal else range(start + B)
    if win is None:
        return list(keys)
    if causal:
        return [q for q in keys if q >= p - win + 1]
    return [q for q in keys if q >= p - win + 1 or q >= start]     # the block: always


def _ref_row(model, emb, ctx_k, ctx_v, start):
    """One request's block: emb [B, H], the context K/V per layer (rows [0, start) used) →
    (hidden [B, H], the block's keys and values per layer)."""
    cfg, a = model.cfg, model.cfg.arch
    eps, nh, hd = a.rms_norm_eps, a.num_attention_heads, a.head_dim
    group = nh // a.num_key_value_heads
    inv = _inv_freq(a.rope.theta, hd)
    pos = [start + j for j in range(B)]
    h = emb * cfg.input_embedding_scale
    written = []
    for li, layer in enumerate(model.layers):
        at = layer.self_attn
        store = {}

        def attention(x, li=li, at=at, store=store):
            ks, vs = _kv(at, x, pos, inv, eps)
            store["k"], store["v"] = ks, vs
            keys = {q: ctx_k[li][q] for q in range(start)}
            vals = {q: ctx_v[li][q] for q in range(start)}
            keys.update({pos[j]: ks[j] for j in range(B)})
            vals.update({pos[j]: vs[j] for j in range(B)})
            rows = []
            for j in range(B):
                q = (x[j] @ at.q_proj.weight.T).view(nh, hd)
                heads = []
                for hh in range(nh):
                    qh = _rotate(_rms(q[hh], at.q_norm.weight, eps), pos[j], inv)
                    seen = _visible(cfg, li, start, j)
                    s = torch.stack([qh @ keys[kp][hh // group] for kp in seen]) / math.sqrt(hd)
                    w = torch.softmax(s, 0)
                    heads.append(sum(w[n] * vals[kp][hh // group] for n, kp in enumerate(seen)))
                rows.append(torch.cat(heads) @ at.o_proj.weight.T)
            return torch.stack(rows)

        def mlp(x, layer=layer):
            m = layer.mlp
            g, u = x @ m.gate_proj.weight.T, x @ m.up_proj.weight.T
            return (g * torch.sigmoid(g) * u) @ m.down_proj.weight.T

        for norm, conv, fn in ((layer.input_layernorm, layer.attention_conv, attention),
                               (layer.post_attention_layernorm, layer.mlp_conv, mlp)):
            x = _rms(h, norm.weight, eps)
            if conv is None:
                h = h + fn(x)
                continue
            taps, groups = cfg.conv_kernel_size, cfg.conv_groups
            w = conv.kernel_projection.weight                         # [2 · Tk · G, H]
            delta = torch.zeros(B, 2, taps, groups, dtype=x.dtype)
            for i in range(B):
                for side in range(2):
                    for t in range(taps):
                        for g in range(groups):
                            delta[i, side, t, g] = w[(side * taps + t) * groups + g] @ x[i]
            gsize = a.hidden_size // groups
            xc = _conv(x, conv.base_kernel[0], delta[:, 0], taps, gsize)
            h = h + _conv(fn(xc), conv.base_kernel[1], delta[:, 1], taps, gsize)
        written.append((store["k"], store["v"]))
    return _rms(h, model.norm.weight, eps), written


# ---- the forward ---------------------------------------------------------------------------

CONFIGS = {
    "v2-full-scaled": ("dflash2", dict(input_embedding_scale=0.5)),
    "v2-sliding-then-sliding-causal": ("dflash2", dict(sliding_windows=(5, 5),
                                                       causal_layers=(False, True))),
    "v1-full-causal-then-sliding": ("dflash1", dict(sliding_windows=(None, 5),
                                                    causal_layers=(True, False))),
    "v1-full": ("dflash1", dict(input_embedding_scale=2.0)),
    "v1-sliding-causal-then-full": ("dflash1", dict(sliding_windows=(3, None),
                                                    causal_layers=(True, False))),
}


@pytest.mark.parametrize("ctx_len", [None, max(LENS)])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_block_forward_equals_the_definition(name, ctx_len):
    """Two requests in one batch (a context longer than the window beside one shorter): each
    row's hidden against the reference, the block's K/V in the cache at its positions, every
    other cache row untouched (stale rows past the block are never read)."""
    variant, kw = CONFIGS[name]
    cfg = _cfg(variant, **kw)
    model = _model(cfg)
    a = cfg.arch
    cache = model.empty_cache(len(LENS), MAX_LEN, torch.float64, "cpu")
    torch.manual_seed(7)
    for t in (*cache.k, *cache.v):
        t.normal_()
    before = ([k.clone() for k in cache.k], [v.clone() for v in cache.v])
    emb = torch.randn(len(LENS), B, a.hidden_size, dtype=torch.float64)
    lens = torch.tensor(LENS)
    pos = lens.view(-1, 1) + torch.arange(B)
    with torch.no_grad():
        out = model(emb.clone(), pos, cache, lens, get_backend("cpu"), ctx_len=ctx_len)
        for r, start in enumerate(LENS):
            ref, written = _ref_row(model, emb[r], [k[r] for k in before[0]],
                                    [v[r] for v in before[1]], start)
            assert torch.allclose(out[r], ref, rtol=0, atol=1e-10), (name, r)
            for li, (ks, vs) in enumerate(written):
                for j in range(B):
                    assert torch.allclose(cache.k[li][r, start + j], ks[j], atol=1e-10)
                    assert torch.allclose(cache.v[li][r, start + j], vs[j], atol=1e-10)
                keep = [q for q in range(MAX_LEN) if not start <= q < start + B]
                assert torch.equal(cache.k[li][r, keep], before[0][li][r, keep])
                assert torch.equal(cache.v[li][r, keep], before[1][li][r, keep])


def test_conv_and_selector_exist_exactly_in_dflash2():
    """DFlash2 wraps every sublayer in a conv (2 · Tk · G deltas per row, base taps per side)
    and has the selector; DFlash v1 has neither."""
    v2, v1 = DraftModel(_cfg("dflash2")), DraftModel(_cfg("dflash1"))
    c = v2.cfg
    for layer in v2.layers:
        for conv in (layer.attention_conv, layer.mlp_conv):
            assert conv.base_kernel.shape == (2, c.conv_kernel_size, c.arch.hidden_size)
            assert conv.kernel_projection.weight.shape == (
                2 * c.conv_kernel_size * c.conv_groups, c.arch.hidden_size)
            x = torch.randn(5, c.arch.hidden_size)
            d = conv.deltas(x)
            assert d.shape == (5, 2, c.conv_kernel_size, c.conv_groups)
            assert torch.equal(d.flatten(1), conv.kernel_projection(x))
    sel = v2.candidate_selector
    assert sel.hidden_projection.weight.shape == (c.selector_rank, c.arch.hidden_size)
    assert sel.predecessor_codebook.shape == (c.arch.vocab_size, c.selector_rank)
    assert sel.successor_codebook.shape == (c.arch.vocab_size, c.selector_rank)
    assert v1.candidate_selector is None
    assert all(layer.attention_conv is None and layer.mlp_conv is None for layer in v1.layers)
    assert not any("conv" in n or "selector" in n for n in v1.state_dict())


# ---- context K/V ---------------------------------------------------------------------------

def _taps(model, r, t, seed=3):
    torch.manual_seed(seed)
    return torch.randn(r, t, len(model.cfg.target_layer_ids), model.cfg.arch.hidden_size,
                       dtype=torch.float64)


def _ref_ctx(model, taps):
    """fc over the taps concatenated in order, then hidden_norm: [R, T, H]."""
    a = model.cfg.arch
    flat = torch.cat([taps[..., i, :] for i in range(taps.shape[-2])], -1)
    return _rms(flat @ model.fc.weight.T, model.hidden_norm.weight, a.rms_norm_eps)


@pytest.mark.parametrize("variant", ["dflash2", "dflash1"])
def test_context_hidden_and_kv_equal_the_definition(variant):
    model = _model(_cfg(variant, target_layer_ids=(0, 1, 2)))
    a = model.cfg.arch
    assert model.fc.weight.shape == (a.hidden_size, 3 * a.hidden_size)
    taps = _taps(model, 2, 5)
    pos = torch.tensor([[0, 1, 2, 3, 4], [7, 3, 11, 5, 0]])
    inv = _inv_freq(a.rope.theta, a.head_dim)
    with torch.no_grad():
        ctx = model.context_hidden(taps)
        assert torch.allclose(ctx, _ref_ctx(model, taps), atol=1e-12)
        kv = model.context_kv(taps, pos)
        assert len(kv) == a.num_hidden_layers
        for layer, (k, v) in zip(model.layers, kv):
            for r in range(2):
                ks, vs = _kv(layer.self_attn, ctx[r], pos[r].tolist(), inv, a.rms_norm_eps)
                assert torch.allclose(k[r], torch.stack(ks), atol=1e-10)
                assert torch.allclose(v[r], torch.stack(vs), atol=1e-12)


def test_write_context_kv_writes_every_layer_at_its_positions_only():
    model = _model(_cfg("dflash2"))
    a = model.cfg.arch
    ctx = _ref_ctx(model, _taps(model, 2, 3))
    pos = torch.tensor([[2, 3, 4], [9, 0, 14]])
    cache = model.empty_cache(2, MAX_LEN, torch.float64, "cpu")
    inv = _inv_freq(a.rope.theta, a.head_dim)
    with torch.no_grad():
        model.write_context_kv(ctx, pos, cache)
        for li, layer in enumerate(model.layers):
            for r in range(2):
                ks, vs = _kv(layer.self_attn, ctx[r], pos[r].tolist(), inv, a.rms_norm_eps)
                for j, p in enumerate(pos[r].tolist()):
                    assert torch.allclose(cache.k[li][r, p], ks[j], atol=1e-10)
                    assert torch.allclose(cache.v[li][r, p], vs[j], atol=1e-12)
                rest = [q for q in range(MAX_LEN) if q not in pos[r].tolist()]
                assert not cache.k[li][r, rest].any() and not cache.v[li][r, rest].any()


def test_empty_cache_shapes_and_side_buffer():
    model = DraftModel(_cfg("dflash2"))
    a = model.cfg.arch
    cache = model.empty_cache(3, 10, torch.float32, "cpu")
    assert len(cache.k) == len(cache.v) == a.num_hidden_layers
    for t in (*cache.k, *cache.v):
        assert t.shape == (3, 10, a.num_key_value_heads, a.head_dim)
        assert t.dtype == torch.float32 and not t.any()
    (side,) = cache.side
    assert side.shape == (3, 10, a.hidden_size) and side.dtype == torch.float32
    assert not side.any()


# ---- embedding and logits ------------------------------------------------------------------

class _Target:
    """A stand-in target whose embedding and head say they were used."""

    def embed(self, ids):
        return torch.full((*ids.shape, 4), 7.0, dtype=torch.float64)

    def lm_head(self, h):
        return torch.full((*h.shape[:-1], 5), -3.0, dtype=torch.float64)


def test_embed_is_the_drafts_own_exactly_when_it_ships_one():
    ids = torch.tensor([[1, 5], [60, 0]])
    borrowed = DraftModel(_cfg("dflash2"))
    assert borrowed.embed_tokens is None
    assert torch.equal(borrowed.embed(ids, _Target()), torch.full((2, 2, 4), 7.0,
                                                                  dtype=torch.float64))
    own = _model(_cfg("dflash2", own_embedding=True))
    got = own.embed(ids, _Target())
    w = own.embed_tokens.weight
    assert torch.equal(got, torch.stack([torch.stack([w[i] for i in row]) for row in
                                         ids.tolist()]))


def test_logits_borrowed_own_and_reduced():
    h = torch.randn(2, 3, 32, dtype=torch.float64)
    borrowed = DraftModel(_cfg("dflash1"))
    assert borrowed.lm_head is None and borrowed.d2t is None
    assert torch.equal(borrowed.logits(h, _Target()), torch.full((2, 3, 5), -3.0,
                                                                  dtype=torch.float64))
    own = _model(_cfg("dflash1", own_head=True))
    assert own.lm_head.weight.shape == (61, 32) and own.d2t is None
    assert torch.allclose(own.logits(h, _Target()), h @ own.lm_head.weight.T, atol=1e-12)


def test_a_reduced_vocabulary_is_placed_at_i_plus_d2t_and_minus_inf_elsewhere():
    cfg = _cfg("dflash1", own_head=True, draft_vocab_size=7)
    model = _model(cfg)
    assert model.lm_head.weight.shape == (7, 32)
    assert model.d2t.shape == (7,) and model.d2t.dtype == torch.int64
    assert model.t2d.shape == (61,) and model.t2d.dtype == torch.bool
    targets = [40, 3, 59, 10, 4, 22, 60]                     # not ascending, ends at V − 1
    model.d2t.copy_(torch.tensor([t - i for i, t in enumerate(targets)]))
    h = torch.randn(2, 3, 32, dtype=torch.float64)
    with torch.no_grad():
        got = model.logits(h, _Target())
        own = h @ model.lm_head.weight.T
    assert got.shape == (2, 3, 61)
    for r in range(2):
        for s in range(3):
            for v in range(61):
                if v in targets:
                    assert float(got[r, s, v]) == pytest.approx(float(own[r, s, targets.index(v)]),
                                                             abs=1e-12)
                else:
                    assert float(got[r, s, v]) == float("-inf")
    full = DraftModel(_cfg("dflash1", own_head=True, draft_vocab_size=61))
    assert full.d2t is None and full.t2d is None and full.lm_head.weight.shape == (61, 32)


def _names(layers, conv, selector):
    """A draft checkpoint's tensor names, written out (no biases anywhere in this config)."""
    out = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for i in range(layers):
        p = f"layers.{i}."
        out |= {p + n for n in ("input_layernorm.weight", "post_attention_layernorm.weight",
                                "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                "self_attn.q_norm.weight", "self_attn.k_norm.weight",
                                "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                "mlp.down_proj.weight")}
        if conv:
            out |= {p + f"{c}.{n}" for c in ("attention_conv", "mlp_conv")
                    for n in ("base_kernel", "kernel_projection.weight")}
    if selector:
        out |= {"candidate_selector." + n for n in ("hidden_projection.weight",
                                                    "predecessor_codebook",
                                                    "successor_codebook")}
    return out


@pytest.mark.parametrize("variant,kw,extra", [
    ("dflash2", {}, set()),
    ("dflash1", {}, set()),
    ("dflash2", dict(own_embedding=True), {"embed_tokens.weight"}),
    ("dflash1", dict(own_head=True), {"lm_head.weight"}),
    ("dflash1", dict(own_head=True, draft_vocab_size=7), {"lm_head.weight", "d2t", "t2d"}),
])
def test_the_state_dict_holds_exactly_the_checkpoints_names(variant, kw, extra):
    """The rope frequencies are a buffer outside the state dict (no checkpoint holds them)."""
    model = DraftModel(_cfg(variant, **kw))
    v2 = variant == "dflash2"
    assert set(model.state_dict()) == _names(2, v2, v2) | extra
