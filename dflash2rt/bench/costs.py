"""The cost model of speculation on one backend (``dflash2rt bench --costs``):

    speedup(b) = E[L](b) · T_target / (T_draft(b) + T_verify(b))

T_target (a target-only step), T_draft(b) (draft + select) and T_verify(b) (verify + accept +
commit) are measured per block size b, context length and batch size: a batch of random prompts
of that length is prefilled once, then each step is run ``reps`` times at that context (a step's
inputs are never modified, so every repeat sees the same context) between device syncs
(:func:`profile.synced_phases`), through the engine's Runner (``Runner.trial``: a step whose
results are discarded), eagerly or replayed as the backend runs it. Beside each
T_target: the bytes it must move (target weights + the live K/V) and the fraction of the
memory bandwidth that is, the bandwidth measured in the same run by a device-to-device copy.
E[L](b) comes from a per-slot acceptance α: given (``tau``: α such that E[L](16) = τ) or from
the bundled pair's measured τ at block 8; E[L](b) = (1 - α^b) / (1 - α).

Before a row allocates anything its memory is estimated (``cost_memory.row_memory``: ours and
transformers', every phase) and compared with the memory the device has free
(``models.memory.available_bytes``: MemAvailable on the CPU, ``mem_get_info`` elsewhere); a row
that does not fit is skipped and listed with both figures (``skipped_rows``).
"""

from __future__ import annotations

import gc
import time
from typing import Any, Callable, Sequence

import torch

from ..backend import Backend, Fallbacks
from ..engine.engine import Engine
from ..engine.memory import cache_bytes
from ..engine.request import Request, SamplingParams, is_int
from ..errors import InvalidInputError
from ..engine.runner import Runner
from ..engine.state import BatchState
from ..models.kv_cache import KVCache
from ..models.memory import GB, available_bytes, memory_note
from ..models.pair import ModelPair
from .cost_memory import RowMemory, row_memory
from .hf_baseline import HFDecode, keeps_last_logits
from .measure import sync
from .profile import synced_phases

BLOCKS = (1, 2, 4, 8, 16)
CONTEXTS = (128, 2048, 8192)
BATCHES = (1, 8)


def expected_len(alpha: float, block: int) -> float:
    """E[committed tokens] of a block-``block`` step with per-slot acceptance ``alpha``."""
    return float(block) if alpha >= 1 else (1 - alpha ** block) / (1 - alpha)


