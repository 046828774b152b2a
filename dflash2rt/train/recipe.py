"""The whole recipe from one seed: corpus → tokenizer → target → distillation data → draft → eval."""

from __future__ import annotations

import copy
import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..backend import TorchOpsBackend
from ..errors import InvalidInputError
from ..models.config import TargetConfig
from ..models.draft import DraftModel
from ..models.draft_loader import save_draft
from ..models.hf_loader import load_target, save_target
from ..models.pair import ModelPair, load_pair
from ..models.target import TargetModel
from . import corpus as corpus_mod
from . import distill, evaluate, generate, target as target_mod, validate
from .draft_init import draft_config, init_draft
from .progress import Progress, fmt_s
from .recipe_config import EVAL_SETTINGS, RecipeConfig, mix_settings
from .tokenizer import train_tokenizer


def round_bf16_(model: torch.nn.Module) -> None:
    """Round every parameter to bfloat16 (kept in float32): the weights become exactly the shipped ones."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))


def save_pair(out: Path, target: TargetModel, draft: DraftModel, tok, eos_id: int) -> None:
    """target/ (HF Qwen3 + tokenizer) and draft/ (published DFlash2 layout), weights in bfloat16."""
    save_target(copy.deepcopy(target).to(torch.bfloat16), None, out / "target")
    tok.save(out / "target")
    (out / "target" / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": eos_id, "pad_token_id": eos_id}, indent=2) + "\n")
    (out / "target" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
         "pad_token": "<|endoftext|>", "model_max_length": target.cfg.max_position_embeddings},
        indent=2) + "\n")
    save_draft(copy.deepcopy(draft).to(torch.bfloat16), out / "draft")


def target_dir(value: str) -> Path:
    """A directory as given, else a bundled pair's target/ (InvalidInputError otherwise)."""
    from ..bundled import bundled_path

    path = Path(value)
    return path if path.is_dir() else bundled_path(value) / "target"


def given_target(directory: Path, tok, cfg: RecipeConfig) -> TargetModel:
    """The target of ``cfg.target_dir``, float32 with the draft's taps, after checking that its
    tokenizer is the one the recipe trained (prompts and ids must mean the same text)."""
    file = directory / "tokenizer.json"
    if not file.is_file():
        raise InvalidInputError(f"--target {directory}: no tokenizer.json there (a target "
                                f"directory of a pair made by this recipe is expected)")
    if json.loads(file.read_text(encoding="utf-8")) != json.loads(tok.backend.to_str()):
        raise InvalidInputError(f"--target {directory}: its tokenizer.json is not the one this "
                                f"recipe trains from the corpus (vocab {cfg.vocab_size}); a draft "
                                f"distilled here would not match that target's ids")
    target, _ = load_target(directory, torch.float32, "cpu", cfg.draft.target_layer_ids)
    return target


def weights_sha256(directory: Path) -> dict[str, str]:
    """sha256 of each safetensors file of a checkpoint directory."""
    import hashlib

    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(directory.glob("*.safetensors"))}


@dataclass
class _Clock:
    """Each phase's seconds since the previous one, logged as the phases finish."""

    log: object
    t0: float = field(default_factory=time.perf_counter)
    times: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._mark = self.t0

    def phase(self, name: str) -> None:
        now = time.perf_counter()
        self.times[name] = round(now - self._mark, 1)
        self._mark = now
        self.log(f"{name} done in {fmt_s(self.times[name])} (total {fmt_s(now - self.t0)})")


@dataclass
class _TargetStage:
    """The target the draft is distilled for, and how it got there."""

    model: TargetModel
    losses: list[float]              # training losses (empty for a given target)
    raw_held: dict | None            # held-out loss / entropy as trained (None: given target)
    shipped_held: dict               # held-out loss / entropy as shipped


def _tokenize_corpus(cfg: RecipeConfig, log):
    """The corpus, its trained tokenizer, and the training and held-out token streams."""
    corpus = corpus_mod.load_corpus(max_files=cfg.max_files)
    tok = train_tokenizer((text for _, text in corpus.train), cfg.vocab_size)
    train_docs = tok.encode_batch([text for _, text in corpus.train])
    stream = target_mod.token_stream(train_docs, tok.eos_id)
    held = target_mod.token_stream(tok.encode_batch([t for _, t in corpus.heldout]), tok.eos_id)
    log(f"corpus: {len(corpus.train)} training files ({stream.numel()} tokens), "
        f"{len(corpus.heldout)} held-out files ({held.numel()} tokens); vocab {tok.vocab_size}")
    return corpus, tok, stream, held


