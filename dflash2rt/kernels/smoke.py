"""Tiny inputs for every kernel case (greedy and sampled paths), and the one-time smoke launch
of a backend's ops on them. ``compile_check`` compiles the same cases without a device."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..ops.batch import BlockNoise, SamplingBatch
from ..ops.selector import SelectorParams
from ..watermark import WatermarkKey
from ..watermark.generate import KeyedDraws, WatermarkBatch
from ..watermark.sampler import WatermarkUnsupportedError

if TYPE_CHECKING:
    from ..backend import Backend

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cases(dtype: torch.dtype, device: torch.device | str = "cpu", seed: int = 0
          ) -> dict[str, tuple[str, Callable[[], tuple[Any, ...]]]]:
    """case → (Backend method, a function making its arguments): conv prepare / finish, select
    and verify greedy / sampled / watermarked, attention decode / block, a step's noise and a
    token's uniform, RMSNorm over hidden and head rows, the attention prologue with and
    without q / k norms, on ``device`` in ``dtype``; ``seed``:
    other values of the same shapes."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g).to(device, dtype)   # noqa: E731
    ids = lambda *v: torch.tensor(v, device=device)                    # noqa: E731

    def batch(temp: float) -> SamplingBatch:
        return SamplingBatch.build([temp, 0.0], [0, 0], [1.0, 1.0], device)

    def conv(finish: bool) -> tuple[Any, ...]:
        x, a = rnd(12, 96), rnd(12, 96)                  # [N, H], block 4
        base, delta = rnd(3, 96), rnd(12, 3, 6)          # [Tk, H], [N, Tk, G]
        return (x, a, base, delta, 4) if finish else (x, base, delta, 4)

    def select(temp: float) -> tuple[Any, ...]:
        r, gamma, v, rank = 2, 5, 64, 8
        return (rnd(r, gamma, v), rnd(r, gamma, rank), ids(1, 2), rnd(v, rank), rnd(v, rank),
                SelectorParams(4, 0.5, None), batch(temp),
                torch.rand(r, gamma, generator=g).to(device))

    def verify(temp: float) -> tuple[Any, ...]:
        r, gamma, v, k = 2, 4, 3001, 4      # V above every block_v: the tuned chunk runs
        cand = (torch.arange(r * gamma * k).view(r, gamma, k) % v).to(device)
        noise = BlockNoise.draw(ids(1, 2), torch.zeros(2, dtype=torch.long, device=device),
                                ids(0, 3), gamma)
        return (rnd(r, gamma + 1, v), cand[..., 0], cand,
                torch.full((r, gamma, k), 1.0 / k, device=device), batch(temp), noise, False)

    def attention(t: int, n_kv: int, group: int, hd: int, window: int | None
                  ) -> tuple[Any, ...]:
        r, max_len, n_keys = 2, 48, 40     # k, v: strided slices cache[:, :L] (not copied)
        cache = rnd(2, r, max_len, n_kv, hd)
        lens = ids(11, 23)
        pos = lens.view(-1, 1) + torch.arange(t, device=device)                 # [R, T]
        lo = torch.zeros_like(pos) if window is None else \
            torch.minimum((pos - window + 1).clamp(min=0), lens.view(-1, 1))
        hi = pos + 1 if window is None else (lens + t).view(-1, 1).expand(r, t)
        return (rnd(r, t, n_kv * group, hd), cache[0, :, :n_keys], cache[1, :, :n_keys], lo, hi,
                hd ** -0.5)

    def marked(kind: str) -> tuple[Any, ...]:
        wm = WatermarkBatch.build(WatermarkKey(bytes(32)), [(1, 2), (3,)], 12, 4, device)
        wm.commit_(ids([5], [6]), ids(1, 1))                          # a recorded context
        if kind == "select":
            *args, u_walk = select(0.8)
            noise = BlockNoise.draw(ids(1, 2), ids(0, 0), ids(0, 3), u_walk.shape[1])
            return (*args, KeyedDraws(wm, dataclasses.replace(noise, walk=u_walk)))
        logits, draft, cand, q, sampling, noise, check = verify(0.8)
        return logits, draft, cand, q, sampling, KeyedDraws(wm, noise), check

    out: dict[str, tuple[str, Callable[[], tuple[Any, ...]]]] = {}
    for f in ("prepare", "finish"):
        out[f"conv-{f}"] = (f"conv_{f}", lambda f=f: conv(f == "finish"))
    for mode, temp in (("greedy", 0.0), ("sampled", 0.8)):
        out[f"select-{mode}"] = ("select", lambda t=temp: select(t))
        out[f"verify-{mode}"] = ("verify", lambda t=temp: verify(t))
    for op in ("select", "verify"):                                   # the keyed draws
        out[f"{op}-watermarked"] = (op, lambda op=op: marked(op))
    out["attention-decode"] = ("attention", lambda: attention(1, 2, 4, 128, None))   # target
    out["attention-block"] = ("attention", lambda: attention(17, 1, 2, 256, 8))     # draft
    # seed, request, anchor position [R]: negative seeds, requests and positions past 2**32
    keys = lambda: (ids(5, -7), ids(3, 2 ** 33 + 1), ids(0, 2 ** 32 - 1))   # noqa: E731
    out["noise-block"] = ("noise", lambda: (*keys(), 4))
    out["noise-token"] = ("token_uniforms", lambda: (*keys(), 1))
    out["rms-norm-hidden"] = ("rms_norm", lambda: (rnd(3, 96), rnd(96), 1e-6))
    out["rms-norm-head"] = ("rms_norm", lambda: (rnd(2, 1, 3, 64), rnd(64), 1e-6))

    def prologue(normed: bool) -> tuple[Any, ...]:
        r, t, nh, n_kv, hd = 2, 3, 4, 2, 64              # into cache [R, 16, n_kv, hd] at pos
        norm_w = (rnd(hd), 1e-6) if normed else None
        return (rnd(r, t, nh, hd), rnd(r, t, n_kv, hd), rnd(r, t, n_kv, hd), norm_w, norm_w,
                rnd(r, t, hd), rnd(r, t, hd), rnd(r, 16, n_kv, hd), rnd(r, 16, n_kv, hd),
                ids([4, 5, 6], [9, 10, 11]))
    out["prologue-normed"] = ("attention_prologue", lambda: prologue(True))   # Qwen3
    out["prologue-plain"] = ("attention_prologue", lambda: prologue(False))   # Llama
    return out


