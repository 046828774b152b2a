"""Target and draft forwards in float64 from NumPy weights (Hugging Face state_dict names).

``w`` maps parameter names to float64 arrays (``{k: v.double().numpy()}`` of a model's
state_dict). Configs are plain dicts: vocab, hidden, heads, kv_heads, head_dim, eps, qk_norm,
config (the checkpoint's config.json dict: rope frequencies and attention scaling are computed
from it by ``reference.rope``, never taken from the runtime); the draft adds taps, block, mask,
scale, conv (bool) and the selector fields. Attention scores scale by head_dim ** -0.5.
"""

from __future__ import annotations

import numpy as np

from . import rope as rope_config
from .conv import conv


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def linear(w: dict, name: str, x: np.ndarray) -> np.ndarray:
    y = x @ w[name + ".weight"].T
    bias = w.get(name + ".bias")
    return y if bias is None else y + bias


def rope(positions: np.ndarray, cfg: dict):
    """cos, sin [..., hd] at integer positions, from the checkpoint config (``reference.rope``)."""
    return rope_config.cos_sin(positions, cfg["config"], cfg["head_dim"])


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [T, heads, hd] rotated by cos/sin [T, hd]."""
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None] + rot * sin[:, None]


def project_q(w, p, cfg, x, cos, sin):
    q = linear(w, p + "q_proj", x).reshape(x.shape[0], cfg["heads"], cfg["head_dim"])
    if cfg["qk_norm"]:
        q = rmsnorm(q, w[p + "q_norm.weight"], cfg["eps"])
    return rotate(q, cos, sin)


def project_kv(w, p, cfg, x, cos, sin):
    k = linear(w, p + "k_proj", x).reshape(x.shape[0], cfg["kv_heads"], cfg["head_dim"])
    if cfg["qk_norm"]:
        k = rmsnorm(k, w[p + "k_norm.weight"], cfg["eps"])
    v = linear(w, p + "v_proj", x).reshape(x.shape[0], cfg["kv_heads"], cfg["head_dim"])
    return rotate(k, cos, sin), v


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """q [Tq, nh, hd], k/v [Tk, n_kv, hd] (GQA: head h reads kv head h // rep), mask [Tq, Tk]."""
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) * q.shape[-1] ** -0.5
    scores = np.where(mask[None], scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", probs, v)


def swiglu(w, p, x):
    g = linear(w, p + "gate_proj", x)
    return linear(w, p + "down_proj", g / (1.0 + np.exp(-g)) * linear(w, p + "up_proj", x))


def target_forward(w: dict, cfg: dict, ids, taps=()) -> tuple[np.ndarray, np.ndarray]:
    """Causal forward over token ids [T] at positions 0..T-1 → (logits [T, V],
    taps [T, n_taps, H]: the output of decoder layer l for each l in ``taps``)."""
    ids = np.asarray(ids, dtype=np.int64)
    t = ids.shape[0]
    h = w["model.embed_tokens.weight"][ids]
    cos, sin = rope(np.arange(t), cfg)
    mask = np.tril(np.ones((t, t), dtype=bool))
    tapped = {}
    for i in range(cfg["layers"]):
        p = f"model.layers.{i}."
        x = rmsnorm(h, w[p + "input_layernorm.weight"], cfg["eps"])
        q = project_q(w, p + "self_attn.", cfg, x, cos, sin)
        k, v = project_kv(w, p + "self_attn.", cfg, x, cos, sin)
        h = h + linear(w, p + "self_attn.o_proj", attend(q, k, v, mask).reshape(t, -1))
        h = h + swiglu(w, p + "mlp.", rmsnorm(h, w[p + "post_attention_layernorm.weight"],
                                             cfg["eps"]))
        tapped[i] = h
    logits = rmsnorm(h, w["model.norm.weight"], cfg["eps"]) @ w["lm_head.weight"].T
    stack = np.stack([tapped[i] for i in taps], axis=1) if taps else np.zeros((t, 0, h.shape[1]))
    return logits, stack


def _conv_sublayer(w, p, cfg, h, norm_name, fn):
    """h + conv(fn(conv(norm(h), base[0], δ0)), base[1], δ1), δ = kernel_projection(norm(h))."""
    x = rmsnorm(h, w[p + norm_name], cfg["eps"])
    if not cfg["conv"]:
        return h + fn(x)
    conv_p = p + ("attention_conv." if "input" in norm_name else "mlp_conv.")
    base = w[conv_p + "base_kernel"]                                  # [2, Tk, H]
    taps = base.shape[1]
    delta = linear(w, conv_p + "kernel_projection", x).reshape(x.shape[0], 2, taps, -1)
    xin = conv(x, base[0], delta[:, 0], cfg["block"])
    return h + conv(fn(xin), base[1], delta[:, 1], cfg["block"])


def draft_forward(w: dict, cfg: dict, block_emb: np.ndarray, block_pos: np.ndarray,
                  ctx_taps: np.ndarray, ctx_pos: np.ndarray) -> np.ndarray:
    """Block embeddings [B, H] at positions [B]; committed context taps [n, n_taps, H] at [n]
    → draft hidden [B, H]. Non-causal: every block row sees all context and all block rows."""
    ctx = rmsnorm(ctx_taps.reshape(ctx_taps.shape[0], -1) @ w["fc.weight"].T,
                  w["hidden_norm.weight"], cfg["eps"])
    ccos, csin = rope(ctx_pos, cfg)
    bcos, bsin = rope(block_pos, cfg)
    h = block_emb * cfg["scale"]
    b, n = h.shape[0], ctx.shape[0]
    mask = np.ones((b, n + b), dtype=bool)
    for i in range(cfg["layers"]):
        p = f"layers.{i}."
        ck, cv = project_kv(w, p + "self_attn.", cfg, ctx, ccos, csin)

        def attn(x, p=p, ck=ck, cv=cv):
            q = project_q(w, p + "self_attn.", cfg, x, bcos, bsin)
            k, v = project_kv(w, p + "self_attn.", cfg, x, bcos, bsin)
            out = attend(q, np.concatenate([ck, k]), np.concatenate([cv, v]), mask)
            return linear(w, p + "self_attn.o_proj", out.reshape(b, -1))

        h = _conv_sublayer(w, p, cfg, h, "input_layernorm.weight", attn)
        h = _conv_sublayer(w, p, cfg, h, "post_attention_layernorm.weight",
                           lambda x, p=p: swiglu(w, p + "mlp.", x))
    return rmsnorm(h, w["norm.weight"], cfg["eps"])
