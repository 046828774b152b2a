"""kernels/interpreter_calls.py: inside an interpreted launch, device-function calls skip the
language re-patch, and launches still patch, compute and restore as upstream's do."""

from __future__ import annotations

import pytest
import torch

from dflash2rt.plugin_kit import interpreting

pytest.importorskip("triton", reason="triton is not installed (pip install 'dflash2rt[triton]')")
if not interpreting():
    pytest.skip("TRITON_INTERPRET is off in this process (a GPU is present, see conftest.py): the "
                "interpreter's launch path is not used here", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

import dflash2rt.kernels  # noqa: E402,F401 - importing the kernels installs the wrapper
from dflash2rt.kernels import interpreter_calls  # noqa: E402


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _plus_sum(x):
    return x + tl.sum(x, 0)


@triton.jit
def _calls(x_ptr, out_ptr, N: tl.constexpr, ROUNDS: tl.constexpr):
    offs = tl.arange(0, N)
    v = tl.load(x_ptr + offs)
    for _ in range(ROUNDS):
        v = _twice(v)
    tl.store(out_ptr + offs, _plus_sum(v))


@triton.jit
def _no_calls(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    v = tl.load(x_ptr + offs) * 8
    tl.store(out_ptr + offs, v + tl.sum(v, 0))


@triton.jit
def _fails(x_ptr, N: tl.constexpr):
    v = _twice(tl.load(x_ptr + tl.arange(0, N)))
    tl.static_assert(N < 0, "raised inside the launch, after a device call")
    tl.store(x_ptr + tl.arange(0, N), v)


def _walks(monkeypatch) -> list:
    seen: list = []
    walk = interpreter._patch_builtin
    monkeypatch.setattr(interpreter, "_patch_builtin",
                        lambda pkg, *a: (seen.append(pkg), walk(pkg, *a))[1])
    return seen


def test_the_wrapper_is_installed_and_device_calls_compute_as_inline_code():
    assert getattr(interpreter._patch_lang, "dflash2rt_wrapped", False)
    assert interpreter_calls.install()                  # idempotent: wraps once
    x = torch.arange(8, dtype=torch.float32)
    a, b = torch.empty(8), torch.empty(8)
    _calls[(2,)](x, a, N=8, ROUNDS=3)
    _no_calls[(2,)](x, b, N=8)
    assert torch.equal(a, b) and torch.equal(a, x * 8 + (x * 8).sum())


def test_a_launch_walks_the_language_once_whatever_its_device_calls(monkeypatch):
    seen = _walks(monkeypatch)
    x, out = torch.arange(8, dtype=torch.float32), torch.empty(8)
    _no_calls[(3,)](x, out, N=8)
    plain = len(seen)
    seen.clear()
    _calls[(3,)](x, out, N=8, ROUNDS=5)                 # 3 programs × 6 device calls
    assert plain > 0 and len(seen) == plain


def test_modules_are_restored_after_a_launch_even_a_failing_one():
    original_load = tl.load
    x = torch.arange(4, dtype=torch.float32)
    with pytest.raises(Exception, match="raised inside the launch"):
        _fails[(1,)](x, N=4)
    assert tl.load is original_load and tl.core.is_builtin(tl.load)
    assert not interpreter_calls.launch_open()          # the next launch patches again
    out = torch.empty(4)
    _calls[(1,)](x, out, N=4, ROUNDS=1)
    assert torch.equal(out, x * 2 + (x * 2).sum())
    assert tl.load is original_load
