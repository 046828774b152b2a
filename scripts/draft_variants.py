"""Paired fine-tunes of the bundled draft: where its sampled τ can still come from
(docs/benchmarks/k-curve.md, "More training, another loss, one more layer").

Each variant starts from the shipped draft and trains the same ``--steps`` on the same
distillation batches (the recipe's data for the bundled target, made once and cached in
``--data-dir`` as safetensors), at the same warmed-up cosine learning rate:

* ``base``: no training, the shipped draft as it is (the reference row);
* ``more``: the recipe's own loss, ``--steps`` more;
* ``tv``: the selector's soft term replaced by total variation on its candidates,
  Σ_e w_e (mass_e − Σ_k min(p_k, q_k)): the per-slot acceptance at T = 1 itself, as the loss;
* ``grow``: the shipped layer plus a second decoder layer, initialised so that the draft
  starts exactly as shipped (its output projections zero), then the recipe's loss;
* ``layers2``: not a fine-tune: a two-layer draft distilled from scratch exactly as the
  recipe distils the shipped one (its initialisation, learning rate, batches and step count;
  ``--steps``, ``--lr`` and ``--seed`` do not apply), on the same data.

Every variant is rounded to bfloat16 like a shipped draft, then measured as the recipe
measures one: teacher-forced T = 0 τ and T = 1 acceptance on the validation continuations, and
the engine's τ on the bundled held-out prompts at T = 0, 0.7 / top-p 0.95 and 1 (block 8).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dflash2rt.backend import TorchOpsBackend
from dflash2rt.bundled import bundled_path
from dflash2rt.models.draft import DraftModel
from dflash2rt.models.pair import ModelPair, load_pair
from dflash2rt.train import distill, evaluate, recipe, validate
from dflash2rt.train.draft_init import draft_config, init_draft
from dflash2rt.train.generate import DistillData
from dflash2rt.train.recipe_config import EVAL_SETTINGS, RecipeConfig

VARIANTS = ("base", "more", "tv", "grow", "layers2")
BACKEND = TorchOpsBackend("cpu", "cpu", (torch.float32,))


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def distill_data(cfg: RecipeConfig, target, cache: Path) -> tuple[DistillData, ...]:
    """The recipe's (training, greedy validation, T = 1 validation) data, made once."""
    names = ("data", "val", "val_soft")
    files = [cache / f"{n}.safetensors" for n in names]
    if not all(f.is_file() for f in files):
        torch.manual_seed(cfg.seed)
        corpus, tok, _, _ = recipe._tokenize_corpus(cfg, log)
        made = recipe._distill_data(cfg, corpus, tok, target, BACKEND)
        cache.mkdir(parents=True, exist_ok=True)
        for d, f in zip(made, files):
            save_file({k: v.contiguous() for k, v in dataclasses.asdict(d).items()
                       if v is not None}, str(f))
    return tuple(DistillData(**load_file(str(f))) for f in files)


def tv_soft_losses(logits, scores, cand, batch, w):
    """``distill._soft_losses`` with the selector's soft term replaced by total variation."""
    loss_kl = distill.slot_kl(logits, batch, w)
    pc = distill.candidate_mass(cand, batch.soft_ids, batch.soft_p)
    mass = pc.sum(-1)
    acc = torch.minimum(pc, torch.softmax(scores, dim=-1)).sum(-1)          # [R, N, γ]
    loss_tv = ((mass - acc).mean(dim=(0, 1)) * w).sum()
    with torch.no_grad():
        extra = {"kl": loss_kl.item(), "selkl": loss_tv.item(), "mass": mass.mean().item(),
                 "acc1": acc.mean().item(),
                 "tau1": 1 + torch.cumprod(acc, dim=-1).sum(-1).mean().item()}
    return loss_kl, loss_tv, extra


KL_SOFT = distill._soft_losses        # the recipe's own soft losses


@contextlib.contextmanager
def soft_losses(fn):
    distill._soft_losses = fn
    try:
        yield
    finally:
        distill._soft_losses = KL_SOFT


