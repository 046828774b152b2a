"""Compiling kernels ahead: a shape-only trace of an engine's steps, compiled on a thread pool."""

from __future__ import annotations

import copy
import threading
import time
import weakref
from typing import Any, Callable, Iterable

import torch

from ..backend import TORCH_OPS, UNSUPPORTED, Backend
from ..kernels.launch import Key, Launch, Launches, collecting
from ..models.kv_cache import KVCache
from ..models.pair import ModelPair
from ..watermark import DEFAULT_CONTEXT_WIDTH
from ..watermark.generate import capacity_for
from .bodies import StepBodies
from .extensions import Watermark
from .mode import GraphExts, Mode

# ``kernel_plan`` runs the graph step bodies (``Mode.graph_body`` over ``Mode.static_inputs``,
# what a capture's warm-up runs) of every block a call may take (1: the target-only step) for
# greedy, sampled and, where the backend's kernels make the keyed draws, watermarked batches,
# and prefill's target forward at prompt lengths 1, 2, 4, ... (each attention tile a prompt can
# get), over a copy of the pair whose tensors are on the meta device and over meta caches:
# nothing computes, nothing is allocated, and every branch taken is the one a device (not the
# CPU) takes. Each model forward runs once per argument signature and each layer of a stack once
# per parameter shapes (the layers launch the same variants). The backend's launches are
# collected, not run (``kernels.launch``), one per compile key. ``CompileAhead`` (one per engine)
# compiles the variants this device has not compiled yet (``Backend.compile_ahead``) for the
# blocks it has not planned yet; a failed trace or compile is reported (that variant compiles at
# its first launch), never fatal.

ROWS = 2                 # the traced batch (compile keys do not depend on the row count)
TRACE_LEN = 512          # cache rows of the traced caches (meta: nothing is allocated)
META = torch.device("meta")


def _meta_tensor(t: torch.Tensor) -> torch.Tensor:
    m = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=META)
    return torch.nn.Parameter(m, t.requires_grad) if isinstance(t, torch.nn.Parameter) else m


def meta_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module`` whose tensors (parameters, buffers, tensor attributes, also in a
    dict, list or tuple attribute) are meta tensors of the same shapes, strides and dtypes;
    no tensor data is copied."""
    memo: dict[int, Any] = {}
    for sub in module.modules():
        for v in vars(sub).values():
            for t in (v.values() if isinstance(v, dict) else
                      v if isinstance(v, (list, tuple)) else (v,)):
                if isinstance(t, torch.Tensor) and id(t) not in memo:
                    memo[id(t)] = _meta_tensor(t)
    return copy.deepcopy(module, memo)


def _sig(x: Any) -> Any:
    """What a traced call's result and launches depend on: tensors by shape, strides, offset
    and dtype, a bound method by its object and function, a function (a layer's ``attend``
    closure) not at all, any other object by identity."""
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), x.stride(), x.dtype, x.storage_offset())
    if isinstance(x, (list, tuple)):
        return tuple(_sig(v) for v in x)
    if isinstance(x, dict):
        return tuple((k, _sig(v)) for k, v in sorted(x.items()))
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if hasattr(x, "__self__") and hasattr(x, "__func__"):      # a bound method (``attn=``)
        return ("M", id(x.__self__), x.__func__)
    if callable(x) and hasattr(x, "__code__"):
        return "F"
    return ("O", id(x))


def _params_sig(module: torch.nn.Module) -> tuple:
    return tuple((n, _sig(p)) for n, p in module.named_parameters())


_TRACE = threading.local()       # .seen: the running trace's calls by signature


def _memo_forward(module: torch.nn.Module, key: Any) -> None:
    """Within one trace, the module's forward runs once per ``key`` and argument signature: the
    sampling modes of a block run the same model forwards, and the layers of a stack with the
    same parameter shapes the same kernel variants (their caches are alike)."""
    forward = module.forward

    def traced(*args, **kw):
        seen = getattr(_TRACE, "seen", None)
        if seen is None:
            return forward(*args, **kw)
        at = (key, _sig((args, kw)))
        if at not in seen:
            seen[at] = forward(*args, **kw)
        return seen[at]
    module.forward = traced


def _memo_calls(model: torch.nn.Module) -> None:
    """The model's forward by identity, each layer of its layer stacks by parameter shapes."""
    _memo_forward(model, id(model))
    for stack in [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]:
        for layer in stack:
            _memo_forward(layer, (type(layer), _params_sig(layer)))


_META_PAIRS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # target → meta pair
_LOCK = threading.Lock()


def meta_pair(pair: ModelPair) -> ModelPair:
    """The pair's meta copy (made once per loaded pair), forwards traced once per signature."""
    with _LOCK:
        got = _META_PAIRS.get(pair.target)
        if got is None or got[0] is not pair.draft:
            mp = ModelPair(meta_copy(pair.target),
                           None if pair.draft is None else meta_copy(pair.draft))
            for m in (mp.target, mp.draft):
                if m is not None:
                    _memo_calls(m)
            got = _META_PAIRS[pair.target] = (pair.draft, mp)
        return got[1]


def sampling_modes(backend: Backend) -> list[tuple[bool, GraphExts]]:
    """(sampled, graphed extensions) of the graphs a step can replay: greedy, sampled, and
    watermarked where the backend's own kernels make the keyed draws."""
    modes: list[tuple[bool, GraphExts]] = [(False, ()), (True, ())]
    if backend.has_fp64 and backend.implementation.get("watermark") not in (TORCH_OPS,
                                                                            UNSUPPORTED):
        key = (DEFAULT_CONTEXT_WIDTH, capacity_for(1))
        modes.append((True, ((Watermark, key),)))
    return modes