def _target_stage(cfg: RecipeConfig, tok, stream: torch.Tensor, held: torch.Tensor,
                  log) -> _TargetStage:
    """Train the target (or load ``cfg.target_dir``'s), scale its logits, round it to bfloat16."""
    seq = min(cfg.seq_len, held.numel() - 2)
    if cfg.target_dir is not None:
        target, losses, raw_held = given_target(target_dir(cfg.target_dir), tok, cfg), [], None
    else:
        tcfg = TargetConfig.from_dict(target_mod.target_config_dict(cfg.target, tok.vocab_size,
                                                                    tok.eos_id))
        target = TargetModel(tcfg, cfg.draft.target_layer_ids)
        target_mod.init_weights(target, torch.Generator().manual_seed(cfg.seed),
                                residual_layers=cfg.target.layers)
        losses = target_mod.train_target(target, stream, cfg.target_steps, cfg.target_batch,
                                         cfg.seq_len, cfg.target_lr, cfg.seed + 1)
        raw_held = target_mod.eval_stats(target, held, 16, seq, cfg.seed + 1)
        with torch.no_grad():
            target.lm_head.weight.mul_(cfg.target_logit_scale)
        round_bf16_(target)
    shipped_held = target_mod.eval_stats(target, held, 16, seq, cfg.seed + 1)
    log("target held-out loss / entropy (nats/token): " + (
        f"trained {raw_held['loss']:.3f} / {raw_held['entropy']:.3f}; shipped (logits × "
        f"{cfg.target_logit_scale:g}) " if raw_held else f"given ({cfg.target_dir}) ")
        + f"{shipped_held['loss']:.3f} / {shipped_held['entropy']:.3f}")
    return _TargetStage(target, losses, raw_held, shipped_held)


def _distill_data(cfg: RecipeConfig, corpus, tok, target: TargetModel, backend):
    """The target's continuations: training data (``cfg.gen_mix``), greedy and T = 1 validation."""
    lo, hi = cfg.gen_prompt_tokens
    prompts = corpus_mod.cut_prompts(corpus.train, tok.encode, cfg.gen_prompts, lo, hi, cfg.seed + 2)
    temps, top_ps = mix_settings(cfg.gen_mix, len(prompts), cfg.seed + 3)
    tonly = ModelPair(target, None)
    data = generate.build_distill_data(tonly, backend, [p["prompt_ids"] for p in prompts],
                                       cfg.gen_new_tokens, temps, cfg.gen_batch, cfg.seed + 4,
                                       top_ps=top_ps, soft_top=cfg.soft_top)
    val_prompts = corpus_mod.cut_prompts(corpus.heldout, tok.encode, 32, lo, hi, cfg.seed + 5)
    val = generate.build_distill_data(tonly, backend, [p["prompt_ids"] for p in val_prompts],
                                      cfg.gen_new_tokens, [0.0] * len(val_prompts), cfg.gen_batch,
                                      cfg.seed + 4)
    val_soft = generate.build_distill_data(tonly, backend, [p["prompt_ids"] for p in val_prompts],
                                           cfg.gen_new_tokens, [1.0] * len(val_prompts),
                                           cfg.gen_batch, cfg.seed + 9, soft_top=cfg.soft_top)
    return data, val, val_soft


def _draft_stage(cfg: RecipeConfig, tok, target: TargetModel, data, val, val_soft, log):
    """Distil the draft (validating as it goes) and round it to bfloat16.

    Returns (draft, training history, [(step, T=0 tau)], [(step, T=1 metrics)])."""
    dcfg = draft_config(target.cfg, cfg.draft, tok.mask_id)
    draft = DraftModel(dcfg)
    init_draft(draft, torch.Generator().manual_seed(cfg.seed + 6))
    val_tau: list[tuple[int, float]] = []
    val_t1: list[tuple[int, dict[str, float]]] = []

    def on_eval(step: int) -> None:
        val_tau.append((step, round(validate.engine_tau(draft, target, val), 3)))
        val_t1.append((step, {k: round(v, 4) for k, v in
                              validate.soft_metrics(draft, target, val_soft).items()}))
        log(f"draft step {step}: held-out T=0 tau, teacher-forced, engine walk: {val_tau[-1][1]:.3f}; "
            f"T=1 teacher-forced: mass {val_t1[-1][1]['mass']:.3f} acc {val_t1[-1][1]['acc1']:.3f} "
            f"tau {val_t1[-1][1]['tau1']:.3f}")

    history = distill.train_draft(draft, target, data, cfg.draft_steps, cfg.draft_seqs_per_step,
                                  cfg.draft_anchors, cfg.draft_lr, cfg.seed + 7, cfg.slot_decay,
                                  cfg.selector_weight, on_eval=on_eval,
                                  soft_weight=cfg.soft_weight, hard_weight=cfg.hard_weight,
                                  hard_argmax=cfg.hard_argmax)
    round_bf16_(draft)
    return draft, history, val_tau, val_t1


