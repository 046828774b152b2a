"""The watermark's keyed draws in the Triton kernels (interpreter) against the torch ops, bit for
bit: Philox words, context hashes, keyed uniforms and -log values; the keyed walk and
the keyed residual / bonus draw on batches with fresh, recorded and repeated contexts, greedy rows
and broken laws; and the engine on triton-interpret against cpu."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash2rt.ops import selector as ops_selector
from dflash2rt.ops import verify as ops_verify
from dflash2rt.ops.batch import BlockNoise, SamplingBatch
from dflash2rt.ops.rng import philox_np
from dflash2rt.ops.sampling import target_probs
from dflash2rt.ops.selector import SelectorOut, SelectorParams
from dflash2rt.plugin_kit import interpreting
from dflash2rt.watermark import WatermarkKey, values
from dflash2rt.watermark import generate as wmgen

pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")
if not interpreting():
    pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present, see conftest.py): the "
                "kernels run on the device there, through the conformance suite",
                allow_module_level=True)
from dflash2rt.kernels import selector as ksel  # noqa: E402
from dflash2rt.kernels import verify as kver  # noqa: E402
from dflash2rt.kernels.watermark import kernel_values  # noqa: E402

KEY = WatermarkKey(bytes(range(32)))
M32 = 2**32 - 1


def test_philox_words_equal_philox_np():
    g = np.random.default_rng(17)
    counter, key = g.integers(0, 2**32, (300, 4)), g.integers(0, 2**32, (300, 2))
    edges = [0, M32]
    for i, (a, b, c, d, k0, k1) in enumerate(np.array(np.meshgrid(*[edges] * 6)).reshape(6, -1).T):
        counter[i], key[i] = (a, b, c, d), (k0, k1)          # every all-0 / all-1 word mix
    got = kernel_values(counter=torch.tensor(counter), key=torch.tensor(key))["words"]
    want = philox_np(tuple(counter[:, i].astype(np.uint64) for i in range(4)),
                     (key[:, 0].astype(np.uint64), key[:, 1].astype(np.uint64)))
    assert np.array_equal(got.numpy(), np.stack([w.astype(np.int64) for w in want], 1))


def test_neg_log_bits_equal_values_neg_log():
    """Every uniform's -log, bit for bit: the extremes 2⁻²⁴ and 1 - 2⁻²⁴, both sides of each
    power of two (frexp's exponent steps there), and random ones."""
    j = np.arange(1, 24)
    k = np.concatenate([[0, 2**23 - 1], 2**(j - 1) - 1, 2**(j - 1),
                        np.random.default_rng(5).integers(0, 2**23, 3000)])
    u = torch.tensor((2 * k + 1).astype(np.float32) * np.float32(2.0**-24))
    assert u[0].item() == 2.0**-24 and u[1].item() == 1 - 2.0**-24
    got = kernel_values(u=u)["e"]
    assert torch.equal(got.view(torch.int64), values.neg_log(u).view(torch.int64))
    torch.testing.assert_close(got, -torch.log(u.double()), rtol=1e-15, atol=0)


@pytest.mark.parametrize("h", [1, 2, 4, 5, 8])
def test_context_hash_equals_values(h):
    g = np.random.default_rng(h)
    win = g.integers(-1, 200_000, (200, h))
    win[0], win[1] = -1, values.MAX_TOKEN_ID               # before the start; the largest id
    win[2::3, 0] = -1
    win = torch.tensor(win)
    assert torch.equal(kernel_values(windows=win)["hash"], values.context_hash(win))


def test_keyed_uniforms_equal_values_under_every_subkey():
    g = np.random.default_rng(3)
    ctx = torch.tensor(np.concatenate([[0, -1, -2**63, 2**63 - 1],
                                       g.integers(-2**63, 2**63 - 1, 300)]))
    tok = torch.tensor(np.concatenate([[0, M32, values.MAX_TOKEN_ID, 7],
                                       g.integers(0, 200_000, 300)]))
    for sub in (KEY.draft, KEY.target, KEY.coin):
        got = kernel_values(ctx=ctx, token=tok, sub=sub)["u"]
        assert torch.equal(got, values.keyed_uniforms(sub, ctx, tok))


# ---- the keyed walk -----------------------------------------------------------------------
PROMPTS = [(1, 2), (3, 4, 5, 6, 7), (8,), (9, 10, 11, 12), (5, 5, 5, 5), (13, 14)]
# rows: T = 1; greedy; T = 0.7 / top-p 0.95; T = 1, its block's contexts recorded (not fresh);
# T = 1 whose slot 1 repeats slot 0's context (5555 → 5); T = 1 reading a NaN lattice row
SAMPLING = ([1.0, 0.0, 0.7, 1.0, 1.0, 1.0], [0] * 6, [1.0, 1.0, 0.95, 1.0, 1.0, 1.0])


def _walk_inputs(seed, v=40, gamma=5, rank=6, k=5):
    g = torch.Generator().manual_seed(seed)
    r = len(PROMPTS)
    logits = torch.randn(r, gamma, v, generator=g)
    logits[4, 0, 5] = 60.0                                  # slot 0 takes 5: 5555 again
    proj = torch.randn(r, gamma, rank, generator=g)
    proj[5, 2] = float("nan")                               # row 5 reads a NaN lattice row
    return (logits, proj, torch.tensor([p[-1] for p in PROMPTS]),
            torch.randn(v, rank, generator=g), torch.randn(v, rank, generator=g),
            SelectorParams(k, 0.5, None), SamplingBatch.build(*SAMPLING),
            torch.rand(r, gamma, generator=g))


def _torch_select(wm, *args):
    """The torch ops' select given the watermark's draw source (the walk uniforms args[-1])."""
    *rest, u = args
    return ops_selector.select(*rest, wmgen.KeyedDraws(wm, BlockNoise(u, u, u, u[:, 0])))


def _torch_verify(wm, logits, sel, sampling, noise):
    """The torch ops' verify given the watermark's draw source, unchecked (flags returned)."""
    return ops_verify.verify(logits, sel.draft, sel.candidates, sel.q, sampling,
                             wmgen.KeyedDraws(wm, noise), False)


def _marked_batch(args, seed) -> wmgen.WatermarkBatch:
    """A batch whose row 3 has its whole block's walk contexts recorded (and row 0 the context
    of its slot 2), so those slots draw with the ordinary uniforms."""
    key = WatermarkKey(np.random.default_rng(seed).bytes(32))
    wm = wmgen.WatermarkBatch.build(key, PROMPTS, 16, 4, "cpu")
    ctx = wm.contexts(_torch_select(wm, *args).draft)           # [R, γ + 1]
    wm.record[3, :5], wm.record[0, 0] = ctx[3, :5], ctx[0, 2]
    wm.used[3], wm.used[0] = 5, 1
    return wm


@pytest.mark.parametrize("seed", range(3))
def test_keyed_walk_equals_torch_ops(seed):
    args = _walk_inputs(seed)
    wm = _marked_batch(args, seed)
    got = ksel.select(*args, wm=wm)
    want = _torch_select(wm, *args)
    assert torch.equal(got.draft, want.draft), (got.draft, want.draft)
    assert torch.equal(got.candidates, want.candidates)
    assert torch.equal(got.bad, want.bad) and torch.equal(got.bad_lattice, want.bad_lattice)
    assert want.bad_lattice.tolist() == [False] * 5 + [True]
    torch.testing.assert_close(got.q[:5], want.q[:5], rtol=0, atol=1e-6)   # the kernel's softmax
    fresh = wm.marks(want.draft).fresh                  # recorded / repeated slots were walked
    assert fresh[:, 0].tolist() == [True] * 3 + [False, True, True]
    assert not fresh[0, 2] and not fresh[4, 1]


# ---- the keyed residual / bonus -----------------------------------------------------------
def _verify_case(seed, v=40, gamma=5):
    """The walk's output, target logits that reject at various slots (row 3 at its recorded
    slot 0: a plain residual draw), accept a whole block (row 4: the bonus) or are NaN (row 5),
    and the batch of ``_marked_batch``."""
    args = _walk_inputs(seed, v, gamma)
    wm = _marked_batch(args, seed)
    sel = _torch_select(wm, *args)
    g = torch.Generator().manual_seed(100 + seed)
    logits = torch.randn(len(PROMPTS), gamma + 1, v, generator=g)
    logits[:, :gamma].scatter_add_(2, sel.draft.unsqueeze(-1), torch.full((6, gamma, 1), 1.5))
    logits[4, torch.arange(gamma), sel.draft[4]] = 30.0
    logits[3, 0, sel.draft[3, 0]] = float("-inf")
    logits[5, 1] = float("nan")
    noise = BlockNoise.draw(torch.full((6,), seed), torch.arange(6), torch.full((6,), 9), gamma)
    return wm, logits, sel, args[6], noise


def _same_verdict(got, want):
    assert torch.equal(got.tokens, want.tokens), (got.tokens, want.tokens)
    assert torch.equal(got.accept_len, want.accept_len)
    assert torch.equal(got.bad, want.bad) and torch.equal(got.bad_q, want.bad_q)


@pytest.mark.parametrize("seed", range(3))
def test_keyed_residual_and_bonus_equal_torch_ops(seed):
    wm, logits, sel, sampling, noise = _verify_case(seed)
    marks = wm.marks(sel.draft)
    got = kver.verify(logits, sel.draft, sel.candidates, sel.q, sampling, marks.noise(noise),
                      False, marks=marks)
    want = _torch_verify(wm, logits, sel, sampling, noise)
    _same_verdict(got, want)
    assert want.bad.tolist() == [False] * 5 + [True]
    assert want.accept_len[3] == 0 and want.accept_len[4] == 5


def test_keyed_draw_from_p_where_the_residual_is_empty():
    """q = 2p over the whole vocabulary: (p - q)+ is empty, a rejection draws from p (keyed)."""
    r, gamma, v = 8, 2, 7
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(r, gamma + 1, v, generator=g)
    sampling = SamplingBatch.build([1.0] * 4 + [0.7] * 4, [0] * r, [1.0] * 4 + [0.95] * 4)
    p = target_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p,
                     top_k_max=sampling.top_k_max, top_p_rows=sampling.top_p_rows)
    cand = torch.arange(v).expand(r, gamma, v).contiguous()
    draft = torch.argmax(p[:, :gamma], -1)
    sel = SelectorOut(draft, cand, 2 * p[:, :gamma], torch.zeros(r, dtype=torch.bool),
                      torch.zeros(r, dtype=torch.bool))
    wm = wmgen.WatermarkBatch.build(KEY, [(i, i + 1) for i in range(r)], 8, 4, "cpu")
    noise = BlockNoise.draw(torch.full((r,), 3), torch.arange(r), torch.zeros(r, dtype=torch.long),
                            gamma)
    marks = wm.marks(sel.draft)
    got = kver.verify(logits, draft, cand, sel.q, sampling, marks.noise(noise), False,
                      marks=marks)
    want = _torch_verify(wm, logits, sel, sampling, noise)
    _same_verdict(got, want)
    assert (want.accept_len < gamma).sum() >= 2                 # some rows drew from p


