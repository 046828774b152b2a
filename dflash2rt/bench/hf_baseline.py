"""transformers ``generate()`` on the same target weights, as the peer baseline (optional).

Stopping rule, the same as ours: exactly ``max_new_tokens`` new tokens per prompt with EOS
ignored (our requests: ``ignore_eos=True``). transformers is told ``eos_token_id=None``, so its
only stopping criterion is the length and no extra logits processor runs in the timed path
(``min_new_tokens`` would add an EOS-masking processor our side does not have); each run checks
that every row got exactly ``max_new_tokens``."""

from __future__ import annotations

import inspect
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from .measure import sync


def hf_available() -> str | None:
    """None when transformers can be imported, else the reason it cannot."""
    try:
        import transformers  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - reported in the benchmark output
        return f"transformers not importable: {type(exc).__name__}: {exc}"
    return None


def generate_kwargs(max_new_tokens: int, pad: int, temperature: float = 0.0,
                    top_p: float = 1.0) -> dict[str, Any]:
    """``generate()`` arguments for exactly ``max_new_tokens`` new tokens, EOS ignored, greedy
    (``temperature`` 0) or sampled (temperature, top-p; top-k off, as our SamplingParams)."""
    kw: dict[str, Any] = {"max_new_tokens": max_new_tokens, "eos_token_id": None,
                          "pad_token_id": pad, "repetition_penalty": None}
    if temperature == 0:
        return {**kw, "do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    return {**kw, "do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}


class HFGreedy:
    """``generate()`` of a HF checkpoint directory (left-padded batches): greedy by default,
    sampled with ``temperature`` > 0 (the torch RNG seeded before the timed window)."""

    def __init__(self, target_dir: str | Path, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        from transformers import AutoModelForCausalLM

        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype)
        self.model = self.model.to(self.device).eval()
        self.pad = 0

    @classmethod
    def on_weights(cls, config: dict[str, Any], target: torch.nn.Module) -> tuple["HFGreedy", int]:
        """transformers' model of ``config`` (a target's config.json dict) built on the meta
        device (no weight memory, nothing read from disk, no initialisation) and given
        ``target``'s tensors (``share_weights``), with sdpa attention; its rope buffers are
        built on ``target``'s device → (it, the number of tensors shared)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        fields = {k: v for k, v in config.items() if k != "model_type"}
        hf_cfg = AutoConfig.for_model(config["model_type"], **fields)
        dtype = target.lm_head.weight.dtype
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_cfg, dtype=dtype,
                                                     attn_implementation="sdpa")
        self = cls.__new__(cls)
        self.device, self.model, self.pad = target.lm_head.weight.device, model.eval(), 0
        shared = self.share_weights(target)
        self._build_buffers()
        return self, shared

    def _build_buffers(self) -> None:
        """Rebuild the rotary-embedding modules whose buffers are still on the meta device
        (they are computed from the config, not stored: on the CPU, then moved to
        ``self.device``, as a loaded model's are); any other buffer or parameter left on the
        meta device raises ``ValueError``."""
        for name, module in list(self.model.named_modules()):
            if any(b.is_meta for b in module.buffers(recurse=False)) \
                    and type(module).__name__.endswith("RotaryEmbedding"):
                parent, _, attr = name.rpartition(".")
                setattr(self.model.get_submodule(parent) if parent else self.model, attr,
                        type(module)(module.config).to(self.device))   # as from_pretrained
        left = [n for n, t in (*self.model.named_parameters(), *self.model.named_buffers())
                if t.is_meta]
        if left:
            raise ValueError(f"transformers' {type(self.model).__name__} keeps {left[:3]} on the "
                             "meta device after sharing our weights: build it with "
                             "HFGreedy(target_dir) from a checkpoint instead")

    def share_weights(self, target: torch.nn.Module) -> int:
        """Point transformers' parameters at ``target``'s tensors of the same names (a
        ``models.target.TargetModel`` of the same checkpoint): both models then read the same
        memory, and transformers' own copy is freed. On some VMs (free-page reporting, no
        transparent huge pages) two copies of the same weights stream at speeds a few percent
        apart depending on which was allocated last, which would decide a side-by-side
        comparison by allocation order (docs/benchmarks/real-scale.md). transformers' model
        may be on the meta device (``on_weights``). → the number of tensors shared; a missing
        name, shape or dtype raises ``ValueError``."""
        ours, theirs = target.state_dict(), self.model.state_dict()
        for name, t in theirs.items():
            o = ours.get(name)
            if o is None or o.shape != t.shape or o.dtype != t.dtype \
                    or (o.device != t.device and not t.is_meta):
                raise ValueError(f"cannot share {name}: ours is "
                                 f"{None if o is None else (tuple(o.shape), o.dtype)}, "
                                 f"transformers' {(tuple(t.shape), t.dtype)}")
        self.model.load_state_dict({n: ours[n] for n in theirs}, strict=True, assign=True)
        return len(theirs)

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                 **extra: Any) -> tuple[list[list[int]], float]:
        """→ (new token ids per prompt, seconds), exactly ``max_new_tokens`` each; ``extra``:
        further ``generate()`` arguments (e.g. ``cache_implementation="static"``)."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        kw = {**generate_kwargs(max_new_tokens, self.pad, temperature, top_p), **extra}
        if temperature:
            torch.manual_seed(seed)
        sync(self.device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, **kw)
        sync(self.device)
        seconds = time.perf_counter() - start
        rows = [row[width:].tolist() for row in out]
        if any(len(r) != max_new_tokens for r in rows):
            raise RuntimeError(f"transformers generate() stopped early ({[len(r) for r in rows]}"
                               f" tokens, wanted {max_new_tokens} each): the stop rule differs")
        return rows, seconds


