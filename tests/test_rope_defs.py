"""Rope config, frequencies, angles and tables against HF's definitions written anew in floats."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from dflash2rt.errors import CheckpointError
from dflash2rt.models.rope import RopeConfig, RopeTables, inv_freq, rope_at, rope_cos_sin, \
    rope_from_hf, rope_table


def _plain(theta: float, dim: int) -> list[float]:
    """theta ** -(2i / dim), i < dim / 2."""
    return [theta ** -(2 * i / dim) for i in range(dim // 2)]


def _llama3(theta, dim, factor, lo, hi, ctx) -> list[float]:
    """Llama 3: long wavelengths divided by factor, short ones kept, a linear blend between."""
    out = []
    for f in _plain(theta, dim):
        wavelen = 2 * math.pi / f
        if wavelen > ctx / lo:
            out.append(f / factor)
        elif wavelen < ctx / hi:
            out.append(f)
        else:
            s = (ctx / wavelen - lo) / (hi - lo)
            out.append((1 - s) * f / factor + s * f)
    return out


def _yarn(theta, dim, factor, orig, beta_fast=32, beta_slow=1, truncate=True):
    """YaRN: interpolation weighted by a ramp between the correction dims of beta_fast and
    beta_slow (floor / ceil when truncating, kept inside [0, dim - 1], never zero-width)."""
    def corr(n):
        return dim * math.log(orig / (n * 2 * math.pi)) / (2 * math.log(theta))
    lo, hi = corr(beta_fast), corr(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    out = []
    for i, f in enumerate(_plain(theta, dim)):
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
        out.append(f / factor * ramp + f * (1 - ramp))
    return out


def _mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def _close(got: torch.Tensor, want: list[float], rtol=1e-6):
    assert got.dtype == torch.float32 and got.shape == (len(want),)
    for g, w in zip(got.tolist(), want):
        assert abs(g - w) <= rtol * abs(w), (got.tolist(), want)


@pytest.mark.parametrize("theta, dim", [(10000.0, 16), (500000.0, 128), (10.0, 2), (1e6, 64)])
def test_default_and_linear_frequencies(theta, dim):
    inv, scale = inv_freq(RopeConfig(theta=theta), dim)
    _close(inv, _plain(theta, dim))
    assert scale == 1.0
    inv, scale = inv_freq(RopeConfig("linear", theta, factor=4.0), dim)
    _close(inv, [f / 4 for f in _plain(theta, dim)])
    assert scale == 1.0


@pytest.mark.parametrize("ctx, lo, hi, bands", [
    (1024, 1.0, 8.0, (3, 2)),
    (4096, 2.0, 16.0, (4, 2)),
    (4096, 0.5, 4.0, (5, 2)),
])
def test_llama3_frequencies_in_each_band(ctx, lo, hi, bands):
    """theta 1e4, dim 16, factor 8: the short wavelengths kept, the middle ones blended, the
    long ones divided (bands: how many kept, how many blended)."""
    rope = RopeConfig("llama3", 10000.0, factor=8.0, low_freq_factor=lo, high_freq_factor=hi,
                      original_max_position_embeddings=ctx)
    want = _llama3(10000.0, 16, 8.0, lo, hi, ctx)
    f = _plain(10000.0, 16)
    kept, mid = bands
    assert [w == g for w, g in zip(want, f)] == [True] * kept + [False] * (8 - kept)
    assert [w == g / 8 for w, g in zip(want, f)] == [False] * (kept + mid) + \
        [True] * (8 - kept - mid)
    inv, scale = inv_freq(rope, 16)
    _close(inv, want)
    assert scale == 1.0


@pytest.mark.parametrize("kw", [
    dict(orig=256),                                   # ramp from dim 0 to 4, clamped above
    dict(orig=256, truncate=False),                   # the default betas' own ends
    dict(orig=256, beta_fast=4),                      # ramp from 2: clamped below too
    dict(orig=256, beta_fast=4, truncate=False),      # fractional ends
    dict(orig=16),                                    # the fast end below 0: kept at 0
    dict(orig=10 ** 9, beta_fast=10 ** 6),            # the slow end past dim - 1
    dict(orig=256, beta_fast=2, beta_slow=2, truncate=False),    # zero width: + 0.001
])
def test_yarn_frequencies(kw):
    orig = kw.pop("orig")
    rope = RopeConfig("yarn", 10000.0, factor=4.0, original_max_position_embeddings=orig,
                      beta_fast=kw.get("beta_fast"), beta_slow=kw.get("beta_slow"),
                      truncate=kw.get("truncate", True))
    inv, scale = inv_freq(rope, 16)
    _close(inv, _yarn(10000.0, 16, 4.0, orig, **kw))
    assert scale == pytest.approx(_mscale(4.0), rel=1e-12)


def test_yarn_ramp_cases_differ():
    """The parameter sets above each reach their own branch (a reference that ignored one
    would give the same list)."""
    base = _yarn(10000.0, 16, 4.0, 256)
    assert _yarn(10000.0, 16, 4.0, 256, beta_fast=4) != base
    assert _yarn(10000.0, 16, 4.0, 256, beta_fast=4, truncate=False) != \
        _yarn(10000.0, 16, 4.0, 256, beta_fast=4)
    ramp = _yarn(10000.0, 16, 4.0, 256, beta_fast=2, beta_slow=2, truncate=False)
    plain = _plain(10000.0, 16)
    assert all(r in (p, p / 4) for r, p in zip(ramp, plain))      # a step, no blend


@pytest.mark.parametrize("factor, att, m, m_all, want", [
    (4.0, None, None, None, 0.1 * math.log(4.0) + 1),
    (1.0, None, None, None, 1.0),                          # no scaling at factor <= 1
    (0.5, None, None, None, 1.0),
    (4.0, 0.7, None, None, 0.7),                           # given: kept as is
    (4.0, 0.7, 2.0, 1.0, 0.7),
    (4.0, None, 2.0, 1.0, (0.2 * math.log(4) + 1) / (0.1 * math.log(4) + 1)),
    (4.0, None, 2.0, None, 0.1 * math.log(4.0) + 1),       # both mscales or neither
    (4.0, None, None, 2.0, 0.1 * math.log(4.0) + 1),
    (1.0, None, 2.0, 1.0, 1.0),
])
def test_yarn_attention_factor(factor, att, m, m_all, want):
    rope = RopeConfig("yarn", 10000.0, factor=factor, original_max_position_embeddings=256,
                      attention_factor=att, mscale=m, mscale_all_dim=m_all)
    assert inv_freq(rope, 16)[1] == pytest.approx(want, rel=1e-12, abs=0)


def test_yarn_zero_betas_take_the_defaults():
    rope = RopeConfig("yarn", 10000.0, factor=4.0, original_max_position_embeddings=256,
                      beta_fast=0, beta_slow=0, truncate=False)
    _close(inv_freq(rope, 16)[0], _yarn(10000.0, 16, 4.0, 256, 32, 1, truncate=False))


def _angles32(inv: list[float], p: int) -> list[float]:
    """float32(p · inv) (the product of an int below 2**29 and a float32 is exact in float64)."""
    return [float(np.float32(p * f)) for f in inv]


@pytest.mark.parametrize("scale", [1.0, 1.5, 0.25])
def test_cos_sin_of_each_position(scale):
    inv32 = torch.tensor(_plain(10000.0, 8), dtype=torch.float32)
    inv = inv32.tolist()
    pos = torch.tensor([[0, 1, 7], [300, 2, 5]])
    cos, sin = rope_cos_sin(inv32, scale, pos, torch.float32)
    assert cos.shape == sin.shape == (2, 3, 8) and cos.dtype == torch.float32
    for r in range(2):
        for t in range(3):
            a = _angles32(inv, int(pos[r, t]))
            for j in range(8):
                assert cos[r, t, j].item() == pytest.approx(scale * math.cos(a[j % 4]), abs=1e-6)
                assert sin[r, t, j].item() == pytest.approx(scale * math.sin(a[j % 4]), abs=1e-6)
    c64, s64 = rope_cos_sin(inv32, scale, pos, torch.float64)
    assert c64.dtype == torch.float64
    for r in range(2):
        for t in range(3):
            for j in range(8):
                a = int(pos[r, t]) * inv[j % 4]                 # float64 angles
                assert c64[r, t, j].item() == pytest.approx(scale * math.cos(a), abs=1e-13)
                assert s64[r, t, j].item() == pytest.approx(scale * math.sin(a), abs=1e-13)


def test_table_grows_only_past_its_length_and_gathers():
    inv = torch.tensor(_plain(10000.0, 4), dtype=torch.float32)
    tables: dict = {}
    t5 = rope_table(tables, inv, 2.0, 5, "cpu", torch.float32)
    assert t5.shape == (5, 8)
    assert rope_table(tables, inv, 2.0, 5, "cpu", torch.float32) is t5      # cover == length
    assert rope_table(tables, inv, 2.0, 1, "cpu", torch.float32) is t5
    assert "retired" not in tables
    t64 = rope_table(tables, inv, 2.0, 3, "cpu", torch.float64)             # own dtype key
    assert t64.shape == (3, 8) and t64.dtype == torch.float64
    t10 = rope_table(tables, inv, 2.0, 6, "cpu", torch.float32)             # doubled
    assert t10.shape == (10, 8) and tables["retired"] == [t5]
    t25 = rope_table(tables, inv, 2.0, 25, "cpu", torch.float32)            # cover beyond 2n
    assert t25.shape == (25, 8) and len(tables["retired"]) == 2
    for p in range(25):
        a = _angles32(inv.tolist(), p)
        want = [2 * math.cos(x) for x in a] * 2 + [2 * math.sin(x) for x in a] * 2
        assert t25[p].tolist() == pytest.approx(want, abs=2e-6)
    pos = torch.tensor([[24, 0], [3, 3]])
    cos, sin = rope_at(t25, pos)
    assert cos.shape == sin.shape == (2, 2, 4)
    for r in range(2):
        for t in range(2):
            assert torch.equal(cos[r, t], t25[pos[r, t], :4])
            assert torch.equal(sin[r, t], t25[pos[r, t], 4:])


class _Model(RopeTables):
    def __init__(self, inv: torch.Tensor, scale: float):
        self.rope_inv_freq_bits = inv.view(torch.int32)
        self.attention_scaling = scale


def test_model_rope_with_and_without_cover():
    inv = torch.tensor(_plain(500.0, 8), dtype=torch.float32)
    m = _Model(inv, 0.5)
    pos = torch.tensor([[0, 9], [4, 1]])
    for cover in (None, 10, 30):
        cos, sin = m.rope(pos, torch.float32, cover)
        for r in range(2):
            for t in range(2):
                a = _angles32(inv.tolist(), int(pos[r, t]))
                assert cos[r, t].tolist() == pytest.approx([0.5 * math.cos(x) for x in a] * 2,
                                                           abs=1e-6)
                assert sin[r, t].tolist() == pytest.approx([0.5 * math.sin(x) for x in a] * 2,
                                                           abs=1e-6)
    assert m.rope_table("cpu", torch.float32, 10).shape[0] == 30


# --- RopeConfig's domain and its HF dict ---------------------------------------------------

@pytest.mark.parametrize("field", ["theta", "factor"])
@pytest.mark.parametrize("value", [0, 0.0, -1.0, -1e-300, math.inf, -math.inf, math.nan, True,
                                   False, "2", None])
def test_theta_and_factor_must_be_finite_and_positive(field, value):
    kw = {"rope_type": "linear", "theta": 10000.0, "factor": 2.0, field: value}
    if value is None:                   # factor None: refused where the type needs it
        if field == "factor":
            with pytest.raises(CheckpointError, match="needs rope_parameters.factor"):
                RopeConfig(**kw)
            assert RopeConfig(theta=10.0, factor=None).factor is None
        return
    name = "rope_theta" if field == "theta" else "factor"
    with pytest.raises(CheckpointError, match=f"rope {name} must be a finite number > 0"):
        RopeConfig(**kw)


@pytest.mark.parametrize("field", ["theta", "factor"])
@pytest.mark.parametrize("value", [1e-300, 1, 0.5, 1e300, 5e-324])
def test_theta_and_factor_small_and_large_are_kept(field, value):
    kw = {"rope_type": "linear", "theta": 10000.0, "factor": 2.0, field: value}
    assert getattr(RopeConfig(**kw), field) == value


def test_types_and_their_required_fields():
    with pytest.raises(CheckpointError, match="'dynamic' is not supported"):
        RopeConfig("dynamic", factor=2.0)
    for t in ("linear", "llama3", "yarn"):
        with pytest.raises(CheckpointError, match="needs rope_parameters.factor"):
            RopeConfig(t, low_freq_factor=1.0, high_freq_factor=4.0)
    assert RopeConfig("default").factor is None
    assert RopeConfig().theta == 10000.0 and RopeConfig().truncate is True
    RopeConfig("linear", factor=2.0)
    RopeConfig("yarn", factor=2.0)
    for lo, hi in ((None, 4.0), (1.0, None), (None, None)):
        with pytest.raises(CheckpointError, match="low_freq_factor and high_freq_factor"):
            RopeConfig("llama3", factor=8.0, low_freq_factor=lo, high_freq_factor=hi)
    RopeConfig("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)


def test_hf_dict():
    assert RopeConfig().to_hf_dict() is None
    assert RopeConfig("linear", factor=2.0).to_hf_dict() == {"rope_type": "linear", "factor": 2.0}
    full = RopeConfig("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=64)
    assert full.to_hf_dict() == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    y = RopeConfig("yarn", factor=2.0, beta_fast=8.0)
    assert y.to_hf_dict() == {"rope_type": "yarn", "factor": 2.0, "beta_fast": 8.0}
    y = RopeConfig("yarn", factor=2.0, truncate=False)
    assert y.to_hf_dict() == {"rope_type": "yarn", "factor": 2.0, "truncate": False}


# --- rope_from_hf ---------------------------------------------------------------------------

def test_from_hf_defaults_and_theta():
    assert rope_from_hf({}, 100) == RopeConfig()
    assert rope_from_hf({"rope_theta": 5.0}, 100) == RopeConfig(theta=5.0)
    assert rope_from_hf({"rope_theta": 5}, 100).theta == 5.0
    got = rope_from_hf({"rope_theta": 5.0, "rope_parameters": {"rope_theta": 7.0}}, 100)
    assert got == RopeConfig(theta=7.0)
    for bad in (True, "1e4", [1]):
        with pytest.raises(CheckpointError, match="rope_theta"):
            rope_from_hf({"rope_theta": bad}, 100)
    with pytest.raises(CheckpointError, match="rope_theta"):
        rope_from_hf({"rope_parameters": {"rope_theta": 0}}, 100)


def test_from_hf_scaling_wins_and_type_keys():
    lin = {"rope_type": "linear", "factor": 2.0}
    d = {"rope_scaling": lin, "rope_parameters": {"rope_type": "linear", "factor": 3.0}}
    assert rope_from_hf(d, 100) == RopeConfig("linear", factor=2.0)
    assert rope_from_hf({"rope_scaling": None, "rope_parameters": lin}, 100).factor == 2.0
    assert rope_from_hf({"rope_scaling": {"type": "linear", "factor": 2.0}}, 100).factor == 2.0
    both = {"rope_type": "linear", "type": "yarn", "factor": 2.0}
    assert rope_from_hf({"rope_scaling": both}, 100) == RopeConfig("linear", factor=2.0)
    assert lin == {"rope_type": "linear", "factor": 2.0}            # the input is not consumed
    with pytest.raises(CheckpointError, match="must be a dict, got list"):
        rope_from_hf({"rope_scaling": [1]}, 100)
    for t in ("dynamic", "longrope"):
        with pytest.raises(CheckpointError, match=f"'{t}' is not supported: "):
            rope_from_hf({"rope_scaling": {"rope_type": t, "factor": 2.0}}, 100)
    with pytest.raises(CheckpointError, match=r"'ntk' is not supported \(supported"):
        rope_from_hf({"rope_scaling": {"rope_type": "ntk", "factor": 2.0}}, 100)


@pytest.mark.parametrize("where", ["inside", "top"])
@pytest.mark.parametrize("value, ok", [(None, True), (1, True), (1.0, True), (0.5, False),
                                       (0, False), (2, False)])
def test_from_hf_partial_rotary_factor(where, value, ok):
    d = ({"rope_parameters": {"partial_rotary_factor": value}} if where == "inside"
         else {"partial_rotary_factor": value})
    if ok:
        assert rope_from_hf(d, 100) == RopeConfig()
    else:
        with pytest.raises(CheckpointError, match="partial_rotary_factor"):
            rope_from_hf(d, 100)


def test_from_hf_unknown_keys_are_per_type():
    with pytest.raises(CheckpointError, match=r"rope_parameters\.factor for rope type 'default'"):
        rope_from_hf({"rope_parameters": {"factor": 2.0}}, 100)
    with pytest.raises(CheckpointError, match=r"rope_parameters\.beta_fast"):
        rope_from_hf({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "beta_fast": 1}}, 100)
    for key in ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
                "beta_slow", "mscale", "mscale_all_dim", "truncate"):
        value = True if key == "truncate" else 2.0
        rope_from_hf({"rope_scaling": {"rope_type": "yarn", "factor": 2.0, key: value}}, 100)


def test_from_hf_original_context_and_yarn_factor():
    l3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    assert rope_from_hf({"rope_scaling": l3}, 2048).original_max_position_embeddings == 2048
    got = rope_from_hf({"rope_scaling": {**l3, "original_max_position_embeddings": 64}}, 2048)
    assert got.original_max_position_embeddings == 64
    top = {"rope_scaling": {**l3, "original_max_position_embeddings": 64},
           "original_max_position_embeddings": 32}
    assert rope_from_hf(top, 2048).original_max_position_embeddings == 32     # top level wins
    top["original_max_position_embeddings"] = None
    assert rope_from_hf(top, 2048).original_max_position_embeddings == 64
    lin = rope_from_hf({"rope_scaling": {"rope_type": "linear", "factor": 2.0},
                        "original_max_position_embeddings": 32}, 2048)
    assert lin.original_max_position_embeddings is None                     # llama3 / yarn only
    y = rope_from_hf({"rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings":
                                       512}}, 2048)
    assert y.factor == 4.0 and y.truncate is True
    y = rope_from_hf({"rope_scaling": {"rope_type": "yarn", "factor": None}}, 2048)
    assert y.factor == 1.0 and y.original_max_position_embeddings == 2048
    y = rope_from_hf({"rope_scaling": {"rope_type": "yarn", "factor": 3.0, "truncate": 0}}, 2048)
    assert y.factor == 3.0 and y.truncate is False
    with pytest.raises(CheckpointError, match="needs rope_parameters.factor"):
        rope_from_hf({"rope_scaling": {"rope_type": "linear"}}, 2048)


def test_config_is_frozen_and_hashable():
    """Validated once: a field cannot be changed afterwards (it would skip the checks)."""
    cfg = RopeConfig("linear", factor=2.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.factor = -1.0
    assert {cfg: 1}[RopeConfig("linear", factor=2.0)] == 1


def test_llama3_at_the_long_wavelength_edge():
    """A wavelength equal to ctx / lo is blended (not divided first): at that edge the blend
    weight is 0, so the frequency is f / factor, not f / factor²."""
    lo = 4096 / float(np.float32(2 * math.pi))            # wavelength of f = 1 in float32
    rope = RopeConfig("llama3", 10000.0, factor=8.0, low_freq_factor=lo, high_freq_factor=2 * lo,
                      original_max_position_embeddings=4096)
    inv = inv_freq(rope, 16)[0]
    assert inv[0].item() == pytest.approx(1 / 8, rel=1e-5)
    _close(inv, _llama3(10000.0, 16, 8.0, lo, 2 * lo, 4096), rtol=1e-5)


def test_yarn_zero_width_ramp_is_a_thousandth_wide():
    """beta_fast == beta_slow, untruncated, with the ramp's start 0.0005 below dim 3: the
    ramp is 0.001 wide, so dim 3 sits at its middle."""
    b = 256 / (2 * math.pi) / math.exp(2.9995 * 2 * math.log(10000.0) / 16)
    rope = RopeConfig("yarn", 10000.0, factor=4.0, original_max_position_embeddings=256,
                      beta_fast=b, beta_slow=b, truncate=False)
    want = _yarn(10000.0, 16, 4.0, 256, b, b, truncate=False)
    f = _plain(10000.0, 16)
    assert want[3] == pytest.approx((f[3] + f[3] / 4) / 2, rel=1e-9)
    _close(inv_freq(rope, 16)[0], want, rtol=2e-3)


def test_device_keys_carry_an_index(monkeypatch):
    """Tables are keyed by indexed devices: an accelerator named without an index is the
    current one, one with an index keeps it; cpu and meta have none."""
    from dflash2rt.models.rope import _indexed
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert _indexed("cuda") == torch.device("cuda", 3)
    assert _indexed("cuda:1") == torch.device("cuda", 1)
    assert _indexed(torch.device("cuda", 0)) == torch.device("cuda", 0)
    assert _indexed("cpu") == torch.device("cpu") and _indexed("meta") == torch.device("meta")


_VALID = {"llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 64},
          "yarn": {"factor": 4.0, "original_max_position_embeddings": 64},
          "linear": {"factor": 2.0}}
# Each key's values outside its domain (HF's types: positive factors, betas >= 0, finite
# mscales, a context length in [1, 2**53], a boolean truncate).
_BAD = {"factor": [0, -1.0, float("nan"), float("inf"), 10**400, "2", True, [2.0]],
        "low_freq_factor": [0, -1.0, float("nan"), 10**400, "1", True],
        "high_freq_factor": [0, -4.0, float("inf"), 10**400, None, "4"],
        "attention_factor": [0, -1.0, float("nan"), 10**400, "1"],
        "beta_fast": [-1.0, float("nan"), 10**400, "32", True],
        "beta_slow": [-0.5, float("inf"), "1", [1]],
        "mscale": [float("nan"), float("inf"), 10**400, "1", False],
        "mscale_all_dim": [float("-inf"), "0.7", [1]],
        "original_max_position_embeddings": [0, -64, 2.5, float("nan"), 2**53 + 1, "64", True],
        "truncate": ["false", 2, 0.5, None, [False]]}


@pytest.mark.parametrize("typ", sorted(_VALID))
def test_every_rope_key_outside_its_domain_is_a_checkpoint_error(typ):
    from dflash2rt.models.rope import _TYPE_KEYS

    for key in sorted(_TYPE_KEYS[typ]):
        for bad in _BAD[key]:
            cfg = {"rope_type": typ, **_VALID[typ], key: bad}
            if bad is None and key not in _VALID[typ]:
                continue
            with pytest.raises(CheckpointError, match=f"rope.*{key}|{key}.*rope"):
                rope_from_hf({"rope_scaling": cfg}, 256)


def test_llama3_needs_low_below_high_and_betas_may_be_zero():
    cfg = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64}
    for low, high in ((4.0, 4.0), (4.0, 1.0)):
        with pytest.raises(CheckpointError, match="low_freq_factor < high_freq_factor"):
            rope_from_hf({"rope_scaling": {**cfg, "low_freq_factor": low,
                                           "high_freq_factor": high}}, 256)
    y = rope_from_hf({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 0,
                                       "beta_slow": 0, "truncate": 1}}, 256)
    assert (y.beta_fast, y.beta_slow, y.truncate) == (0, 0, True)
    assert bool(torch.isfinite(inv_freq(y, 16)[0]).all())
    huge = {"rope_theta": 10**400}
    with pytest.raises(CheckpointError, match="rope_theta must be a finite number > 0"):
        rope_from_hf(huge, 256)
    with pytest.raises(CheckpointError, match="rope_theta must be a finite number > 0"):
        RopeConfig(theta=None)
    explicit_null = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": None}
    assert rope_from_hf({"rope_scaling": explicit_null}, 256).original_max_position_embeddings \
        == 256