def smoke_launch(backend: "Backend") -> list[str]:
    """Launch every op of ``backend`` once on tiny float32 inputs on its device and wait for
    the results → the cases launched. On a device without float64 the watermarked cases must
    refuse with ``WatermarkUnsupportedError`` instead (the keyed draws need float64; every
    other case runs its float32 formulation). Raises RuntimeError naming the first case that
    fails."""
    ran = []
    for case, (method, make) in cases(torch.float32, backend.device).items():
        keyed = case.endswith("-watermarked")
        try:
            out = getattr(backend, method)(*make())
            for t in _tensors(out):
                t.cpu()                                  # waits for the launch to finish
        except WatermarkUnsupportedError:
            if keyed and not backend.has_fp64:
                continue                                 # the refusal it must give
            raise RuntimeError(f"smoke launch of {case} on {backend.device} refused the "
                               f"watermark on a device with float64") from None
        except Exception as exc:  # noqa: BLE001 - one reason for the caller
            raise RuntimeError(f"smoke launch of {case} on {backend.device} failed: "
                               f"{type(exc).__name__}: {exc}") from exc
        if keyed and not backend.has_fp64:
            raise RuntimeError(f"smoke launch of {case} on {backend.device}: a watermarked "
                               "batch ran without float64 (it must refuse)")
        ran.append(case)
    return ran


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [v for v in vars(out).values() if isinstance(v, torch.Tensor)] \
        if hasattr(out, "__dict__") else []


def active_target() -> str:
    """The target backend of Triton's active driver in this process ("cuda", "hip", "xpu")."""
    from triton.runtime import driver

    return driver.active.get_current_target().backend