def keeps_last_logits(model: Any) -> bool:
    """Whether transformers' forward of ``model`` takes ``logits_to_keep`` (then its prefill
    computes the last row's logits only, not [batch, context, vocab])."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


class HFDecode:
    """transformers' target-only decode at ``context``, measured as ours is: one prefill of
    ``batch`` random prompts (timed), then each ``step()`` is one greedy forward of one token
    per row, between syncs (the first a warm-up). The cache is transformers' StaticCache (what
    ``generate(cache_implementation="static")`` uses), else its DynamicCache — ``result()`` says
    which ran, and why not static. Every forward asks for the last row's logits only
    (``logits_to_keep=1``, as ``generate()`` does) where the forward takes it; ``result()``
    says which."""

    def __init__(self, hf: Any, batch: int, context: int, vocab: int, steps: int = 8,
                 seed: int = 0) -> None:
        from transformers import DynamicCache, StaticCache

        gen = torch.Generator().manual_seed(seed)
        self.model, self.dev, self.context = hf.model, hf.device, context
        self.ids = torch.randint(0, vocab, (batch, context), generator=gen).to(self.dev)
        # transformers >= 5.x names the cache argument ``cache`` (``past_key_values`` deprecated)
        self.arg = ("cache" if "cache" in inspect.signature(self.model.forward).parameters
                    else "past_key_values")
        self.keep = {"logits_to_keep": 1} if keeps_last_logits(self.model) else {}
        self.steps_s: list[float] = []
        failed = ""
        for kind in ("static", "dynamic"):
            try:
                self.cache = (StaticCache(config=self.model.config, max_cache_len=context + steps)
                              if kind == "static" else DynamicCache(config=self.model.config))
                self.prefill_s = self._forward(self.ids, torch.arange(context, device=self.dev))
            except Exception as exc:  # noqa: BLE001 - reported: which cache ran, and why
                if kind == "dynamic":
                    raise
                failed = f"{type(exc).__name__}: {exc}"[:200]
                continue
            self.kind = "static" if kind == "static" else f"dynamic (static failed: {failed})"
            break
        self.tokens = [self.tok]

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> float:
        with torch.inference_mode():
            sync(self.dev)
            t0 = time.perf_counter()
            out = self.model(input_ids=ids, **{self.arg: self.cache}, use_cache=True,
                             cache_position=positions, **self.keep)
            self.tok = out.logits[:, -1:].argmax(-1)
            sync(self.dev)
            return time.perf_counter() - t0

    def step(self) -> None:
        pos = self.context + len(self.steps_s)
        self.steps_s.append(self._forward(self.tok, torch.tensor([pos], device=self.dev)))
        self.tokens.append(self.tok)

    def kv_layers(self) -> list[Any]:
        """The static cache's layers (each with ``keys`` / ``values`` [B, n_kv, L, hd]), which
        ``costs.fresh_placement`` may move; none for a DynamicCache (it reallocates each step)."""
        return list(self.cache.layers) if self.kind == "static" else []

    def result(self) -> dict[str, Any]:
        runs = sorted(self.steps_s[1:])                        # the first: warm-up
        return {"t_step_s": runs[len(runs) // 2], "t_prefill_s": self.prefill_s,
                "cache": self.kind, "steps": len(runs), "prompts": self.ids.tolist(),
                "prefill_logits": "last row only (logits_to_keep=1)" if self.keep else
                "every row ([batch, context, vocab]: this transformers' forward takes no "
                "logits_to_keep)",
                "tokens": torch.cat(self.tokens, 1).tolist()}


def hf_step(hf: Any, batch: int, context: int, vocab: int, new: int = 4, seed: int = 0
            ) -> dict[str, Any]:
    """``HFDecode`` on its own: a warm-up and ``new`` timed steps → its ``result()``."""
    dec = HFDecode(hf, batch, context, vocab, new + 2, seed)
    for _ in range(new + 1):
        dec.step()
    return dec.result()
