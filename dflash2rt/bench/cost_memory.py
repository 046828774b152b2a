"""What a row of the cost bench (``bench/costs.py``) will allocate, estimated before it
allocates anything, so that a row that cannot fit is skipped and reported instead of ending
in an out-of-memory kill.

The weights are resident before any row (they are not counted); a row allocates, in order:

- transformers (``HFDecode``, when compared): its static K/V cache of ``context + steps`` rows
  (one layer more for the DynamicCache fallback), its prefill's activations (a layer's
  projections, ``repeat_kv``'s copies of keys and values, the [batch, 1, context, keys] mask and
  SDPA's float copy of it, the MLP) and its prefill logits: the last row only where its
  forward takes ``logits_to_keep``, else [batch, context, vocab];
- ours: the target and draft K/V caches and the draft's context-hidden buffer, exactly as
  ``engine.memory.make_caches`` sizes them (the graph backends' static caches rounded up as
  the runner rounds them), then the prefill's activations (the hidden state and the draft's
  taps, a layer's projections and MLP, the key-range mask and SDPA's float copy, the draft's
  context K/V of every draft layer, the last row's logits);
- before the steps, ``fresh_placement``'s copies (one layer of each cache at a time);
- each step: the target's verify forward and the draft's forward over the largest block,
  with their [batch, block, vocab] logits and the copies sampling makes (and, on a graph
  backend, one captured step's memory per block size).

The row's need is the largest of those phases (each with everything that lives through it)
plus a slack for the allocator and Python (``SLACK``). Every term is an upper bound of what the
code allocates: ``tests/test_cost_memory.py`` measures real rows against it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..engine.memory import cache_bytes
from ..engine.mode import BUCKETS
from ..engine.runner import LEN_STEP
from ..graphs.runner import bucket_for
from ..models.config import TargetConfig
from ..models.memory import GB
from ..models.pair import ModelPair

SLACK = 0.05                  # of the peak, for the allocator's rounding and Python objects
SLACK_MIN = 256 * 2**20       # at least this much
SMALL = 2**20                 # ids, positions, rope tables, masks of a few rows, scalars
SAMPLING_COPIES = 6           # float32 copies of a step's logits that sampling and checks make
MASK_BYTES = 8                # per mask element: the bool mask, its temporaries, SDPA's copy


@dataclass(frozen=True)
class RowMemory:
    """A row's estimate: ``parts`` (bytes of each allocation), ``phases`` (bytes live at each
    phase's peak), ``needed`` (the largest phase plus the slack) and ``ours_alone`` (the same
    without transformers; equal to ``needed`` when it is not compared)."""

    parts: dict[str, int]
    phases: dict[str, int]
    needed: int
    ours_alone: int
    peak_at: str                  # the phase with the most bytes live

    def describe(self) -> str:
        top = sorted(self.parts.items(), key=lambda kv: -kv[1])[:4]
        return (f"needs {self.needed / GB:.2f} GB, at its peak in {self.peak_at} (largest "
                "parts: " + ", ".join(f"{k} {v / GB:.2f} GB" for k, v in top) + ")")


def _layer(cfg: TargetConfig, e: int, r: int, t: int, keys: int, group: int = 1,
           repeat_kv: bool = False) -> int:
    """Peak bytes one decoder layer allocates beyond its input for ``r`` × ``t`` new rows over
    ``keys`` keys: the larger of its attention half (the normed input, the q / k / v
    projections (one fused product's output, which its views keep alive), the q/k norms and
    rope's temporaries, the attention output and its flattened copy, o_proj; transformers'
    ``repeat_kv`` copies of keys and values) and its MLP half (the normed input, gate and up,
    silu, their product, down), plus the key mask (a bool [r, t·group, keys] built with
    temporaries, and SDPA's float copy of it). Half precision: the norms' float32
    temporaries."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    q, k = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    rt = r * t
    half = 4 * 2 * rt * max(h, q + k) if e < 4 else 0
    attn = rt * e * (2 * h + 5 * q + 3 * k) + half
    if repeat_kv:
        attn += 2 * r * keys * q * e
    mlp = rt * e * (2 * h + 4 * i) + half
    mask = r * t * group * keys * MASK_BYTES
    return max(attn, mlp) + mask


def _forward(cfg: TargetConfig, e: int, r: int, t: int, keys: int, taps: int, group: int = 1,
             repeat_kv: bool = False) -> int:
    """A decoder forward's peak beyond the weights and caches: the hidden state and the
    embedding, the taps it keeps and their stack, one layer's peak, small tensors."""
    return (r * t * cfg.hidden_size * e * (2 + 2 * taps)
            + _layer(cfg, e, r, t, keys, group, repeat_kv) + SMALL)


def _logits(cfg: TargetConfig, e: int, rows: int, copies: int) -> int:
    """``rows`` rows of logits in the model's dtype and ``copies`` float32 copies of them."""
    return rows * cfg.vocab_size * (e + 4 * copies)


def ours(pair: ModelPair, batch: int, context: int, blocks: Sequence[int], graphs: bool,
         peer: bool) -> dict[str, int]:
    """Our row's allocations (``RowMemory.parts`` names) for ``batch`` prompts of ``context``
    tokens stepped with ``blocks`` (block 1 included), as ``costs.step_costs`` runs them:
    requests of ``max(blocks) + 1`` new tokens, room for ``max(blocks)``."""
    if pair.draft is None:
        raise ValueError("the cost model needs a draft (a target-only pair has no spec step)")
    t, d = pair.target.cfg, pair.draft.cfg.arch
    e, b = pair.dtype.itemsize, max(blocks)
    max_len = context + (b + 1) + b + 1                      # Runner.max_len
    cap = batch
    if graphs:
        cap = bucket_for(batch, BUCKETS) or batch
        max_len = -(-max_len // LEN_STEP) * LEN_STEP
    caches = (cache_bytes(t.num_hidden_layers, cap, max_len, t.num_key_value_heads,
                          t.head_dim, pair.dtype)
              + cache_bytes(d.num_hidden_layers, cap, max_len, d.num_key_value_heads,
                            d.head_dim, pair.dtype)
              + cap * max_len * d.hidden_size * e)           # the draft's context hidden
    n_taps = len(pair.target.tap_layer_ids)
    rt, kd = batch * context, d.num_key_value_heads * d.head_dim
    draft_ctx = (rt * e * (n_taps * t.hidden_size + 2 * d.hidden_size
                           + 2 * d.num_hidden_layers * kd + 3 * kd))
    prefill = (max(_forward(t, e, batch, context, context, n_taps), draft_ctx)
               + _logits(t, e, batch, SAMPLING_COPIES))
    group_t = t.num_attention_heads // t.num_key_value_heads
    group_d = d.num_attention_heads // d.num_key_value_heads
    step = (_forward(t, e, cap, b, max_len, n_taps, group_t)
            + _forward(d, e, cap, b, max_len, 0, group_d)
            + 2 * _logits(t, e, cap * b, SAMPLING_COPIES))
    parts = {"our K/V caches": caches, "our prefill": prefill, "our step": step}
    if graphs:
        parts["our captured steps"] = step * len(set(blocks) | {1})
    if peer and not graphs:
        parts["fresh placement"] = cache_bytes(1, cap, max_len, t.num_key_value_heads,
                                               t.head_dim, pair.dtype)
    return parts


def transformers(cfg: TargetConfig, dtype: torch.dtype, batch: int, context: int, steps: int,
                 keeps_last: bool) -> dict[str, int]:
    """transformers' row (``hf_baseline.HFDecode``): its cache of ``context + steps`` rows
    and one layer more (the DynamicCache fallback's growth, or ``fresh_placement``'s copy of a
    static layer), its prefill (``keeps_last``: its forward takes ``logits_to_keep``) and a
    step."""
    e, keys = dtype.itemsize, context + steps
    layer = cache_bytes(1, batch, keys, cfg.num_key_value_heads, cfg.head_dim, dtype)
    return {"transformers' K/V cache": layer * (cfg.num_hidden_layers + 1),
            "transformers' prefill": (_forward(cfg, e, batch, context, keys, 0, repeat_kv=True)
                                      + _logits(cfg, e, batch if keeps_last else batch * context,
                                                0)),
            "transformers' step": _forward(cfg, e, batch, 1, keys, 0) + _logits(cfg, e, batch, 0)}


def row_memory(pair: ModelPair, batch: int, context: int, blocks: Sequence[int], graphs: bool,
               hf_steps: int | None, keeps_last: bool = True) -> RowMemory:
    """The row's parts, the bytes live at each phase, and its need (the largest phase plus
    the slack); ``hf_steps``: transformers' steps (None: not compared)."""
    p = ours(pair, batch, context, blocks, graphs, hf_steps is not None)
    if hf_steps is not None:
        p.update(transformers(pair.target.cfg, pair.dtype, batch, context, hf_steps,
                              keeps_last))
    hf_cache = p.get("transformers' K/V cache", 0)
    base = hf_cache + p["our K/V caches"]
    phases = {"our prefill": base + p["our prefill"],
              "fresh placement": base + p.get("fresh placement", 0),
              "steps": base + p.get("our captured steps", 0)
              + max(p["our step"], p.get("transformers' step", 0))}
    if hf_steps is not None:
        phases["transformers' prefill"] = hf_cache + p["transformers' prefill"]
    alone = {k: v - hf_cache for k, v in phases.items() if k != "transformers' prefill"}
    alone["steps"] = p["our K/V caches"] + p.get("our captured steps", 0) + p["our step"]
    peak_at = max(phases, key=phases.__getitem__)
    return RowMemory(p, phases, _slack(phases[peak_at]), _slack(max(alone.values())), peak_at)


def _slack(peak: int) -> int:
    return peak + max(SLACK_MIN, int(SLACK * peak))
