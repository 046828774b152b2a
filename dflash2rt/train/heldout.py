"""τ of a pair on its held-out prompts at the draft's fixed block size, as the recipe's
evaluation measures it (:func:`~dflash2rt.train.evaluate.measure`: batch 1, every prompt alone,
spec warmed up then timed; target-only too at T = 0, with the greedy equality check), at each of
the recipe's ``EVAL_SETTINGS`` (T = 0, 0.7 / top-p 0.95 and 1), with the top-K mass beside each
τ and the engine's per-slot acceptance (``dflash2rt bench heldout``)."""

from __future__ import annotations

from typing import Callable, Sequence

from ..backend import Backend
from ..models.pair import ModelPair
from .evaluate import measure
from .recipe_config import EVAL_SETTINGS


def per_slot(hist: Sequence[int], block: int) -> list[float]:
    """Accept histogram (hist[a]: steps that accepted a drafts) → P(slot i accepted | reached),
    slots 1 .. block - 1."""
    hist = list(hist) + [0] * (block - len(hist))
    reach = [sum(hist[i:]) for i in range(len(hist))]          # steps that reached slot i + 1
    return [reach[i + 1] / reach[i] if reach[i] else 0.0 for i in range(len(hist) - 1)]


def evaluate_heldout(pair: ModelPair, backend: Backend | str, prompt_ids: list[list[int]],
                     new_tokens: int, log: Callable[[str], None] = print) -> dict[str, dict]:
    """``measure`` at every EVAL_SETTINGS entry, keyed as the recipe's report keys them, each
    with its ``per_slot`` acceptance; one line logged per setting."""
    out = {}
    for key, temp, top_p in EVAL_SETTINGS:
        r = measure(pair, backend, prompt_ids, new_tokens, temp, baseline=temp == 0, top_p=top_p)
        r["per_slot_acceptance"] = per_slot(r["accept_hist"], r["block_size"])
        out[key] = r
        log(f"T={temp:g} top-p {top_p:g}: tau {r['tau']:.3f} at block {r['block_size']} "
            f"(steps per block {r['steps_per_block']}), top-K mass {r['topk_mass']:.3f}"
            + (f", greedy mismatches {r['greedy_mismatches']}" if temp == 0 else "")
            + "; per slot " + " ".join(f"{a:.3f}" for a in r["per_slot_acceptance"]))
    return out
