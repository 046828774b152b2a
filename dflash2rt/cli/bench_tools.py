"""``dflash2rt bench TOOL``: measurements beside the main bench, each its own subcommand.

``heldout``         τ of a pair on its held-out prompts, as the training recipe evaluates it
``sampling``        sampling parameters under speculation: greedy equality, and their cost
``watermark``       watermark detection power, false positives and cost
``tp-equivalence``  greedy TP=N vs TP=1 on one host, differences explained by near-ties
``ablation``        adaptive speculation without each of its mechanisms, side by side with
                    target-only, the full policy and fixed blocks
``step-profile``    where a graphed decode step's time goes on a GPU backend; ``--launches``:
                    the kernels a step and a prefill launch, counted on the CPU

Each writes JSON with ``--json`` (stdout) or ``--json-out FILE``; progress goes to stderr."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MODEL_HELP = "bundled model name or a directory with target/, draft/ and heldout_prompts.json"


def add_parsers(tools: argparse._SubParsersAction) -> None:
    for add in (_add_heldout, _add_sampling, _add_watermark, _add_tp_equivalence,
                _add_ablation, _add_step_profile):
        p = add(tools)
        p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
        p.add_argument("--json-out", default=None, metavar="FILE",
                       help="also write the JSON to FILE")


def _emit(args: argparse.Namespace, res: dict) -> int:
    text = json.dumps(res, indent=1, default=str)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n", encoding="utf-8")
    if args.json:
        print(text)
    return 0


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _pair(args: argparse.Namespace):
    """(backend, loaded pair) of ``--backend`` and ``--model``."""
    from ..api import resolve_model
    from ..registry import Registry

    backend = Registry.discover().select(args.backend).backend
    return backend, resolve_model(args.model, backend.device)


def _add_heldout(tools: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = tools.add_parser("heldout", help="τ of a pair on its held-out prompts at the draft's "
                         "block size, at T = 0, 0.7 / top-p 0.95 and 1, as `train` evaluates")
    p.add_argument("--model", default="stdlib-code", help=MODEL_HELP)
    p.add_argument("--backend", default="cpu")
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt")
    p.set_defaults(func=_heldout)
    return p


def _heldout(args: argparse.Namespace) -> int:
    from ..bundled import heldout_ids, model_dir
    from ..models.pair import load_pair
    from ..train.heldout import evaluate_heldout

    root = model_dir(args.model)
    pair = load_pair(root / "target", root / "draft")
    return _emit(args, evaluate_heldout(pair, args.backend, heldout_ids(root),
                                        args.max_new_tokens, _log))


def _add_sampling(tools: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = tools.add_parser("sampling", help="each sampling parameter under speculation: greedy "
                         "spec == target-only, and the processors' cost at T = 0.7")
    p.add_argument("--model", default="stdlib-code", help=MODEL_HELP)
    p.add_argument("--backend", default="cpu")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=8, help="held-out prompts")
    p.add_argument("--repeats", type=int, default=3, help="interleaved timed rounds")
    p.set_defaults(func=_sampling)
    return p


def _sampling(args: argparse.Namespace) -> int:
    from ..bench.sampling import sampling_bench
    from ..bench.suite import heldout_prompts
    from ..bundled import model_dir
    from ..engine.engine import Engine

    backend, pair = _pair(args)
    prompts = heldout_prompts(model_dir(args.model), pair)[:args.prompts]
    with Engine(pair, backend) as eng:
        res = sampling_bench(eng, prompts, args.max_new_tokens, args.repeats, _log)
    return _emit(args, res)


def _add_watermark(tools: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = tools.add_parser("watermark", help="watermark detection power, false positives and cost "
                         "(docs/benchmarks/watermark.md)")
    p.add_argument("--model", default="stdlib-code", help=MODEL_HELP)
    p.add_argument("--backend", default=None)
    p.add_argument("--docs", type=int, default=200, help="watermarked documents per temperature")
    p.add_argument("--lengths", default="32,64,128,256", help="new-token counts scored")
    p.add_argument("--temperatures", default="1.0,0.7")
    p.add_argument("--null-texts", type=int, default=1000,
                   help="unwatermarked texts (generations + held-out chunks), each under --keys "
                        "fresh keys")
    p.add_argument("--keys", type=int, default=5)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--block-size", type=int, default=None, help="fixed block (default adaptive)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_watermark)
    return p


def _watermark(args: argparse.Namespace) -> int:
    from ..bench.watermark import WatermarkBenchConfig, watermark_bench
    from ..engine.engine import Engine
    from ..train.corpus import cut_prompts, load_corpus

    backend, pair = _pair(args)
    cfg = WatermarkBenchConfig(
        lengths=comma_numbers("--lengths", args.lengths),
        temperatures=comma_numbers("--temperatures", args.temperatures, float),
        null_texts=args.null_texts, keys=args.keys, batch=args.batch,
        block_size=args.block_size, seed=args.seed)
    corpus = load_corpus()
    prompts = [p["prompt_ids"] for p in cut_prompts(corpus.heldout, pair.tokenizer.encode,
                                                    args.docs, 16, 64, args.seed)]
    heldout_ids = (pair.tokenizer.encode(text) for _, text in corpus.heldout)
    res = watermark_bench(Engine(pair, backend), prompts, heldout_ids, cfg, _log)
    _log(json.dumps(res["false_positives"]))
    return _emit(args, {"model": pair.name, "backend": backend.name, **res})


def _add_tp_equivalence(tools: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = tools.add_parser("tp-equivalence", help="greedy TP=N vs TP=1 on this host's CPU "
                         "(docs/tensor-parallel.md)")
    p.add_argument("--model", default="stdlib-code", help="what `run` takes: a bundled name or "
                   "a pair directory")
    p.add_argument("--prompts", type=int, default=4, help="the bundled pair's held-out prompts")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--token-prompts", action="store_true",
                   help="the prompts' bytes as token ids (a synthetic pair without a tokenizer)")
    p.set_defaults(func=_tp_equivalence)
    return p


def _tp_equivalence(args: argparse.Namespace) -> int:
    import time

    from ..bundled import bundled_path, heldout
    from ..qualify.tp_equivalence import tp_equivalence

    prompts = [p["prompt"] for p in heldout(bundled_path("stdlib-code"))[:args.prompts]]
    if args.token_prompts:
        prompts = [list(p.encode()[:96]) for p in prompts]
    t0 = time.monotonic()
    res = tp_equivalence(args.model, prompts, args.max_new_tokens, args.tp, args.block_size)
    _log(res.summary())
    _log(f"  {res.tensor_parallel}; {time.monotonic() - t0:.0f}s")
    return _emit(args, res.to_dict())


def _add_ablation(tools: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = tools.add_parser("ablation", help="target-only, adaptive, adaptive without each "
                         "mechanism (AdaptivePolicy(without=...)) and fixed blocks side by side "
                         "at every temperature x batch (docs/benchmarks/ablation.md)")
    p.add_argument("--model", default="stdlib-code", help=MODEL_HELP)
    p.add_argument("--backend", default="cpu")
    p.add_argument("--max-new-tokens", type=int, default=None, help="new tokens per prompt "
                   "(default 128; --quick: 8)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved timed rounds, every "
                   "contender warmed up first (default 3; --quick: 1)")
    p.add_argument("--prompts", type=int, default=None, help="held-out prompts decoded alone "
                   "at batch 1 (default 8; --quick: 1)")
    p.add_argument("--temperatures", default="0,0.7,1", help="temperatures of the rows (0.7: "
                   "top-p 0.95; V:P for top-p P); T = 0 always comes first")
    p.add_argument("--batches", default="1,8", help="batch sizes of the rows")
    p.add_argument("--blocks", default="4,8", help="the fixed-block contenders")
    p.add_argument("--mixed-lengths", action="store_true", help="request i generates "
                   "max-new-tokens x (i mod 4 + 1) / 4 tokens, so the rows of a batch end at "
                   "different steps (what the finish rule prices)")
    p.add_argument("--quick", action="store_true", help="a smoke run: every contender and row, "
                   "few tokens, one round (its figures mean nothing)")
    p.set_defaults(func=_ablation)
    return p


def _ablation(args: argparse.Namespace) -> int:
    from ..bench.ablation import QUICK, ablation_table, measure_ablation
    from ..bench.suite import heldout_prompts, parse_temperatures
    from ..bundled import model_dir

    defaults = QUICK if args.quick else {"max_new_tokens": 128, "repeats": 3, "prompts": 8}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    backend, pair = _pair(args)
    prompts = heldout_prompts(model_dir(args.model), pair)
    res = measure_ablation(pair, prompts, backend, args.max_new_tokens, args.repeats,
                           args.prompts, parse_temperatures(args.temperatures),
                           comma_numbers("--batches", args.batches),
                           comma_numbers("--blocks", args.blocks), _log,
                           mixed_lengths=args.mixed_lengths)
    res["quick"] = args.quick
    _emit(args, res)
    if not args.json:
        print(ablation_table(res))
    return 0


def _add_step_profile(tools: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = tools.add_parser("step-profile", help="where a graphed decode step's time goes on a GPU "
                         "backend: the synced split, each graph's replay, top kernels, GEMMs")
    p.add_argument("--model", default="stdlib-code", help=MODEL_HELP)
    p.add_argument("--backend", default="cuda")
    p.add_argument("--launches", action="store_true",
                   help="only the kernel launches per step and prefill, counted on the CPU as "
                   "the backend's device runs them (any backend; no device needed)")
    p.add_argument("--rows", type=int, default=1, help="--launches: the batch")
    p.add_argument("--blocks", default="8", help="--launches: speculative blocks, e.g. 4,8")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="--launches: the pair's dtype")
    p.set_defaults(func=_step_profile)
    return p


def _step_profile(args: argparse.Namespace) -> int:
    import torch

    from ..api import resolve_model
    from ..bench.launches import count_launches, launches_text
    from ..bench.step_profile import step_profile, step_profile_text
    from ..registry import Registry

    backend = Registry.discover().select(args.backend).backend
    if args.launches:
        pair = resolve_model(args.model, "cpu", getattr(torch, args.dtype))
        res = {"backend": backend.name, "dtype": args.dtype, "rows": args.rows,
               "launches": count_launches(pair, backend, comma_numbers("--blocks", args.blocks),
                                          rows=args.rows)}
        _emit(args, res)
        if not args.json:
            print(launches_text(res["launches"]))
        return 0
    if backend.graph_adapter is None:
        _log(f"{args.backend} captures no graphs: nothing to profile")
        return 1
    res = step_profile(resolve_model(args.model, backend.device, torch.float32), backend)
    _emit(args, res)
    if not args.json:
        print(step_profile_text(res))
    return 0


def comma_numbers(flag: str, text: str, kind: type = int) -> list:
    """The comma-separated numbers of ``flag`` (every bench command's lists); InvalidInputError
    naming it otherwise."""
    from ..errors import InvalidInputError

    try:
        return [kind(x) for x in text.split(",")]
    except ValueError:
        what = "integers" if kind is int else "numbers"
        raise InvalidInputError(f"{flag} takes {what}, comma-separated, got {text!r}") from None