@pytest.mark.slow                       # a long run (over 10 s on 2 cores)
def test_engine_on_triton_interpret_equals_cpu_with_watermarks():
    """Several keys and prompts, T = 1 and T = 0.7 / top-p 0.95 and a greedy row in one batch:
    the same tokens on the kernels as on the torch ops, and no torch-ops report."""
    from dflash2rt import get_backend
    from dflash2rt.engine.engine import Engine
    from dflash2rt.engine.extensions import WATERMARK_OPS
    from dflash2rt.engine.request import Request, SamplingParams

    from backends import available
    from tiny_models import tiny_pair

    pair = tiny_pair("dflash2", block=4, seed=5, dtype=torch.float32)
    interp, cpu = available(), get_backend("cpu")
    for i in range(2):
        key = WatermarkKey(np.random.default_rng(40 + i).bytes(32))
        reqs = [Request(p, SamplingParams(max_new_tokens=8, temperature=t, top_p=tp, seed=i))
                for p, t, tp in (((2, 7, 1), 1.0, 1.0), ((9,), 0.7, 0.95), ((4, 4), 0.0, 1.0))]
        got, stats = Engine(pair, interp).generate(reqs, block_size=4, watermark=key)
        want, _ = Engine(pair, cpu).generate(reqs, block_size=4, watermark=key)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        assert WATERMARK_OPS not in stats.fallbacks