def alpha_for(tau: float, block: int) -> float:
    """The per-slot acceptance α with expected_len(α, block) = tau (bisection)."""
    if not 1 <= tau <= block:
        raise InvalidInputError(f"tau must be in [1, {block}] for block {block}, got {tau}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_len(mid, block) < tau else (lo, mid)
    return (lo + hi) / 2


def copy_bandwidth(device: torch.device, mbytes: int = 256, reps: int = 5) -> float:
    """GB/s of a device-to-device copy (read + write counted), best of ``reps``."""
    n = mbytes * 2**20 // 4
    x = torch.ones(n, device=device)
    y = torch.empty_like(x)
    best = float("inf")
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        y.copy_(x)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n * 4 / best / 1e9


def _bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def kv_bytes(pair: ModelPair, batch: int, context: int) -> int:
    """The target's live K/V of ``batch`` requests at ``context`` (what a step reads)."""
    a = pair.target.cfg
    return cache_bytes(a.num_hidden_layers, batch, context, a.num_key_value_heads, a.head_dim,
                       pair.dtype)


def step_costs(pair: ModelPair, backend: Backend, batch: int, context: int,
               blocks: Sequence[int], reps: int, seed: int = 0,
               peer: HFDecode | None = None) -> dict[int, dict[str, float]]:
    """block → {"draft", "verify"}: median seconds of each phase of one step (block 1: a
    target-only step, all in "verify") for ``batch`` random prompts of ``context`` tokens;
    0 → {"prefill": seconds of the one prefill of those prompts}. ``peer``: its ``step()`` runs
    after each of our target-only steps (warm-up included), so that a peer's steps interleave
    with ours (this machine's speed drifts; side by side means step by step); before the steps,
    both sides' K/V caches move to fresh memory together (``fresh_placement``)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = pair.target.cfg.vocab_size
    prompts = [tuple(torch.randint(0, vocab, (context,), generator=gen).tolist())
               for _ in range(batch)]
    reqs = [Request(p, SamplingParams(max_new_tokens=max(blocks) + 1)) for p in prompts]
    out: dict[int, dict[str, float]] = {}
    with Engine(pair, backend) as engine, torch.inference_mode(), backend.run_context():
        runner = engine.runner
        st = runner.start(reqs, True, max(blocks), None, Fallbacks().report, {})
        sync(backend.device)
        t0 = time.perf_counter()
        runner.prefill(st, list(prompts))
        sync(backend.device)
        out[0] = {"prefill": time.perf_counter() - t0}
        if peer is not None and backend.graph_adapter is None:
            fresh_placement(st, runner, peer.kv_layers())
        for b in blocks:
            runs = []
            for i in range(reps + 1):                               # the first: warm-up
                clock: dict[str, float] = {"draft": 0.0, "verify": 0.0}
                clocks: dict[int, Any] = {}
                with synced_phases(runner, clocks):
                    runner.trial(st, b, clock=clock)
                if b == 1 and peer is not None:
                    peer.step()
                if i:
                    runs.append(clocks[id(clock)][1])
            out[b] = {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in ("draft", "verify")}
    return out


def fresh_placement(st: BatchState, runner: Runner, peer_layers: Sequence[Any] = ()) -> None:
    """Copy our target K/V cache (``st.target_storage``) and a peer's (transformers' cache
    layers: ``keys`` / ``values`` attributes) into fresh memory, layer by layer, ours and
    theirs alternately, before timed steps. On some VMs (free-page reporting, no transparent
    huge pages) the same read runs a few percent faster from memory allocated later, and
    transformers allocates its static cache lazily during its prefill while ours exists before
    our prefill, so which side's cache reads faster would be decided by where each landed, not
    by code. Interleaved fresh copies give both the same luck
    (docs/benchmarks/real-scale.md). Contents and
    layout are unchanged; our old buffers are freed as each layer is copied (where nothing else
    holds them), so the copies need one layer of each cache at a time. Eager steps only, before
    the run's first step: step bodies bind the cache storage when the ``runner`` first steps a
    block (a graphed run's storage is the engine's static caches, which captured graphs read)."""
    if runner.blocks_used:
        raise RuntimeError(f"fresh_placement after steps of blocks {runner.blocks_used}: "
                           "their step bodies hold the old cache storage")
    keys, values = list(st.target_storage.k), list(st.target_storage.v)
    side = st.target_storage.side
    for i in range(max(len(keys), len(peer_layers))):
        if i < len(keys):        # clone keeps a dense tensor's strides: still head-major
            keys[i], values[i] = keys[i].clone(), values[i].clone()
            st.target_storage = KVCache(tuple(keys), tuple(values), side)   # the old layer freed
        if i < len(peer_layers):
            layer = peer_layers[i]
            layer.keys, layer.values = layer.keys.clone(), layer.values.clone()


def measure_costs(pair: ModelPair, backend: Backend, *, blocks: Sequence[int] = BLOCKS,
                  contexts: Sequence[int] = CONTEXTS, batches: Sequence[int] = BATCHES,
                  tau: float | None = None, tau_block: int = 16, reps: int = 3,
                  hf: Any = None, log: Callable[[str], None] = print,
                  available: Callable[[torch.device], int | None] = available_bytes
                  ) -> dict[str, Any]:
    """Every (batch, context) row: T_target, T_draft / T_verify per block, bytes, bandwidth
    fraction, projected speedup, and with ``hf`` (a ``hf_baseline.HFGreedy`` of the same target)
    transformers' target-only step; contexts the target cannot hold are skipped (and listed),
    and so are rows whose estimated memory exceeds ``available(device)`` (bytes free; None: not
    checked), with both figures."""
    if pair.draft is None:
        raise ValueError("the cost model needs a draft (a target-only pair has no spec step)")
    for name, values, least in (("blocks", blocks, 1), ("contexts", contexts, 1),
                                ("batches", batches, 1), ("reps", [reps], 1)):
        if not values or any(not is_int(v) or v < least for v in values):
            raise InvalidInputError(f"{name} must be integers >= {least}, got {values!r}")
    blocks = sorted(set(blocks) | {1})
    bw = copy_bandwidth(backend.device)
    alpha = alpha_for(tau, tau_block) if tau is not None else None
    weights = _bytes(pair.target)
    limit = pair.target.cfg.max_position_embeddings - max(blocks) - 1
    rows, skipped, skipped_rows = [], [c for c in contexts if c > limit], []
    keeps_last = hf is None or keeps_last_logits(hf.model)
    for batch in batches:
        for context in (c for c in contexts if c <= limit):
            gc.collect()                       # the previous row's caches, before reading free
            mem = row_memory(pair, batch, context, blocks, backend.graph_adapter is not None,
                             None if hf is None else reps + 2, keeps_last)
            free = available(backend.device)
            if free is not None and mem.needed > free:
                skipped_rows.append(_skip(batch, context, mem, free, backend.device,
                                          hf is not None, pair.dtype))
                log(f"batch {batch}, context {context}: skipped: {skipped_rows[-1]['reason']}")
                continue
            peer = (HFDecode(hf, batch, context, pair.target.cfg.vocab_size, reps + 2)
                    if hf is not None else None)     # transformers, same weights and shape
            c = step_costs(pair, backend, batch, context, blocks, reps,
                           peer=peer)
            t_target = c[1]["verify"]
            moved = weights + kv_bytes(pair, batch, context)
            row = {"batch": batch, "context": context, "t_target_s": t_target,
                   "t_prefill_s": c[0]["prefill"], "estimated_bytes": mem.needed,
                   "bytes_per_target_step": moved, "achieved_gbps": moved / t_target / 1e9,
                   "bandwidth_fraction": moved / t_target / 1e9 / bw,
                   "blocks": {b: {"t_draft_s": c[b]["draft"], "t_verify_s": c[b]["verify"],
                                  "step_over_target": (c[b]["draft"] + c[b]["verify"]) / t_target}
                              for b in blocks if b > 1}}
            if peer is not None:                # its steps interleaved with our T_target's
                row["transformers"] = {k: v for k, v in peer.result().items()
                                       if k not in ("prompts", "tokens")}
            peer = None                         # its cache goes before the next row's check
            if alpha is not None:
                row["projected_speedup"] = {
                    b: expected_len(alpha, b) * t_target / (v["t_draft_s"] + v["t_verify_s"])
                    for b, v in row["blocks"].items()}
            rows.append(row)
            log(f"batch {batch}, context {context}: target step {t_target * 1e3:.2f} ms, "
                f"{moved / 1e9:.3f} GB moved ({row['bandwidth_fraction']:.0%} of {bw:.1f} GB/s)")
    return {"backend": backend.name, "device": str(backend.device), "dtype": str(pair.dtype),
            "model_pass": Engine(pair, backend).model_pass,
            "copy_bandwidth_gbps": bw, "target_weight_bytes": weights,
            "draft_weight_bytes": _bytes(pair.draft),
            "acceptance": None if alpha is None else {
                "tau": tau, "tau_block": tau_block, "alpha": alpha,
                "expected_len": {b: expected_len(alpha, b) for b in blocks}},
            "rows": rows, "skipped_contexts": skipped, "skipped_rows": skipped_rows,
            "memory_check": _memory_check(backend.device, available),
            "transformers_prefill_logits": None if hf is None else
            "last row only (logits_to_keep=1)" if keeps_last else
            "every row: this transformers' forward takes no logits_to_keep",
            "kv_placement": None if hf is None or backend.graph_adapter is not None else
            "before each row's steps, both target K/V caches copied into fresh memory, layer "
            "by layer, alternately (costs.fresh_placement)",
            "method": "medians of per-phase seconds between device syncs after one warm-up "
                      "step, at a fixed context (step inputs are never modified)"}


def _skip(batch: int, context: int, mem: RowMemory, free: int, device: torch.device,
          compared: bool, dtype: torch.dtype) -> dict[str, Any]:
    """The JSON entry of a row that does not fit, with what it needed, what was free and
    what to change."""
    note = memory_note(device)
    if compared and mem.ours_alone <= free:
        fix = (f"ours alone needs {mem.ours_alone / GB:.2f} GB: pass --no-hf to measure it "
               "without transformers")
    else:
        fix = ("lower the batch or the context" + (", or the dtype (bfloat16 halves float32)"
                                                    if dtype.itemsize > 2 else "")
               + ", or use a device with more memory")
    return {"batch": batch, "context": context, "needed_bytes": mem.needed,
            "ours_alone_bytes": mem.ours_alone, "available_bytes": free,
            "peak_at": mem.peak_at, "parts": mem.parts,
            "reason": f"{mem.describe()}, {free / GB:.2f} GB available on {device}"
                      + (f" ({note})" if note else "") + f"; {fix}"}


def _memory_check(device: torch.device, available: Callable) -> str:
    where = ("MemAvailable in /proc/meminfo" if device.type == "cpu" else
             f"torch.{device.type}.mem_get_info, plus what torch's allocator holds unused")
    src = "" if available is available_bytes else " (a stand-in for the device's free memory)"
    return (f"each row's memory estimated before it allocates (bench/cost_memory.py: ours and "
            f"transformers', every phase) against {device}'s free memory ({where}){src}; rows "
            "that do not fit are in skipped_rows")


def projected_table(res: dict[str, Any]) -> str:
    """The rows as text: target step, bandwidth fraction, spec step / target step and the
    projected speedup per block size."""
    acc = res["acceptance"]
    head = (f"copy bandwidth {res['copy_bandwidth_gbps']:.1f} GB/s; acceptance: alpha "
            f"{acc['alpha']:.3f} (tau {acc['tau']:.2f} at block {acc['tau_block']})"
            if acc else f"copy bandwidth {res['copy_bandwidth_gbps']:.1f} GB/s")
    lines = [head + (f"; {res['model_pass']}" if res.get("model_pass") else "")]
    for r in res["rows"]:
        blocks = " ".join(f"b{b}: x{r['projected_speedup'][b]:.2f} ({v['step_over_target']:.2f})"
                          if "projected_speedup" in r else
                          f"b{b}: ({v['step_over_target']:.2f})"
                          for b, v in r["blocks"].items())
        hf = r.get("transformers")
        peer = (f" (transformers {hf['t_step_s'] * 1e3:.2f} ms, prefill "
                f"{hf['t_prefill_s']:.2f} s, {hf['cache']} cache)" if hf else "")
        lines.append(f"batch {r['batch']:>2} context {r['context']:>5}: target step "
                     f"{r['t_target_s'] * 1e3:8.2f} ms, prefill {r['t_prefill_s']:.2f} s{peer}, "
                     f"{r['bandwidth_fraction']:4.0%} of "
                     f"bandwidth; projected speedup (spec step / target step) {blocks}")
    for r in res.get("skipped_rows", ()):
        lines.append(f"batch {r['batch']:>2} context {r['context']:>5}: skipped: {r['reason']}")
    if res["skipped_contexts"]:
        lines.append(f"skipped contexts (beyond the target's positions): {res['skipped_contexts']}")
    if res.get("transformers_prefill_logits"):
        lines.append(f"transformers' prefill logits: {res['transformers_prefill_logits']}")
    return "\n".join(lines)
