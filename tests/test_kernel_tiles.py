"""Every tiled kernel dimension tested past its first tile (interpreter), and the list of them."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import numpy as np
import pytest
import torch

from dflash2rt.kernels.tuning import Tuning
from dflash2rt.ops import conv as ref_conv
from dflash2rt.ops import selector as ref_sel
from dflash2rt.ops import verify as ref_ver
from dflash2rt.ops.attention import attention as ref_attention
from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.plugin_kit import interpreting
from dflash2rt.watermark import WatermarkKey, values
from dflash2rt.watermark import generate as wmgen

KERNELS = Path(__file__).resolve().parents[1] / "dflash2rt" / "kernels"
# kernel → tile constexpr → (the dimension it tiles, from the launch's arguments; whether the
# tile covers that dimension in every launch (a lane tile: checked on every launch below); the
# test that crosses it: past its first tile, or for a covering tile past its smallest size;
# "FILE::test" names one in another test file). A new tile constant needs a row here
# (test_every_tile_constant_has_a_crossing_test).
TILES = {
    "conv._conv_kernel": {"BLOCK_H": (lambda a: a["H"], False, "test_conv_past_the_channel_tile")},
    "selector._walk_kernel": {
        "BLOCK_K": (lambda a: a["K"], True, None), "BLOCK_R": (lambda a: a["RANK"], True, None),
        "BLOCK_H": (lambda a: a["H"], True, None),
        "BLOCK_G": (lambda a: a["GAMMA"], True, "test_walk_past_the_slot_tile"),
        "BLOCK_M": (lambda a: a["M"], False, "test_walk_reads_the_record_past_its_first_chunk")},
    "verify._verify_kernel": {
        "BLOCK_V": (lambda a: a["V"], False, "test_verify_scans_every_vocabulary_chunk"),
        "BLOCK_K": (lambda a: a["K"], True, None)},
    "attention._attention_kernel": {
        "BLOCK_M": (lambda a: a["T"] * a["G"], False, "test_attention_past_the_row_and_key_tiles"),
        "BLOCK_N": (lambda a: a["L"], False, "test_attention_past_the_row_and_key_tiles"),
        "BLOCK_D": (lambda a: a["HD"], True, None)},
    "watermark._values_kernel": {
        "BLOCK": (lambda a: a["N"], False, "test_keyed_values_past_one_block"),
        "BLOCK_H": (lambda a: a["H"], True, None)},
    "noise._noise_kernel": {"BLOCK": (lambda a: a["n"], False, "test_step_kernels.py::"
                                      "test_noise_kernel_equals_philox_bit_for_bit")},
    "norm._rms_norm_kernel": {"BLOCK_H": (lambda a: a["H"], False, "test_step_kernels.py::"
                                         "test_rms_norm_kernel_past_its_channel_tile")},
    "rope._prologue_kernel": {"BLOCK_D": (lambda a: a["HD"], True, None)},
    "topk._topk_kernel": {
        "BLOCK_N": (lambda a: a["N"], False, "test_topk_kernel.py::"
                    "test_topk_kernel_past_its_vocabulary_tile_and_row_block"),
        "BLOCK_V": (lambda a: a["V"], False, "test_topk_kernel.py::"
                    "test_topk_kernel_past_its_vocabulary_tile_and_row_block")},
}
# Tuning field → the launch constant it sets (num_warps is no tile).
TUNED = {"block_h": ("conv._conv_kernel", "BLOCK_H"),
         "block_v": ("verify._verify_kernel", "BLOCK_V"),
         "attn_block_m": ("attention._attention_kernel", "BLOCK_M"),
         "attn_block_n": ("attention._attention_kernel", "BLOCK_N")}
SMALL = Tuning(block_h=16, block_v=32, attn_block_m=16, attn_block_n=16)


def launched_tiles() -> dict[str, set[str]]:
    """Read from the kernel sources: each kernel that is launched (``launch(kernel, ...)``) →
    its ``BLOCK*`` constexpr parameters."""
    out: dict[str, set[str]] = {}
    for path in sorted(KERNELS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        jit = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
               and any("jit" in ast.unparse(d) for d in f.decorator_list)}
        for call in ast.walk(tree):
            if isinstance(call, ast.Call) and ast.unparse(call.func) == "launch" and call.args \
                    and isinstance(call.args[0], ast.Name) and call.args[0].id in jit:
                fn = jit[call.args[0].id]
                out[f"{path.stem}.{fn.name}"] = {
                    a.arg for a in fn.args.args if a.arg.startswith("BLOCK")
                    and a.annotation is not None and "constexpr" in ast.unparse(a.annotation)}
    return out


def test_every_tile_constant_has_a_crossing_test():
    """The launched kernels' tile constants are exactly TILES (a new one needs its row and a
    test that crosses it), each named test exists, and every tile field of Tuning is in TUNED."""
    found = launched_tiles()
    assert found, "no launched kernel found in dflash2rt/kernels"
    listed = {k: set(v) for k, v in TILES.items()}
    assert found == listed, f"tile constants in the kernels: {found}; TILES lists {listed}"
    for kernel, per in TILES.items():
        for block, (_, covers, test) in per.items():
            assert covers or test, f"{kernel} {block} loops over tiles: name the test crossing it"
            assert test is None or _test_exists(test), f"{kernel} {block}: no test {test}"
    fields = {f.name for f in dataclasses.fields(Tuning)} - {"num_warps"}
    assert fields == set(TUNED), f"Tuning's tile fields {fields} vs TUNED {set(TUNED)}"


def _test_exists(name: str) -> bool:
    """A test function of this module, or "FILE::test" of another file under tests/."""
    if "::" not in name:
        return callable(globals().get(name))
    path, fn = name.split("::")
    tree = ast.parse((Path(__file__).parent / path).read_text(encoding="utf-8"))
    return any(isinstance(f, ast.FunctionDef) and f.name == fn for f in tree.body)


@pytest.fixture
def rec():
    """The launches a test makes; on leaving, each covering tile of each launch is checked to
    cover its dimension."""
    pytest.importorskip("triton", reason="triton is not installed (dflash2rt[triton])")
    if not interpreting():
        pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present)")
    from dflash2rt.kernels.launch import recording

    with recording() as launches:
        yield launches
    for x in launches.by_key.values():
        for block, (dim, covers, _) in TILES[x.name].items():
            if covers:
                a = _args(x)
                assert a[block] >= dim(a), f"{x.name}: {block} = {a[block]} < {dim(a)}"


def _args(x) -> dict:
    names = inspect.signature(getattr(x.kernel, "fn", x.kernel)).parameters
    return dict(zip(names, x.args)) | x.kwargs


def crossed(launches, kernel: str, block: str, tiles: int = 2, tuned: int | None = None):
    """Some launch of ``kernel`` spans at least ``tiles`` tiles of ``block`` (and, ``tuned``,
    with the tile the Tuning asked for)."""
    dim = TILES[kernel][block][0]
    seen = [(_args(x)[block], dim(_args(x))) for x in launches.by_key.values() if x.name == kernel]
    assert any(d > (tiles - 1) * b for b, d in seen), f"{kernel} {block}: (tile, dim) {seen}"
    if tuned is not None:
        assert {b for b, _ in seen} == {tuned}, f"{kernel} {block}: tiles {seen}, tuned {tuned}"


def test_conv_past_the_channel_tile(rec):
    """52 channels in tiles of 16 (four programs a row, the last partial), groups of 4 across
    the tiles' edges."""
    from dflash2rt.kernels import conv

    g = torch.Generator().manual_seed(3)
    block, taps, h, groups = 4, 3, 52, 13
    x, a = torch.randn(3 * block, h, generator=g), torch.randn(3 * block, h, generator=g)
    base = torch.randn(taps, h, generator=g)
    delta = torch.randn(3 * block, taps, groups, generator=g)
    assert torch.equal(conv.conv_prepare(x, base, delta, block, SMALL),
                       ref_conv.conv_prepare(x, base, delta, block))
    torch.testing.assert_close(conv.conv_finish(x, a, base, delta, block, SMALL),
                               ref_conv.conv_finish(x, a, base, delta, block), rtol=0, atol=1e-6)
    crossed(rec, "conv._conv_kernel", "BLOCK_H", tiles=4, tuned=16)


