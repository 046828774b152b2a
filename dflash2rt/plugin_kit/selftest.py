"""The graph self-test a vendor's graph policy runs on its adapter before capture is turned on.

One step of the ops a decode step captures — the sampled selector walk, sampled verification,
attention over a strided cache slice, and a KV commit (``KVCache.commit``: rows written at
per-request positions) — is captured for two buckets (two sets of static inputs) into one
shared pool, after a warm-up on the capture stream. Each graph is then replayed on *fresh*
inputs (other values copied into its static buffers) and compared with the same step run
eagerly on them, outputs and cache contents bit for bit, and the first graph once more after
the second ran (the pool's memory is shared). A driver whose capture bakes an input in, loses
a kernel or breaks the shared pool fails here, and the probe then reports graphs as off.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..backend import Backend
from ..graphs.adapter import warm_up_on
from ..kernels.smoke import cases
from ..models.kv_cache import KVCache

_CASES = ("select-sampled", "verify-sampled", "attention-decode")


def _inputs(device: torch.device, seed: int) -> dict[str, Any]:
    made = cases(torch.float32, device, seed)
    out: dict[str, Any] = {case: made[case][1]() for case in _CASES}
    g = torch.Generator().manual_seed(1000 + seed)
    out["kv_new"] = torch.randn(2, 3, 2, 8, generator=g).to(device)        # [R, T, n_kv, hd]
    out["kv_lens"] = torch.tensor([1 + seed % 3, 4], device=device)
    out["kv_counts"] = torch.tensor([3, 1 + seed % 2], device=device)
    return out


def _tensors(x: Any) -> list[torch.Tensor]:
    """Every tensor in x, in a fixed order (tuples, lists, dicts and dataclasses walked)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for k in sorted(x) for t in _tensors(x[k])]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v)]
    if dataclasses.is_dataclass(x):
        return [t for f in dataclasses.fields(x) for t in _tensors(getattr(x, f.name))]
    return []


def _step(be: Backend, inp: dict[str, Any], cache: KVCache) -> dict[str, torch.Tensor]:
    sel = be.select(*inp["select-sampled"])
    ver = be.verify(*inp["verify-sampled"][:-1], check=False)
    att = be.attention(*inp["attention-decode"])
    cache.commit([(inp["kv_new"], -inp["kv_new"])], inp["kv_lens"], inp["kv_counts"])
    return {"draft": sel.draft, "q": sel.q, "accept": ver.accept_len, "tokens": ver.tokens,
            "attention": att}


def graph_self_test(adapter: Any, backend: Backend) -> str | None:
    """None when every replay on fresh inputs equals eager (module docstring), else what
    differed; ``backend`` runs the ops (the kernels the vendor's backend will run, or its
    torch ops where they cannot)."""
    dev = adapter.device
    pool, runs = adapter.new_pool(), []
    for bucket, seed in ((1, 0), (2, 2)):
        inp = _inputs(dev, seed)
        cache = KVCache.empty(1, 2, 16, 2, 8, torch.float32, dev)
        out: dict[str, torch.Tensor] = {}

        def step(inp=inp, cache=cache, out=out) -> None:
            out.update(_step(backend, inp, cache))

        with warm_up_on(adapter):
            step()
        runs.append((bucket, seed, adapter.capture(step, pool), inp, cache, out))
    for bucket, seed, graph, inp, cache, out in runs + runs[:1]:
        fresh = _inputs(dev, seed + 1)
        for static, value in zip(_tensors(inp), _tensors(fresh)):
            static.copy_(value)
        for buf in (*cache.k, *cache.v):
            buf.zero_()
        graph.replay()
        eager_cache = KVCache.empty(1, 2, 16, 2, 8, torch.float32, dev)
        want = _step(backend, fresh, eager_cache)
        got_cache = [t.cpu() for t in (*cache.k, *cache.v)]
        for name, w in want.items():
            if not torch.equal(out[name].cpu(), w.cpu()):
                return f"graph replay != eager on fresh inputs: {name} (bucket {bucket})"
        if not all(torch.equal(g, w.cpu()) for g, w in
                   zip(got_cache, (*eager_cache.k, *eager_cache.v))):
            return f"graph replay != eager on fresh inputs: the KV commit (bucket {bucket})"
    return None