def _caches(mp: ModelPair) -> tuple[KVCache, KVCache | None]:
    a = mp.target.cfg
    target = KVCache.empty(a.num_hidden_layers, ROWS, TRACE_LEN, a.num_key_value_heads,
                           a.head_dim, mp.dtype, META)
    return target, (None if mp.draft is None else
                    mp.draft.empty_cache(ROWS, TRACE_LEN, mp.dtype, META))


def _trace_block(mp: ModelPair, backend: Backend, caches, block: int) -> None:
    """The graph bodies of one block (1: target-only) in every sampling mode."""
    spec = block > 1 and mp.draft is not None
    mode = Mode(StepBodies(mp, backend, *caches, block if spec else None), None)
    for sampled, exts in sampling_modes(backend):
        for kind in ("draft", "verify") if spec else ("target-only",):
            mode.graph_body(kind, sampled, exts)(mode.static_inputs(kind, exts, ROWS))


def _trace_prefill(mp: ModelPair, backend: Backend, caches, got: Launches) -> None:
    """Prefill's target forward (``stages.prefill``) at prompt lengths 1, 2, 4, ..., 16, then
    doubling while a doubling still adds a compile key (past 16 rows a length only changes
    the attention tile until the tile's cap)."""
    t, lens = 1, torch.zeros(ROWS, dtype=torch.int64, device=META)
    while t < TRACE_LEN:
        before = len(got.by_key)
        ids = torch.zeros(ROWS, t, dtype=torch.int64, device=META)              # [R, t]
        pos = torch.arange(t, device=META).expand(ROWS, t)                      # [R, t]
        mp.target(ids, pos, caches[0], lens, ctx_len=0, logits_at=lens + t - 1,
                  attn=backend.attention)
        if t >= 16 and len(got.by_key) == before:
            break
        t *= 2


def kernel_plan(pair: ModelPair, backend: Backend, blocks: Iterable[int],
                prefill: bool = True) -> list[Launch]:
    """The distinct kernel launches (one per compile key) of the graph step bodies of every
    block in ``blocks`` (1: the target-only step) in every sampling mode, and of prefill
    (``prefill``), traced on the meta device (module docstring)."""
    mp = meta_pair(pair)
    _TRACE.seen = {}
    try:
        with torch.inference_mode(), backend.run_context(), collecting() as got:
            caches = _caches(mp)
            for block in sorted(set(blocks)):
                _trace_block(mp, backend, caches, block)
            if prefill:
                _trace_prefill(mp, backend, caches, got)
    finally:
        _TRACE.seen = None
    return list(got.by_key.values())


_COMPILED: set[tuple[str, Key]] = set()      # (device, key) compiled ahead in this process


def untraceable(pair: ModelPair) -> str:
    """Why the pair's forwards cannot run shape-only ("" when they can): a tensor-parallel
    process group's collectives, or forward hooks, would act on meta tensors."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return "a tensor-parallel run's collectives do not run on meta tensors"
    hooked = [type(m).__name__ for model in (pair.target, pair.draft) if model is not None
              for m in model.modules() if m._forward_hooks or m._forward_pre_hooks]
    return f"the models have forward hooks ({', '.join(sorted(set(hooked)))})" if hooked else ""


class CompileAhead:
    """One engine's compile-ahead: ``run(blocks, report)`` before a call's first step (a no-op
    on a backend whose kernels do not compile for a device, and for blocks planned before)."""

    def __init__(self, pair: ModelPair, backend: Backend) -> None:
        self.pair, self.backend = pair, backend
        self.planned: set[int] = set()
        self.prefilled = False

    def run(self, blocks: Iterable[int], report: Callable[[str], None]
            ) -> tuple[float, dict[str, int]]:
        """Trace the blocks not planned yet (and the target-only step, prefill: the first
        time), compile what this device lacks → (seconds, variants compiled per kernel).
        Failures go to ``report``."""
        if not self.backend.compiles_ahead:
            return 0.0, {}
        new = sorted((set(blocks) | {1}) - self.planned)
        if not new:
            return 0.0, {}
        start = time.perf_counter()
        self.planned |= set(new)
        why = untraceable(self.pair)
        if why:
            report(f"compile-ahead skipped: {why}; kernels compile at their first launch")
            return 0.0, {}
        try:
            plan = kernel_plan(self.pair, self.backend, new, prefill=not self.prefilled)
        except Exception as exc:  # noqa: BLE001 - reported: the kernels compile when launched
            report(f"compile-ahead skipped: the shape-only trace of blocks {new} raised "
                   f"{type(exc).__name__}: {exc}; kernels compile at their first launch")
            return time.perf_counter() - start, {}
        self.prefilled = True
        dev = str(self.backend.device)
        todo = [x for x in plan if (dev, x.key) not in _COMPILED]
        failed = self.backend.compile_ahead(todo)
        done: dict[str, int] = {}
        for x in todo:
            _COMPILED.add((dev, x.key))          # a failed one is not tried again either
            if x.key in failed:
                report(f"compile-ahead of {x.name} {x.constexprs()} failed: {failed[x.key]}; "
                       "that variant compiles at its first launch")
            else:
                done[x.name] = done.get(x.name, 0) + 1
        return time.perf_counter() - start, dict(sorted(done.items()))