@pytest.mark.slow                       # a long run (over 10 s on 2 cores)
def test_watermarked_constrained_batch_on_triton_interpret_equals_cpu():
    """A watermark and a constraint together: the keyed, masked walk runs the torch ops on
    every backend (reported on the kernel backend), verification the kernels' keyed draws;
    the tokens equal cpu's and every token is allowed."""
    from dflash2rt import get_backend
    from dflash2rt.constraints import TokenAutomaton
    from dflash2rt.engine.engine import Engine
    from dflash2rt.engine.extensions import CONSTRAINT_WALK_OPS, WATERMARK_OPS
    from dflash2rt.engine.request import Request, SamplingParams

    from backends import available
    from tiny_models import tiny_pair

    pair = tiny_pair("dflash2", block=4, seed=5, dtype=torch.float32)
    v = pair.target.cfg.vocab_size
    t = np.full((2, v), -1)
    t[0, 0::2], t[1, 1::2] = 1, 0                    # parity: the allowed set flips each token
    a = TokenAutomaton(t)
    key = WatermarkKey(np.random.default_rng(7).bytes(32))
    reqs = [Request(p, SamplingParams(max_new_tokens=8, temperature=temp, seed=2, constraint=a))
            for p, temp in (((2, 7, 1), 1.0), ((9,), 0.7), ((4, 4), 0.0))]
    interp = available()
    got, stats = Engine(pair, interp).generate(reqs, block_size=4, watermark=key)
    want, _ = Engine(pair, get_backend("cpu")).generate(reqs, block_size=4, watermark=key)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert all(tok % 2 == i % 2 for o in got for i, tok in enumerate(o.token_ids))
    assert CONSTRAINT_WALK_OPS in stats.fallbacks and WATERMARK_OPS not in stats.fallbacks