def _save_and_evaluate(out: Path, cfg: RecipeConfig, corpus, tok, target: TargetModel,
                       draft: DraftModel, backend, log) -> dict[str, dict]:
    """Save the pair and the held-out prompts, reload the pair, measure it at each EVAL_SETTINGS."""
    save_pair(out, target, draft, tok, tok.eos_id)
    lo, hi = cfg.heldout_tokens
    heldout = corpus_mod.cut_prompts(corpus.heldout, tok.encode, cfg.heldout_prompts, lo, hi, cfg.seed + 8)
    (out / "heldout_prompts.json").write_text(json.dumps(heldout, indent=1) + "\n")
    pair = load_pair(out / "target", out / "draft")
    ids = [p["prompt_ids"] for p in heldout]
    evals = {key: evaluate.measure(pair, backend, ids, cfg.eval_new_tokens, temp,
                                   baseline=temp == 0, top_p=top_p)
             for key, temp, top_p in EVAL_SETTINGS}
    greedy = evals["eval_greedy"]
    log(f"eval T=0: spec {greedy['spec_tokens_per_s']:.1f} tok/s vs target-only "
        f"{greedy['target_only_tokens_per_s']:.1f} tok/s (a spec step costs "
        f"{_spec_step_cost(greedy):.2f} target-only steps), mismatches "
        f"{greedy['greedy_mismatches']}; " + "; ".join(
            f"T={e['temperature']:g} top-p {e['top_p']:g}: tau {e['tau']:.3f} "
            f"(top-K mass {e['topk_mass']:.3f})" for e in evals.values()))
    return evals


def _spec_step_cost(greedy: dict) -> float:
    """τ / speedup = (spec step time) / (target-only step time): what one spec step costs."""
    return greedy["tau"] / max(greedy["speedup_vs_target_only"], 1e-9)


def _mean_last(values: list, n: int = 20) -> float:
    return sum(values[-n:]) / len(values[-n:])


def _report(out: Path, cfg: RecipeConfig, clock: _Clock, corpus, tok, stream: torch.Tensor,
            tstage: _TargetStage, draft: DraftModel, history: list[dict], val_tau: list,
            val_t1: list, data, evals: dict[str, dict]) -> dict:
    """``train_report.json``'s content."""
    greedy, raw_held = evals["eval_greedy"], tstage.raw_held
    target = {"params": sum(p.numel() for p in tstage.model.parameters()),
              "final_train_loss": _mean_last(tstage.losses) if tstage.losses else None,
              "heldout_loss": tstage.shipped_held["loss"],
              "heldout_entropy": tstage.shipped_held["entropy"],
              "logit_scale": cfg.target_logit_scale if raw_held else None,
              "trained_heldout_loss": raw_held["loss"] if raw_held else None,
              "trained_heldout_entropy": raw_held["entropy"] if raw_held else None,
              "given": None if cfg.target_dir is None else {
                  "dir": cfg.target_dir, "sha256": weights_sha256(target_dir(cfg.target_dir))}}
    return {
        "config": cfg.as_dict(), "seconds": clock.times,
        "total_seconds": round(time.perf_counter() - clock.t0, 1),
        "corpus": {"root": str(corpus.root), "train_files": len(corpus.train),
                   "heldout_files": len(corpus.heldout), "train_tokens": int(stream.numel()),
                   "python": platform.python_version()},
        "torch": torch.__version__, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id,
        "mask_id": tok.mask_id,
        "target": target,
        "draft": {"params": sum(p.numel() for p in draft.parameters()),
                  "final": {k: _mean_last([h[k] for h in history]) for k in history[-1]},
                  "validation_tau": val_tau, "validation_t1": val_t1,
                  "distill_sequences": data.num_sequences,
                  "distill_tokens": int(data.tokens.numel())},
        "eval_summary": {"block_size": greedy["block_size"],
                         "spec_step_cost_vs_target_only": _spec_step_cost(greedy),
                         **{key: {"temperature": e["temperature"], "top_p": e["top_p"],
                                  "tau": e["tau"], "topk_mass": e["topk_mass"]}
                            for key, e in evals.items()}},
        **evals,
        "bytes": {d: sum(f.stat().st_size for f in (out / d).iterdir()) for d in ("target", "draft")},
    }


def run_recipe(out: Path, cfg: RecipeConfig, log=None) -> dict:
    """Train and save the pair into ``out``; returns (and writes) ``train_report.json``."""
    cfg.check()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInputError(f"output directory {str(out)!r}: cannot create it ({exc.strerror})") \
            from None
    log = log or Progress("recipe", 1).log
    torch.set_num_threads(cfg.threads)
    torch.set_flush_denormal(True)
    torch.manual_seed(cfg.seed)
    clock = _Clock(log)

    corpus, tok, stream, held = _tokenize_corpus(cfg, log)
    clock.phase("tokenizer")
    tstage = _target_stage(cfg, tok, stream, held, log)
    clock.phase("target")
    backend = TorchOpsBackend("cpu", "cpu", (torch.float32,))
    data, val, val_soft = _distill_data(cfg, corpus, tok, tstage.model, backend)
    clock.phase("distill_data")
    draft, history, val_tau, val_t1 = _draft_stage(cfg, tok, tstage.model, data, val, val_soft, log)
    clock.phase("draft")
    evals = _save_and_evaluate(out, cfg, corpus, tok, tstage.model, draft, backend, log)
    clock.phase("eval")

    report = _report(out, cfg, clock, corpus, tok, stream, tstage, draft, history, val_tau,
                     val_t1, data, evals)
    (out / "train_report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report
