"""Rotary embeddings from a checkpoint's config.json alone, in NumPy (no runtime value is read).

The Hugging Face definition of the rope frequencies is float32 arithmetic:
``inv_freq = 1 / theta ** (arange(0, d, 2).float() / d)``, then the type's rescaling (linear,
llama3, yarn) in float32, and an attention scaling (yarn's mscale, else 1) applied to cos / sin.
This module follows those formulas step by step with correctly rounded float32 operations
(the power is evaluated in float64 and rounded once), so its frequencies are the ideal float32
constants; a runtime whose float32 ``pow`` is not correctly rounded may differ from them by one
float32 ulp (the L1 rope check compares within the float32 tolerance). Angles, cos and sin are
then float64. Supported types: default, linear, llama3, yarn (dynamic / longrope raise).
"""

from __future__ import annotations

import math

import numpy as np

F32 = np.float32
# transformers' max_position_embeddings when config.json omits it, per model type.
MAX_POSITION_DEFAULTS = {"qwen3": 32768, "llama": 2048}
TYPES = ("default", "linear", "llama3", "yarn")


def rope_parameters(config: dict) -> dict:
    """{type, theta, ...type parameters} of a config.json dict, by transformers' rules:
    ``rope_scaling`` wins over ``rope_parameters``, the type key is ``rope_type`` or ``type``,
    theta comes from the parameters or the top-level ``rope_theta`` (default 10000), a top-level
    ``original_max_position_embeddings`` overrides, llama3 / yarn default it to
    ``max_position_embeddings``, and yarn's factor defaults to max_position / original."""
    raw = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    kind = raw.pop("rope_type", None) or raw.pop("type", None) or "default"
    raw.pop("type", None)
    if kind not in TYPES:
        raise NotImplementedError(f"the reference has no rope type {kind!r} (has {TYPES})")
    theta = raw.pop("rope_theta", None)
    raw["theta"] = float(config.get("rope_theta", 10000.0) if theta is None else theta)
    partial = raw.pop("partial_rotary_factor", config.get("partial_rotary_factor"))
    if partial not in (None, 1, 1.0):
        raise NotImplementedError(f"the reference has no partial rotary factor {partial}")
    max_pos = config.get("max_position_embeddings") or \
        MAX_POSITION_DEFAULTS[config.get("model_type", "llama")]
    if kind in ("llama3", "yarn"):
        if config.get("original_max_position_embeddings") is not None:
            raw["original_max_position_embeddings"] = config["original_max_position_embeddings"]
        raw.setdefault("original_max_position_embeddings", max_pos)
    if kind == "yarn" and raw.get("factor") is None:
        raw["factor"] = max_pos / raw["original_max_position_embeddings"]
    return {"type": kind, **raw}


def _base_frequencies(theta: float, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(theta ** (2i/d), its reciprocal), both float32 [d/2], the exponent rounded to float32."""
    exps = np.arange(0, dim, 2).astype(F32) / F32(dim)                     # [d/2]
    powers = (np.float64(theta) ** exps.astype(np.float64)).astype(F32)   # one rounding
    return powers, F32(1.0) / powers


def _llama3(rp: dict, inv: np.ndarray) -> np.ndarray:
    factor, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    old_ctx = rp["original_max_position_embeddings"]
    low_wavelen, high_wavelen = F32(old_ctx / lo), F32(old_ctx / hi)
    wavelen = (F32(1) / inv) * F32(2 * math.pi)       # torch: scalar / t = t.reciprocal() * scalar
    scaled = np.where(wavelen > low_wavelen, inv / F32(factor), inv)
    smooth = ((F32(1) / wavelen) * F32(old_ctx) - F32(lo)) / F32(hi - lo)
    smoothed = (F32(1) - smooth) * scaled / F32(factor) + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(rp: dict, dim: int) -> tuple[np.ndarray, float]:
    theta, factor, orig = rp["theta"], rp["factor"], rp["original_max_position_embeddings"]
    scaling = rp.get("attention_factor")
    if scaling is None:
        m, m_all = rp.get("mscale"), rp.get("mscale_all_dim")
        scaling = _mscale(factor, m) / _mscale(factor, m_all) if m and m_all else \
            _mscale(factor)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(rp.get("beta_fast") or 32), correction_dim(rp.get("beta_slow") or 1)
    if rp.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001                                   # transformers: no singular ramp
    ramp = np.clip((np.arange(dim // 2).astype(F32) - F32(low)) / F32(high - low), 0, 1)
    powers, extrapolation = _base_frequencies(theta, dim)
    interpolation = F32(1.0) / (F32(factor) * powers)
    extra = F32(1) - ramp.astype(F32)
    return interpolation * (F32(1) - extra) + extrapolation * extra, float(scaling)


def inv_freq(config: dict, head_dim: int) -> tuple[np.ndarray, float]:
    """(inverse frequencies [head_dim / 2] as float64 holding float32 values, attention
    scaling) of the checkpoint described by ``config`` (a config.json dict)."""
    rp = rope_parameters(config)
    if rp["type"] == "yarn":
        inv, scaling = _yarn(rp, head_dim)
    else:
        inv, scaling = _base_frequencies(rp["theta"], head_dim)[1], 1.0
        if rp["type"] == "linear":
            inv = inv / F32(rp["factor"])
        elif rp["type"] == "llama3":
            inv = _llama3(rp, inv)
    return np.asarray(inv, F32).astype(np.float64), scaling


def cos_sin(positions, config: dict, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [..., head_dim] at integer positions, float64 (HF layout: frequencies twice)."""
    inv, scaling = inv_freq(config, head_dim)
    freqs = np.asarray(positions, dtype=np.float64)[..., None] * inv
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb) * scaling, np.sin(emb) * scaling