def _verify_inputs(v=150, gamma=3, k=4, seed=5):
    """Six rows (two greedy, four sampled) whose decisive mass lies past the first 32-token
    chunk: greedy argmaxes in the last chunk, and sampled rows with p = 0 below id 64."""
    g = torch.Generator().manual_seed(seed)
    r = 6
    logits = torch.randn(r, gamma + 1, v, generator=g)
    logits[0, :, 140], logits[0, :, 97] = 9.0, 9.0               # a tie across chunks: 97
    logits[1, :, v - 1] = 9.0                                   # the last, partial chunk
    logits[2:, :, :64] = float("-inf")
    cand = torch.randint(64, v, (r, gamma, k), generator=g)
    q = torch.softmax(torch.randn(r, gamma, k, generator=g), -1)
    draft = cand[..., 0].clone()
    draft[0], draft[1] = 97, v - 1                               # greedy: accepted to the bonus
    sampling = SamplingBatch.build([0.0, 0.0, 1.0, 1.0, 0.7, 1.3], [0] * r, [1.0] * r)
    noise = BlockNoise.draw(torch.arange(r), torch.zeros(r, dtype=torch.long),
                            torch.arange(r) * 7 + seed, gamma)
    return logits, draft, cand, q, sampling, noise


@pytest.mark.parametrize("fp64", [True, False], ids=["fp64", "nofp64"])
@pytest.mark.parametrize("seed", range(3))
def test_verify_scans_every_vocabulary_chunk(rec, fp64, seed):
    """Greedy argmax, the sampled residual's two (float64) or three (float32) scans over
    150 tokens in chunks of 32: the kernel's verdicts equal the torch ops'."""
    from dflash2rt.kernels import verify

    args = _verify_inputs(seed=seed)
    got = verify.verify(*args, False, SMALL, has_fp64=fp64)
    want = ref_ver.verify(*args, check=False, has_fp64=fp64)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.accept_len, want.accept_len)
    assert torch.equal(got.bad, want.bad) and torch.equal(got.bad_q, want.bad_q)
    assert want.tokens[0].tolist() == [97] * 4 and want.tokens[1].tolist() == [149] * 4
    emitted = want.tokens[2:].gather(1, want.accept_len[2:].view(-1, 1))
    assert bool((emitted >= 64).all())                           # drawn past the first chunks
    crossed(rec, "verify._verify_kernel", "BLOCK_V", tiles=5, tuned=32)


