"""``dflash2rt run``: speculative decoding of prompts on a backend, with progress and stats."""

from __future__ import annotations

import argparse
import json
import sys

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="decode prompts with DFlash2 speculative decoding")
    p.add_argument("--backend", default=None, help="backend name (default: $DFLASH2RT_BACKEND "
                   "or the best available)")
    p.add_argument("--model", default="stdlib-code", help="bundled model name, a directory "
                   "with target/ and draft/, or TARGET_DIR,DRAFT_DIR")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompt-file", help="a JSON list of prompt strings")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--no-spec", action="store_true", help="target-only decoding (the baseline)")
    p.add_argument("--json", action="store_true", help="print texts, tokens and stats as JSON")
    p.set_defaults(func=run)


def _model_arg(text: str):
    return tuple(text.split(",", 1)) if "," in text else text


class _Progress:
    """Streams the text of a single prompt to stdout; counts tokens on stderr otherwise."""

    def __init__(self, tokenizer, stream_text: bool) -> None:
        self.tokenizer, self.stream_text = tokenizer, stream_text and tokenizer is not None
        self.ids: list[int] = []
        self.shown = ""

    def __call__(self, i: int, ids: list[int]) -> None:
        self.ids += ids
        if self.stream_text:
            text = self.tokenizer.decode(self.ids)
            if text.endswith("\ufffd"):        # an incomplete UTF-8 sequence: wait for more
                return
            sys.stdout.write(text[len(self.shown):])
            sys.stdout.flush()
            self.shown = text
        else:
            print(f"\r{len(self.ids)} tokens generated", end="", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from ..api import resolve_model, run as api_run
    from ..errors import InvalidInputError
    from ..registry import Registry

    prompts = list(args.prompt)
    if args.prompt_file:
        with open(args.prompt_file, encoding="utf-8") as f:
            prompts += json.load(f)
    if not prompts:
        raise InvalidInputError("give at least one --prompt (or --prompt-file)")
    selection = Registry.discover().select(args.backend)
    print(selection.describe(), file=sys.stderr)
    dtype = DTYPES[args.dtype]
    pair = resolve_model(_model_arg(args.model), selection.backend.device, dtype)
    single = len(prompts) == 1 and not args.json
    progress = _Progress(pair.tokenizer, single)
    if progress.stream_text:
        sys.stdout.write(prompts[0])
    res = api_run(pair, selection.backend, prompts=prompts, max_new_tokens=args.max_new_tokens,
                  temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                  seed=args.seed, block_size=args.block_size, spec=not args.no_spec,
                  stop=args.stop, dtype=dtype, on_tokens=progress)
    if args.json:
        print(file=sys.stderr)
        print(json.dumps(res.as_dict(), indent=2))
        return 0
    if progress.stream_text:
        sys.stdout.write(res.texts[0][len(progress.shown):] + "\n")
    else:
        print(file=sys.stderr)
        for i, text in enumerate(res.texts):
            print(f"--- [{i}] {res.outputs[i].finish_reason}\n{prompts[i]}{text}")
    s = res.stats
    split = ", ".join(f"{k} {v:.3f}s" for k, v in s.time.items())
    print(f"[{s.mode} on {s.backend}] {s.generated} tokens in {s.wall_s:.2f}s = "
          f"{s.tokens_per_s:.1f} tok/s, tau {s.tau:.2f} (block {s.block_size}), "
          f"accept histogram {s.accept_hist}; {split}; fallbacks: {s.fallbacks or 'none'}",
          file=sys.stderr)
    return 0
