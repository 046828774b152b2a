"""``dflash2rt run``: speculative decoding of prompts on a backend, with progress and stats."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from .prompt_file import read_prompt_file
from .run_progress import Progress
from .stats_line import stats_line, tp_stats_line

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="decode prompts with DFlash2 speculative decoding")
    p.add_argument("--backend", default=None, help="backend name (default: $DFLASH2RT_BACKEND "
                   "or the best available)")
    add_model_arguments(p)
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompt-file", help="a JSON file holding a non-empty list of prompts: all "
                   "non-empty strings, or all non-empty lists of integer token ids")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-candidates", type=int, default=None, metavar="K",
                   help="candidates per draft slot the selector offers (default: the draft's "
                        "trained count; any K keeps decoding lossless)")
    p.add_argument("--verification", choices=("token", "block"), default="token",
                   help="sampled drafts verified slot by slot (token) or as a whole block "
                        "(block: the same law, more drafts kept; float64 devices)")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="over prompt + output tokens: a positive logit / r, else × r (1 = off)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="minus f × the token's count in the output so far, in [-2, 2]")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="minus s if the token occurs in the output so far, in [-2, 2]")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="keep tokens with p >= min_p × max p (after top-k / top-p; 0 = off)")
    p.add_argument("--logit-bias", action="append", default=[], metavar="ID=BIAS",
                   help="add BIAS (in [-100, 100]) to token ID's logit (repeatable)")
    p.add_argument("--logprobs", type=int, default=None, metavar="N",
                   help="return each token's log-probability and its top-N alternatives "
                        "(with --json)")
    p.add_argument("--logprobs-mode", choices=("raw", "processed"), default="raw",
                   help="raw: the model's logits before any processing (vLLM's default); "
                        "processed: the final law the token was drawn from")
    p.add_argument("--regex", metavar="PATTERN", default=None,
                   help="constrain the output to match PATTERN (classes, *, +, ?, |, groups; "
                        "EOS allowed where it fully matches); lossless under speculation")
    p.add_argument("--block-size", type=_block, default=None, help="a fixed speculation block "
                   "(reproducible across machines); default ('auto'): adaptive, each step's "
                   "block size chosen from acceptance and measured step cost (1 = a "
                   "target-only step)")
    p.add_argument("--stop", action="append", default=[], help="a stop string (repeatable; the "
                   "text ends where the earliest one starts)")
    p.add_argument("--include-stop-str-in-output", action="store_true",
                   help="keep the stop string that ended the text (vLLM's option)")
    p.add_argument("--dtype", choices=["auto", *sorted(DTYPES)], default="auto",
                   help="model dtype (default auto: float32 on the CPU, the checkpoint's dtype, "
                        "bfloat16, on accelerators)")
    p.add_argument("--no-spec", action="store_true", help="target-only decoding (the baseline)")
    p.add_argument("--json", action="store_true", help="print texts, tokens and stats as JSON")
    p.add_argument("--watermark-key-file", metavar="FILE", help="watermark sampled tokens with "
                   "the key in FILE (`dflash2rt watermark keygen`); greedy output is unmarked")
    p.add_argument("--watermark-key-allow-shared", action="store_true",
                   help="read a key file that its group or others may read (refused otherwise)")
    p.add_argument("--metrics", metavar="FILE", help="write the run's speculation metrics "
                   "(drafts, drafted / accepted tokens, per position, mean acceptance length) "
                   "to FILE in the Prometheus text format, vLLM's names with a dflash2rt: prefix")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor-parallel ranks: the target sharded over N processes of this host "
                        "(spawned here, or launch with torchrun --nproc-per-node N -m dflash2rt "
                        "run --tp N); docs/tensor-parallel.md")
    p.add_argument("--tp-check", action="store_true",
                   help="with --tp: the ranks compare a hash of each step's committed tokens "
                        "(debug mode; a disagreement is an error)")
    p.set_defaults(func=run)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """--model, --draft, --revision, --draft-revision (docs/models.md)."""
    p.add_argument("--model", default="stdlib-code", help="bundled model name, a directory "
                   "with target/ and draft/ (or one checkpoint: the target), a Hugging Face hub "
                   "id such as Qwen/Qwen3-8B, or TARGET,DRAFT (directories or hub ids)")
    p.add_argument("--draft", default=None, metavar="PATH_OR_ID", help="the draft: a directory "
                   "or a hub id such as z-lab/Qwen3-8B-DFlash-b16 (replaces the model's draft/)")
    p.add_argument("--revision", default=None, help="branch, tag or commit of the --model hub "
                   "id (default main)")
    p.add_argument("--draft-revision", default=None, help="branch, tag or commit of the "
                   "--draft hub id (default main)")


def resolve_model_args(args: argparse.Namespace, device, dtype):
    """The pair --model / --draft / --revision / --draft-revision name."""
    from ..api import resolve_model

    return resolve_model(_model_arg(args.model), device, dtype, draft=args.draft,
                         revision=args.revision, draft_revision=args.draft_revision)


def _logit_bias(items: list[str]) -> dict[int, float]:
    """["ID=BIAS", ...] → {id: bias}; a malformed item, or a token given twice, is a typed error
    saying the form."""
    from ..errors import SamplingParamsError
    out: dict[int, float] = {}
    for item in items:
        tok, sep, bias = item.partition("=")
        try:
            key, value = int(tok), float(bias)
        except ValueError:
            sep = ""
        if not sep:
            raise SamplingParamsError(f"--logit-bias takes ID=BIAS (e.g. 42=-5.5), got {item!r}")
        if key in out:
            raise SamplingParamsError(f"--logit-bias gives token {key} twice ({out[key]:g} and "
                                      f"{value:g}): give each token once")
        out[key] = value
    return out


def _block(text: str) -> int | None:
    """--block-size: an integer, or 'auto' (adaptive, the default: None), as serve takes it."""
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"an integer or 'auto', got {text!r}") from None


def _model_arg(text: str):
    return tuple(text.split(",", 1)) if "," in text else text


def run(args: argparse.Namespace) -> int:
    from ..api import run as api_run
    from ..errors import InvalidInputError
    from ..metrics import check_metrics_path
    from ..registry import Registry

    prompts: list = list(args.prompt)
    if args.prompt_file:
        prompts += read_prompt_file(args.prompt_file)
    if not prompts:
        raise InvalidInputError("give at least one --prompt (or --prompt-file)")
    if args.logprobs is not None and not args.json:
        raise InvalidInputError("--logprobs needs --json: the text output has no place for "
                                "log-probabilities")
    if args.tp != 1:
        return _run_tp(args, prompts)
    if args.metrics is not None:
        check_metrics_path(args.metrics)          # before loading: a bad path fails at once
    key = _watermark_key(args)                    # before loading: a bad key file fails at once
    selection = Registry.discover().select(args.backend)
    print(selection.describe(), file=sys.stderr)
    dtype = "auto" if args.dtype == "auto" else DTYPES[args.dtype]
    pair, loaded = _load(args, selection.backend.device, dtype)
    single = len(prompts) == 1 and not args.json
    tok = pair.tokenizer
    progress = Progress(tok, single, lambda: _shown(tok, prompts[0]), args.stop,
                         lambda: _prompt_ids(pair, prompts[0]), args.include_stop_str_in_output)
    res = api_run(pair, selection.backend, prompts=prompts, max_new_tokens=args.max_new_tokens,
                  temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                  seed=args.seed, block_size=args.block_size, spec=not args.no_spec,
                  stop=args.stop, dtype=dtype, on_tokens=progress,
                  include_stop_str_in_output=args.include_stop_str_in_output,
                  repetition_penalty=args.repetition_penalty,
                  frequency_penalty=args.frequency_penalty,
                  presence_penalty=args.presence_penalty, min_p=args.min_p,
                  logit_bias=_logit_bias(args.logit_bias), logprobs=args.logprobs,
                  logprobs_mode=args.logprobs_mode,
                  regex=args.regex, metrics=args.metrics, watermark=key,
                  num_candidates=args.num_candidates, verification=args.verification)
    if args.json:
        print(file=sys.stderr)
        print(json.dumps({**res.as_dict(), "load": loaded}, indent=2))
        return 0
    if progress.stream_text:
        progress.finish(res.texts[0])
    else:
        print(file=sys.stderr)
        for i, text in enumerate(res.texts):
            print(f"--- [{i}] {res.outputs[i].finish_reason}\n{_shown(tok, prompts[i])}{text}")
    print(stats_line(res.stats), file=sys.stderr)
    return 0


def _watermark_key(args: argparse.Namespace):
    """The key --watermark-key-file names (None without it)."""
    if args.watermark_key_file is None:
        return None
    from ..watermark import WatermarkKey

    return WatermarkKey.from_file(args.watermark_key_file,
                                  allow_shared=args.watermark_key_allow_shared)


def _load(args: argparse.Namespace, device, dtype) -> tuple:
    """The pair the model arguments name, loaded on ``device``, and what loading took (printed
    on stderr) → (pair, load stats)."""
    load = _LoadWatch()
    pair = resolve_model_args(args, device, dtype)
    loaded = load.done(pair)
    print(f"loaded {pair.name} ({str(pair.dtype).replace('torch.', '')}) in "
          f"{loaded['seconds']:.1f}s: peak host RSS {loaded['peak_rss_bytes'] / 1e9:.2f} GB "
          f"(before loading {loaded['rss_before_bytes'] / 1e9:.2f} GB), checkpoint files "
          f"{loaded['checkpoint_bytes'] / 1e9:.2f} GB", file=sys.stderr)
    return pair, loaded


def _run_tp(args: argparse.Namespace, prompts: list) -> int:
    """--tp N: every rank loads and shards its own pair (api.run); only rank 0 prints.
    Tokens are not streamed (the texts are printed at the end)."""
    from ..api import run as api_run

    key = _watermark_key(args)
    res = api_run(_model_arg(args.model), args.backend, prompts=prompts, draft=args.draft,
                  revision=args.revision, draft_revision=args.draft_revision,
                  max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                  top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                  block_size=args.block_size, spec=not args.no_spec, stop=args.stop,
                  dtype="auto" if args.dtype == "auto" else DTYPES[args.dtype],
                  include_stop_str_in_output=args.include_stop_str_in_output,
                  repetition_penalty=args.repetition_penalty,
                  frequency_penalty=args.frequency_penalty,
                  presence_penalty=args.presence_penalty, min_p=args.min_p,
                  logit_bias=_logit_bias(args.logit_bias), logprobs=args.logprobs,
                  logprobs_mode=args.logprobs_mode, regex=args.regex, metrics=args.metrics,
                  watermark=key, tp=args.tp, tp_check=args.tp_check,
                  num_candidates=args.num_candidates, verification=args.verification)
    if res is None:                      # a rank other than 0 (torchrun)
        return 0
    if args.json:
        print(json.dumps(res.as_dict(), indent=2))
        return 0
    shown = _tp_prompts_shown(args, prompts)
    for i, text in enumerate(res.texts):
        print(f"--- [{i}] {res.outputs[i].finish_reason}\n{shown[i]}{text}")
    print(tp_stats_line(res.stats), file=sys.stderr)
    return 0


def _tp_prompts_shown(args: argparse.Namespace, prompts: list) -> list[str]:
    """The prompts as printed after a --tp run, whose pair lives in the ranks: token-id prompts
    decoded with the target's tokenizer (read alone), as the single-process path shows them."""
    if all(isinstance(p, str) for p in prompts):
        return prompts
    from ..models.hub import locate_pair
    from ..models.tokenizer import load_tokenizer

    target = locate_pair(_model_arg(args.model), args.draft, args.revision,
                         args.draft_revision, weights=False)[0].path
    tok = load_tokenizer(target) if (Path(target) / "tokenizer.json").is_file() else None
    return [_shown(tok, p) for p in prompts]


def _prompt_ids(pair, prompt: str | list[int]) -> list[int]:
    """A prompt's token ids, as the API encodes it."""
    return list(prompt) if not isinstance(prompt, str) else list(pair.tokenizer.encode(prompt))


def _shown(tokenizer, prompt: str | list[int]) -> str:
    """A prompt as printed: itself, or the decoded text of a token-id prompt (its ids without
    a tokenizer)."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.decode(prompt) if tokenizer is not None else str(prompt)


class _LoadWatch:
    """Seconds and peak host RSS of loading the models (the process's peak, so a model loaded
    earlier in the process hides this one's), next to the size of the checkpoint files."""

    def __init__(self) -> None:
        import time

        self.t0, self.rss0 = time.perf_counter(), _peak_rss()

    def done(self, pair) -> dict:
        import time

        files = []
        for m in (pair.target, pair.draft):
            src = getattr(m, "source_dir", None) if m is not None else None
            if src:
                files += [f for f in Path(src).glob("*.safetensors")]
        return {"seconds": time.perf_counter() - self.t0, "rss_before_bytes": self.rss0,
                "peak_rss_bytes": _peak_rss(),
                "checkpoint_bytes": sum(f.stat().st_size for f in files)}


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024      # Linux: kB
