"""The watermark's Triton pieces (kernels/watermark.py, run by the interpreter) against their
definitions written anew: -log u bit for bit on the cells where the series' last terms decide
the rounding, the race keys E / p and the sparse race's winner position (ties to the lower id,
then the lower position; -1, exactly, for a row that is not a law) with garbage in the lanes
past K, and the launch option that keeps the float64 series unfused.

Classes of bug held: a series one term longer or shorter, or started at a neighbouring
coefficient (a random sample of cells misses the few hundred it changes); a law check that
joins its conditions the wrong way, or that reads lanes past the candidate set; a race key
finite where p is zero; kernels calling ``neg_log`` launched with FMA contraction allowed."""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import time

import numpy as np
import pytest
import torch

from dflash2rt.plugin_kit import interpreting
from dflash2rt.watermark import values
from test_watermark_detect_reference import context, philox
from test_watermark_sampler_defs import _batch, sparse_reference
from test_watermark_values_defs import neg_log_reference

pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")
if not interpreting():
    pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present, see conftest.py): the "
                "kernels run on the device there, through the conformance suite",
                allow_module_level=True)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from dflash2rt.kernels import watermark as kwm  # noqa: E402
from dflash2rt.kernels.launch import collecting  # noqa: E402

NAN, INF = float("nan"), float("inf")


# ---- -log u where the series' tail decides ----------------------------------------------------
def _series(u: np.ndarray, first: float, top: int) -> np.ndarray:
    """-log u with the series started at ``first`` and run from term ``top`` down."""
    m, e = np.frexp(u.astype(np.float64))
    s = (1.0 - m) / (1.0 + m)
    z = s * s
    acc = np.full_like(z, first)
    for j in range(top, -1, -1):
        acc = acc * z + 1.0 / (2 * j + 1)
    return (2.0 * s) * acc - e.astype(np.float64) * 0.6931471805599453


def _tail_cells() -> np.ndarray:
    """Grid cells k (u = (2k + 1)·2⁻²⁴) of the first 32nd of each binade from 2⁻⁷ up
    (where s = (1 - m) / (1 + m) is largest) whose -log the series one term shorter, one
    longer, or started at 1/33, 1/37 or 1/70 instead of 1/35 rounds differently."""
    k = np.concatenate([np.arange(2**j, 2**j + 2**(j - 5)) for j in range(16, 23)])
    u = ((2 * k + 1) * 2.0**-24).astype(np.float32)
    ref = neg_log_reference(u)
    off = np.zeros(len(k), dtype=bool)
    for first, top in ((1 / 35, 15), (1 / 35, 17), (1 / 33, 16), (1 / 37, 16), (1 / 70, 16)):
        off |= _series(u, first, top) != ref
    return k[off]


def test_neg_log_bits_where_the_series_tail_decides():
    k = _tail_cells()
    assert len(k) > 500
    u = ((2 * k + 1) * 2.0**-24).astype(np.float32)
    got = kwm.kernel_values(u=torch.from_numpy(u))["e"]
    assert np.array_equal(got.numpy().view(np.int64), neg_log_reference(u).view(np.int64))


# ---- the context hash of the first H lanes -------------------------------------------------
@triton.jit
def _hash_rows(win_ptr, out_ptr, H: tl.constexpr, BLOCK_H: tl.constexpr):
    """Row n of windows [N, BLOCK_H], every lane loaded (those past H hold tokens too, as the
    walk's windows do) → the context hash of its first H lanes."""
    n = tl.program_id(0).to(tl.int64)
    hs = tl.arange(0, BLOCK_H)
    win = tl.load(win_ptr + n * BLOCK_H + hs)
    tl.store(out_ptr + n + tl.arange(0, 1), kwm.context_hash(win[None, :], H, BLOCK_H))