def test_keyed_verify_scans_every_vocabulary_chunk(rec):
    """The watermark's keyed residual / bonus draw (fresh contexts) over the same chunks."""
    from dflash2rt.kernels import verify

    logits, draft, cand, q, sampling, noise = _verify_inputs(seed=9)
    wm = wmgen.WatermarkBatch.build(WatermarkKey(bytes(range(32))),
                                    [(i, i + 3, 2 * i) for i in range(6)], 16, 4, "cpu")
    marks = wm.marks(draft)
    got = verify.verify(logits, draft, cand, q, sampling, marks.noise(noise), False, SMALL,
                        marks=marks)
    want = ref_ver.verify(logits, draft, cand, q, sampling, wmgen.KeyedDraws(wm, noise), False)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.accept_len, want.accept_len)
    assert torch.equal(got.bad, want.bad)
    assert bool(marks.fresh[2:].all())
    crossed(rec, "verify._verify_kernel", "BLOCK_V", tiles=5, tuned=32)


def _walk(gamma: int, seed: int, v: int = 30, k: int = 5, rank: int = 4, r: int = 4):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(r, gamma, v, generator=g) * 2, torch.randn(r, gamma, rank, generator=g),
            torch.randint(0, v, (r,), generator=g), torch.randn(v, rank, generator=g),
            torch.randn(v, rank, generator=g), ref_sel.SelectorParams(k, 0.5, None),
            SamplingBatch.build([1.0, 0.8, 0.0, 1.3][:r], [0] * r, [1.0] * r),
            torch.rand(r, gamma, generator=g))


def _torch_walk(wm, *args):
    *rest, u = args
    return ref_sel.select(*rest, wmgen.KeyedDraws(wm, BlockNoise(u, u, u, u[:, 0])))


def _same_walk(got, want):
    assert torch.equal(got.draft, want.draft), (got.draft, want.draft)
    assert torch.equal(got.bad_lattice, want.bad_lattice)
    torch.testing.assert_close(got.q, want.q, rtol=0, atol=1e-6)


def test_walk_past_the_slot_tile(rec):
    """A watermarked walk of 40 slots, past the 32 lanes of the path's tile: the contexts of
    the slots after 32 read the picks there. The path leans to alternate 0, 1 (no lattice
    term), so some of those contexts repeat earlier slots' (not fresh) and some are fresh."""
    from dflash2rt.kernels import selector

    gamma = selector.GAMMA_TILE + 8
    args = _walk(gamma, 0, v=6, r=1)
    args[0][:, torch.arange(gamma), torch.arange(gamma) % 2] += 4.0
    args[3].zero_(), args[4].zero_()
    wm = wmgen.WatermarkBatch.build(WatermarkKey(bytes(range(1, 33))), [(1, 2)], 64, 4, "cpu")
    want = _torch_walk(wm, *args)
    _same_walk(selector.select(*args, wm=wm), want)
    for row in wm.marks(want.draft).fresh[:, selector.GAMMA_TILE:gamma]:
        assert not bool(row.all()) and bool(row.any())           # both kinds past the tile
    assert {_args(x)["GAMMA"] for x in rec.by_key.values() if x.name == "selector._walk_kernel"
            } == {gamma}