def grown(cfg: RecipeConfig, target, shipped: DraftModel) -> DraftModel:
    """The shipped draft with a second decoder layer that adds nothing yet."""
    shape = dataclasses.replace(cfg.draft, layers=len(shipped.layers) + 1)
    d = DraftModel(draft_config(target.cfg, shape, shipped.cfg.mask_token_id))
    init_draft(d, torch.Generator().manual_seed(cfg.seed + 6))
    res = d.load_state_dict(shipped.state_dict(), strict=False)
    new = f"layers.{len(shipped.layers)}."
    assert not res.unexpected_keys and all(k.startswith(new) for k in res.missing_keys)
    with torch.no_grad():
        d.layers[-1].self_attn.o_proj.weight.zero_()
        d.layers[-1].mlp.down_proj.weight.zero_()
    return d


def measure(draft: DraftModel, target, val, val_soft, prompts, cfg: RecipeConfig) -> dict:
    recipe.round_bf16_(draft)
    draft.eval().requires_grad_(False)
    res = {"val_t0_tau": validate.engine_tau(draft, target, val),
           "val_t1": validate.soft_metrics(draft, target, val_soft)}
    pair = ModelPair(target, draft)
    for key, temp, top_p in EVAL_SETTINGS:
        e = evaluate.measure(pair, BACKEND, prompts, cfg.eval_new_tokens, temp, baseline=False,
                             top_p=top_p)
        res[key] = {"tau": e["tau"], "mass": e["topk_mass"]}
    return res


def plan(name: str, shipped: DraftModel, target, cfg: RecipeConfig, args) -> tuple:
    """(draft, steps, lr, batch seed, soft losses) of a variant; 0 steps for ``base``."""
    if name == "layers2":
        shape = dataclasses.replace(cfg.draft, layers=2)
        draft = DraftModel(draft_config(target.cfg, shape, shipped.cfg.mask_token_id))
        init_draft(draft, torch.Generator().manual_seed(cfg.seed + 6))
        return draft, cfg.draft_steps, cfg.draft_lr, cfg.seed + 7, KL_SOFT
    draft = grown(cfg, target, shipped) if name == "grow" else copy.deepcopy(shipped)
    steps = 0 if name == "base" else args.steps
    return draft, steps, args.lr, args.seed, tv_soft_losses if name == "tv" else KL_SOFT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=11, help="the batches' seed, the same for all")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data-dir", type=Path, default=Path("out/draft-variants"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    names = args.variants.split(",")
    if not set(names) <= set(VARIANTS):
        ap.error(f"--variants: choose from {', '.join(VARIANTS)}")
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    bp = bundled_path("stdlib-code")
    cfg = RecipeConfig(target_dir="stdlib-code")
    shipped_pair = load_pair(bp / "target", bp / "draft")
    target, shipped = shipped_pair.target, shipped_pair.draft    # the target with the taps
    data, val, val_soft = distill_data(cfg, target, args.data_dir)
    prompts = [p["prompt_ids"] for p in json.loads((bp / "heldout_prompts.json").read_text())]
    results = {}
    for name in names:
        draft, steps, lr, seed, losses = plan(name, shipped, target, cfg, args)
        if steps:
            t0 = time.perf_counter()
            with soft_losses(losses):
                distill.train_draft(draft, target, data, steps, cfg.draft_seqs_per_step,
                                    cfg.draft_anchors, lr, seed, cfg.slot_decay,
                                    cfg.selector_weight, every=50, soft_weight=cfg.soft_weight,
                                    hard_weight=cfg.hard_weight, hard_argmax=cfg.hard_argmax)
            log(f"{name}: {steps} steps in {time.perf_counter() - t0:.0f} s")
        results[name] = measure(draft, target, val, val_soft, prompts, cfg)
        log(f"{name}: {json.dumps(results[name])}")
    print("| variant | val T=0 τ | val T=1 acc / slot | val T=1 τ | τ T=0 | τ T=0.7 p0.95 "
          "| τ T=1 | T=1 / T=0 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in results.items():
        g, s7, s1 = (r[k]["tau"] for k in ("eval_greedy", "eval_t07_p095", "eval_t1"))
        print(f"| {name} | {r['val_t0_tau']:.3f} | {r['val_t1']['acc1']:.4f} | "
              f"{r['val_t1']['tau1']:.3f} | {g:.3f} | {s7:.3f} | {s1:.3f} | {s1 / g:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