@pytest.mark.parametrize("h", [1, 2, 3, 5, 6, 7])
def test_context_hash_reads_the_first_h_lanes_only(h):
    """Token 0 is a word (1), unlike the start (-1); lanes past H, tokens or -1, change
    nothing."""
    block = triton.next_power_of_2(max(h, 4))
    g = np.random.default_rng(h)
    win = g.integers(0, 50, (12, block))
    win[0, :h], win[1, :h], win[2, :h] = 0, -1, values.MAX_TOKEN_ID    # 0, the start, the top
    win[3:6, 0] = [0, -1, 0]
    win[6:, h:] = -1
    out = torch.empty(len(win), dtype=torch.int64)
    _hash_rows[(len(win),)](torch.from_numpy(win), out, H=h, BLOCK_H=block)
    assert out.tolist() == [context(w[:h].tolist()) for w in win]
    assert out[0] != out[1]


# ---- the race: keys and the sparse winner ---------------------------------------------------
@triton.jit
def _race_rows(p_ptr, ids_ptr, e_ptr, win_ptr, key_ptr, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """Row r of [R, BLOCK_K] p / ids / e, candidates the first K lanes (the others hold
    whatever the caller put there) → the winner position and the BLOCK_K race keys."""
    r = tl.program_id(0).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    p = tl.load(p_ptr + r * BLOCK_K + ks)
    ids = tl.load(ids_ptr + r * BLOCK_K + ks)
    e = tl.load(e_ptr + r * BLOCK_K + ks)
    tl.store(win_ptr + r, kwm.exp_min_candidates(p, ids, e, ks < K))
    tl.store(key_ptr + r * BLOCK_K + ks, kwm.race_key(p, e))


def _run_race(p: np.ndarray, ids: np.ndarray, e: np.ndarray, k: int):
    r, block = p.shape
    win = torch.empty(r, dtype=torch.int64)
    keys = torch.empty(r, block, dtype=torch.float64)
    _race_rows[(r,)](torch.from_numpy(p), torch.from_numpy(ids), torch.from_numpy(e), win, keys,
                     K=k, BLOCK_K=block, **kwm.FP_FUSION)
    return win.tolist(), keys.numpy()


# lanes past K: a winning key (p = 1, E = 0, the lowest id), or a defect that is no law
PADDING = {"winning": (1.0, 0.0, -1), "nan": (NAN, 1.0, 0), "negative": (-1.0, 1.0, 0),
           "inf": (INF, 1.0, 0)}


@pytest.mark.parametrize("pad", sorted(PADDING))
@pytest.mark.parametrize("seed", [0, 1])
def test_sparse_race_equals_the_definition_whatever_lies_past_k(seed, pad):
    probs, e = _batch(seed)                                 # [10, 7]: defects, zeros, ties
    g = np.random.default_rng(100 + seed)
    ids = g.integers(0, 5, probs.shape)                     # repeated ids in a row
    ids[0] = [0, 3, 3, 9, 1, 1, 7]          # tie: id 1 at position 4 wins (id 0 has p = 0)
    r, k = probs.shape
    pp, pe, pid = PADDING[pad]
    p8 = np.full((r, 8), pp)
    e8, id8 = np.full((r, 8), pe), np.full((r, 8), pid, dtype=np.int64)
    p8[:, :k], e8[:, :k], id8[:, :k] = probs.astype(np.float64), e, ids
    win, keys = _run_race(p8, id8, e8, k)
    want = [sparse_reference(p.astype(np.float64).tolist(), i.tolist(), x.tolist())
            for p, i, x in zip(probs, ids, e)]
    assert win == want
    assert win.count(-1) == 6 and win[0] == 4


def test_race_keys_are_e_over_p_and_inf_where_p_is_not_positive():
    p = np.array([[0.5, 0.0, -0.25, NAN, 2.0**-30, 1.0, -0.0, 3.0]])
    e = np.array([[1.5, 0.7, 0.9, 0.3, 2.0**-20, 0.0, 0.2, 0.75]])
    ids = np.arange(8, dtype=np.int64).reshape(1, 8)
    win, keys = _run_race(p, ids, e, 8)
    want = [e[0, j] / p[0, j] if p[0, j] > 0 else INF for j in range(8)]
    assert keys[0].tolist() == want == [3.0, INF, INF, INF, 2.0**10, 0.0, INF, 0.25]
    assert win == [-1]                                      # a NaN and a negative mass: no law
    p[0, 2:4] = 0.0                                         # now a law: E = 0 at p = 1 wins
    assert _run_race(p, ids, e, 8)[0] == [5]


def test_a_row_with_no_positive_mass_is_no_law_even_without_defects():
    p = np.zeros((2, 4))
    p[1, 2] = 0.25
    e = np.ones((2, 4))
    ids = np.tile(np.arange(4, dtype=np.int64), (2, 1))
    assert _run_race(p, ids, e, 4)[0] == [-1, 2]


# ---- the launch option ----------------------------------------------------------------------
def test_kernels_calling_neg_log_launch_without_fp_fusion():
    """The float64 series rounds each + and * as the torch ops do only unfused: the launch
    carries enable_fp_fusion=False."""
    with collecting() as got:
        kwm.kernel_values(u=torch.full((4,), 0.25))
    (key,) = got.keys()
    assert key[0] == "watermark._values_kernel"
    assert ("enable_fp_fusion", False) in key[2]


# ---- the launcher: fill-ins, and no read past its inputs ---------------------------------------
def test_inputs_left_out_are_zeros_and_u_one_half():
    """Only the counter given: the key's words, the window, the context, the token and the
    subkey are zeros (the window is token 0, a word 1), u is 1/2."""
    counter = torch.tensor([[1, 2, 3, 4], [0, 0, 0, 0]])
    out = kwm.kernel_values(counter=counter)
    assert out["words"].tolist() == [list(philox((1, 2, 3, 4), (0, 0))),
                                     list(philox((0, 0, 0, 0), (0, 0)))]
    assert out["hash"].tolist() == [context([0])] * 2
    k = philox((0, 0, 0, 0), (0, 0))[0] >> 9
    assert out["u"].tolist() == [(2 * k + 1) * 2.0**-24] * 2
    half = neg_log_reference(np.array([0.5], dtype=np.float32))[0]
    assert out["e"].tolist() == [half] * 2 and abs(half - np.log(2.0)) < 1e-15


PAGE, PROT_NONE = mmap.PAGESIZE, 0
_LIBC = ctypes.CDLL(None, use_errno=True)


def _before_a_guard_page(values: np.ndarray) -> torch.Tensor:
    """A tensor of ``values`` whose last byte is the last readable one: the page after it is
    PROT_NONE, so a read past its end faults."""
    nbytes = values.nbytes
    pages = -(-nbytes // PAGE)
    mm = mmap.mmap(-1, (pages + 1) * PAGE)
    view = ctypes.c_char.from_buffer(mm)
    base = ctypes.addressof(view)
    del view
    assert _LIBC.mprotect(ctypes.c_void_p(base + pages * PAGE), PAGE, PROT_NONE) == 0
    t = torch.frombuffer(mm, dtype=torch.from_numpy(values).dtype, count=values.size,
                         offset=pages * PAGE - nbytes)
    t.copy_(torch.from_numpy(values).reshape(-1))
    return t.view(values.shape)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork (a fault must not end the run)")
@pytest.mark.parametrize("h", [3, 5])
def test_no_read_past_the_inputs(h):
    """Every input ends at a guard page, with rows that leave part of a program's block and of
    its window lanes idle: a masked load that lets either through faults (in a child process,
    whose exit status is checked)."""
    g = np.random.default_rng(h)
    n = 5
    inputs = dict(counter=g.integers(0, 2**32, (n, 4)), key=g.integers(0, 2**32, (n, 2)),
                  windows=g.integers(-1, 1000, (n, h)), ctx=g.integers(-2**63, 2**63 - 1, n),
                  token=g.integers(0, 1000, n),
                  u=((2 * g.integers(0, 2**23, n) + 1) * 2.0**-24).astype(np.float32))
    guarded = {name: _before_a_guard_page(x) for name, x in inputs.items()}
    pid = os.fork()
    if pid == 0:                                          # the child: launch, then exit at once
        code = 1
        try:
            out = kwm.kernel_values(**guarded)
            code = 0 if out["hash"].tolist() == [context(w) for w in
                                                 inputs["windows"].tolist()] else 3
        finally:
            os._exit(code)
    t = time.monotonic()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - t > 240:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the launch did not finish")
        time.sleep(0.02)
    assert os.waitstatus_to_exitcode(status) == 0, "the launch faulted or failed"