def test_walk_reads_the_record_past_its_first_chunk(rec):
    """A record of 600 contexts (chunks of 256): each row's slot-0 context is recorded at
    index 300 or 450, so that slot is not fresh (the seeded draw), as the torch ops say. Laws
    spread out enough that the keyed and the seeded draw differ in some row."""
    from dflash2rt.kernels import selector

    args = list(_walk(3, 0))
    args[0], args[3], args[4] = args[0] * 0.25, args[3] * 0.2, args[4] * 0.2
    wm = wmgen.WatermarkBatch.build(WatermarkKey(bytes(range(2, 34))),
                                    [(1, 2), (3,), (4, 5), (6,)], 600, 4, "cpu")
    free = _torch_walk(wm, *args)
    ctx0 = wm.contexts(free.draft)[:, 0]
    wm.record[:, :500] = torch.arange(500) * 7919 + 1           # other contexts
    wm.record[[0, 1, 2, 3], [300, 450, 300, 450]] = ctx0
    wm.used[:] = 500
    want = _torch_walk(wm, *args)
    assert not bool(wm.marks(want.draft).fresh[:, 0].any())
    assert bool((want.draft[:, 0] != free.draft[:, 0]).any())   # the record decides
    _same_walk(selector.select(*args, wm=wm), want)
    crossed(rec, "selector._walk_kernel", "BLOCK_M", tiles=2)


def test_attention_past_the_row_and_key_tiles(rec):
    """5 query rows × 4 heads of a group (20 rows: two tiles of 16) over 70 keys in tiles of
    16, some rows' ranges starting past the first key tile."""
    from dflash2rt.kernels import attention

    g = torch.Generator().manual_seed(11)
    r, t, n_kv, group, hd, n_keys = 2, 5, 2, 4, 24, 70
    q = torch.randn(r, t, n_kv * group, hd, generator=g)
    cache = torch.randn(2, r, n_keys + 9, n_kv, hd, generator=g)
    k, v = cache[0, :, :n_keys], cache[1, :, :n_keys]
    pos = torch.tensor([[60], [40]]) + torch.arange(t)
    lo = torch.tensor([[0], [37]]).expand(r, t).contiguous()
    hi = pos + 1
    got = attention.attention(q, k, v, lo, hi, hd ** -0.5, SMALL)
    want = ref_attention(q.double(), k.double(), v.double(), lo, hi, hd ** -0.5)   # float64
    torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=2e-6)
    crossed(rec, "attention._attention_kernel", "BLOCK_M", tiles=2, tuned=16)
    crossed(rec, "attention._attention_kernel", "BLOCK_N", tiles=4, tuned=16)


def test_keyed_values_past_one_block(rec):
    """1,500 rows of keyed values: the second program's rows equal the torch ops' too."""
    from dflash2rt.kernels.watermark import kernel_values

    g = np.random.default_rng(1)
    n = 1500
    ctx = torch.tensor(g.integers(-2**63, 2**63 - 1, n))
    tok = torch.tensor(g.integers(0, 200_000, n))
    win = torch.tensor(g.integers(-1, 200_000, (n, 4)))
    sub = WatermarkKey(bytes(range(3, 35))).target
    got = kernel_values(ctx=ctx, token=tok, windows=win, sub=sub)
    assert torch.equal(got["u"], values.keyed_uniforms(sub, ctx, tok))
    assert torch.equal(got["hash"], values.context_hash(win))
    crossed(rec, "watermark._values_kernel", "BLOCK", tiles=2)


def test_tuning_fields_reach_their_launch_constants(rec):
    """Each Tuning tile field sets the constant TUNED names: a launch with another value for
    it launches that value (the crossing tests above then use those small tiles)."""
    from dflash2rt.kernels import attention, conv, verify

    x = torch.randn(8, 40)
    conv.conv_prepare(x, torch.randn(2, 40), torch.zeros(8, 2, 5), 4, Tuning(block_h=32))
    verify.verify(*_verify_inputs(), False, Tuning(block_v=64))
    q = torch.randn(1, 16, 8, 16)                  # 64 rows: the default tile would be 64
    kv = torch.randn(1, 40, 2, 16)
    lo, hi = torch.zeros(1, 16, dtype=torch.long), torch.full((1, 16), 40)
    attention.attention(q, kv, kv, lo, hi, 0.25, Tuning(attn_block_m=32, attn_block_n=32))
    want = {"block_h": 32, "block_v": 64, "attn_block_m": 32, "attn_block_n": 32}
    for name, (kernel, block) in TUNED.items():
        got = {_args(x)[block] for x in rec.by_key.values() if x.name == kernel}
        assert got == {want[name]}, (name, got)
