"""transformers ``generate()`` on the same target weights, as the peer baseline (optional)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

import torch

from .measure import sync


def hf_available() -> str | None:
    """None when transformers can be imported, else the reason it cannot."""
    try:
        import transformers  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - reported in the benchmark output
        return f"transformers not importable: {type(exc).__name__}: {exc}"
    return None


class HFGreedy:
    """Greedy ``generate()`` of a HF checkpoint directory (left-padded batches)."""

    def __init__(self, target_dir: str | Path, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        from transformers import AutoModelForCausalLM

        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype)
        self.model = self.model.to(self.device).eval()
        self.pad = 0

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int
                 ) -> tuple[list[list[int]], float]:
        """→ (new token ids per prompt, seconds)."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        sync(self.device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                      max_new_tokens=max_new_tokens,
                                      min_new_tokens=max_new_tokens, pad_token_id=self.pad,
                                      temperature=None, top_p=None, top_k=None)
        sync(self.device)
        seconds = time.perf_counter() - start
        return [row[width:].tolist() for row in out], seconds
