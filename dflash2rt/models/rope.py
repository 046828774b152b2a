"""Rotary position embeddings: HF-compatible inverse frequencies (default, linear, llama3, yarn) and rotation."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from dflash2rt.errors import CheckpointError
from dflash2rt.ops.fused import apply_rotary, rotate_half  # noqa: F401 - the rotation, re-exported

# Keys each rope type may carry in `rope_parameters` / `rope_scaling` (besides rope_type/type/rope_theta).
_TYPE_KEYS: dict[str, frozenset[str]] = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}),
    "yarn": frozenset(
        {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
         "mscale", "mscale_all_dim", "truncate"}
    ),
}
_UNSUPPORTED = {
    "dynamic": "its frequencies depend on the longest sequence of each forward call (stateful, batch-dependent)",
    "longrope": "it switches frequency sets on sequence length",
}


# Fields that must be finite numbers > 0 when given (theta always); yarn's betas may also be 0,
# which transformers reads as unset (``beta_fast or 32``).
_POSITIVE = ("theta", "factor", "low_freq_factor", "high_freq_factor", "attention_factor")
_BETAS = ("beta_fast", "beta_slow")


def check_original_max(value: object) -> None:
    """original_max_position_embeddings: None or an integer in [1, 2**53] (exact as a float; a
    float with an integer value counts)."""
    if value is not None and not (_finite(value) and float(value).is_integer()
                                  and 1 <= value <= 2**53):
        raise CheckpointError(f"rope original_max_position_embeddings must be an integer in "
                              f"[1, 2**53], got {value!r:.60}")


def _finite(value: object) -> bool:
    """A number (not a bool) that is finite as a float (an int past float's range is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _finite_positive(value: object) -> bool:
    return _finite(value) and value > 0


@dataclass(frozen=True)
class RopeConfig:
    """One rope variant; fields that a type does not use stay None."""

    rope_type: str = "default"
    theta: float = 10000.0
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        for name in _POSITIVE:
            value = getattr(self, name)
            if (value is not None or name == "theta") and not _finite_positive(value):
                raise CheckpointError(f"rope {'rope_theta' if name == 'theta' else name} must "
                                      f"be a finite number > 0, got {value!r:.60}")
        for name in _BETAS:
            value = getattr(self, name)
            if value is not None and not (_finite(value) and value >= 0):
                raise CheckpointError(f"rope {name} must be a finite number >= 0 (0: the default), "
                                      f"got {value!r:.60}")
        for name in ("mscale", "mscale_all_dim"):
            value = getattr(self, name)
            if value is not None and not _finite(value):
                raise CheckpointError(f"rope {name} must be a finite number, got {value!r:.60}")
        check_original_max(self.original_max_position_embeddings)
        if not (isinstance(self.truncate, bool)
                or _finite(self.truncate) and self.truncate in (0, 1)):
            raise CheckpointError(f"rope truncate must be true or false, got {self.truncate!r:.60}")
        object.__setattr__(self, "truncate", bool(self.truncate))
        if self.rope_type not in _TYPE_KEYS:
            raise CheckpointError(f"rope type {self.rope_type!r} is not supported (supported: {sorted(_TYPE_KEYS)})")
        if self.rope_type != "default" and self.factor is None:
            raise CheckpointError(f"rope type {self.rope_type!r} needs rope_parameters.factor")
        if self.rope_type == "llama3" and (self.low_freq_factor is None or self.high_freq_factor is None):
            raise CheckpointError("rope type 'llama3' needs rope_parameters.low_freq_factor and high_freq_factor")
        if self.rope_type == "llama3" and not self.low_freq_factor < self.high_freq_factor:
            raise CheckpointError(f"rope type 'llama3' needs low_freq_factor < high_freq_factor "
                                  f"(its blend divides by their difference), got "
                                  f"{self.low_freq_factor} and {self.high_freq_factor}")

    def to_hf_dict(self) -> dict[str, Any] | None:
        """The `rope_scaling` dict HF reads (None for plain rope); rope_theta is written separately."""
        if self.rope_type == "default":
            return None
        out: dict[str, Any] = {"rope_type": self.rope_type}
        for key in sorted(_TYPE_KEYS[self.rope_type] - {"truncate"}):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.rope_type == "yarn" and not self.truncate:
            out["truncate"] = False
        return out


def rope_from_hf(d: dict[str, Any], max_position_embeddings: int) -> RopeConfig:
    """Parse a config.json's rope keys the way transformers does (`rope_scaling` wins over `rope_parameters`)."""
    raw = d.get("rope_scaling") or d.get("rope_parameters") or {}
    if not isinstance(raw, dict):
        raise CheckpointError(f"rope_parameters must be a dict, got {type(raw).__name__}")
    raw = dict(raw)
    rope_type = raw.pop("rope_type", None) or raw.pop("type", "default")
    raw.pop("type", None)
    if not isinstance(rope_type, str):
        raise CheckpointError(f"rope type must be a string, got {rope_type!r}")
    if rope_type in _UNSUPPORTED:
        raise CheckpointError(f"rope type {rope_type!r} is not supported: {_UNSUPPORTED[rope_type]}")
    if rope_type not in _TYPE_KEYS:
        raise CheckpointError(f"rope type {rope_type!r} is not supported (supported: {sorted(_TYPE_KEYS)})")
    theta = raw.pop("rope_theta", None)
    theta = d.get("rope_theta", 10000.0) if theta is None else theta
    partial = raw.pop("partial_rotary_factor", d.get("partial_rotary_factor"))
    if partial not in (None, 1, 1.0):
        raise CheckpointError(f"partial_rotary_factor={partial} is not supported (only 1.0)")
    for key in raw:
        if key not in _TYPE_KEYS[rope_type]:
            raise CheckpointError(f"unknown key rope_parameters.{key} for rope type {rope_type!r}")
    if rope_type in ("llama3", "yarn"):
        # transformers: a top-level original_max_position_embeddings overrides, else default to max_position.
        if d.get("original_max_position_embeddings") is not None:
            raw["original_max_position_embeddings"] = d["original_max_position_embeddings"]
        if raw.get("original_max_position_embeddings") is None:
            raw["original_max_position_embeddings"] = max_position_embeddings
    if rope_type == "yarn" and raw.get("factor") is None:
        check_original_max(raw["original_max_position_embeddings"])
        raw["factor"] = max_position_embeddings / raw["original_max_position_embeddings"]
    raw.setdefault("truncate", True)
    theta = float(theta) if _finite_positive(theta) else theta     # RopeConfig refuses the rest
    try:
        return RopeConfig(rope_type=rope_type, theta=theta, **raw)
    except TypeError as exc:  # a value of the wrong type reaches the dataclass
        raise CheckpointError(f"bad rope parameters {raw}: {exc}") from exc


def inv_freq(rope: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim // 2] (float32, CPU, bit-identical to transformers) and attention scaling."""
    dim = head_dim
    base = rope.theta
    if rope.rope_type == "yarn":
        return _yarn(rope, dim)
    exps = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").to(dtype=torch.float32) / dim  # [hd/2]
    inv = 1.0 / (base**exps)  # [hd/2]
    if rope.rope_type == "linear":
        inv = inv / rope.factor
    elif rope.rope_type == "llama3":
        inv = _llama3(rope, inv)
    return inv, 1.0


def _llama3(rope: RopeConfig, inv: torch.Tensor) -> torch.Tensor:
    factor, lo, hi = rope.factor, rope.low_freq_factor, rope.high_freq_factor
    old_ctx = rope.original_max_position_embeddings
    low_freq_wavelen = old_ctx / lo
    high_freq_wavelen = old_ctx / hi
    wavelen = 2 * math.pi / inv
    inv_llama = torch.where(wavelen > low_freq_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_llama)


def _yarn(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    base, factor = rope.theta, rope.factor
    orig = rope.original_max_position_embeddings

    def get_mscale(scale: float, mscale: float = 1) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = float(get_mscale(factor, rope.mscale) / get_mscale(factor, rope.mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = rope.beta_fast or 32
    beta_slow = rope.beta_slow or 1

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers: prevent a singular ramp
    idx = torch.arange(dim // 2, dtype=torch.float32, device="cpu")  # [hd/2]
    ramp = torch.clamp((idx - low) / (high - low), 0, 1)  # [hd/2]
    pos_freqs = base ** (torch.arange(0, dim, 2, device="cpu").to(dtype=torch.float32) / dim)  # [hd/2]
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    extra_factor = 1 - ramp
    inv = interpolation * (1 - extra_factor) + extrapolation * extra_factor
    return inv, attention_factor


def rope_cos_sin(
    inv: torch.Tensor, attention_scaling: float, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [*positions.shape, head_dim] in `dtype`; angles in float32, or float64 when dtype is float64."""
    cdt = torch.promote_types(dtype, torch.float32)
    freqs = positions[..., None].to(cdt) * inv.to(device=positions.device, dtype=cdt)  # [R, T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [R, T, hd]
    cos, sin = emb.cos(), emb.sin()
    if attention_scaling != 1.0:                     # ·1.0 is the identity: no launch for it
        cos, sin = cos * attention_scaling, sin * attention_scaling
    return cos.to(dtype), sin.to(dtype)


def rope_table(tables: dict, inv: torch.Tensor, attention_scaling: float, cover: int,
               device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """A model's cos | sin [n, 2·hd] of positions 0 .. n-1 (n >= ``cover``) on ``device`` in
    ``dtype``: ``rope_cos_sin``'s values, each position's computed once, in one call, kept in
    ``tables``. A longer cover grows it to at least twice its length; the old table stays
    referenced there (a captured graph may still read it)."""
    key = (_indexed(device), dtype)
    have = tables.get(key)
    if have is None or have.shape[0] < cover:
        n = cover if have is None else max(cover, 2 * have.shape[0])
        cos, sin = rope_cos_sin(inv, attention_scaling, torch.arange(n, device=device), dtype)
        if have is not None:
            tables.setdefault("retired", []).append(have)
        tables[key] = have = torch.cat((cos, sin), dim=-1)
    return have


def _indexed(device: torch.device | str) -> torch.device:
    """``device`` with its index (the current one where it names none), as tensors report it."""
    d = torch.device(device)
    if d.index is None and d.type not in ("cpu", "meta"):
        d = torch.device(d.type, getattr(torch, d.type).current_device())
    return d


def rope_at(table: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [*positions.shape, hd] at integer positions below the table's length: views of
    one gather from a ``rope_table``."""
    hd = table.shape[-1] // 2
    both = table[positions]                                  # [*positions.shape, 2·hd]
    return both[..., :hd], both[..., hd:]


class RopeTables:
    """``rope`` and ``rope_table`` of a model that holds ``rope_inv_freq_bits`` (its inverse
    frequencies as int32 bits) and ``attention_scaling``."""

    def rope(self, positions: torch.Tensor, dtype: torch.dtype, cover: int | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [*positions.shape, hd] of this model's rope at integer positions; ``cover``
        (positions are below it: a cache's ``max_len``): one gather from the model's table."""
        inv = self.rope_inv_freq_bits.view(torch.float32)
        if cover is None:
            return rope_cos_sin(inv, self.attention_scaling, positions, dtype)
        return rope_at(self.rope_table(positions.device, dtype, cover), positions)

    def rope_table(self, device: torch.device | str, dtype: torch.dtype, cover: int
                   ) -> torch.Tensor:
        """cos | sin of positions below at least ``cover`` (``rope_table``)."""
        return rope_table(self.__dict__.setdefault("_rope_tables", {}),
                          self.rope_inv_freq_bits.view(torch.float32), self.attention_scaling,
                          cover, device, dtype)
