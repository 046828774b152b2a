"""``dflash2rt serve``: an OpenAI-compatible server with continuous batching (docs/serving.md)."""

from __future__ import annotations

import argparse
import os
import sys

from .run_cmd import DTYPES


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model pair over OpenAI's HTTP API "
                       "(/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics)")
    p.add_argument("model", nargs="?", default="stdlib-code", help="bundled model name, a "
                   "directory with target/ and draft/ (or one checkpoint), a hub id, or "
                   "TARGET,DRAFT (default: stdlib-code)")
    p.add_argument("--backend", default=None, help="backend name (default: $DFLASH2RT_BACKEND "
                   "or the best available)")
    p.add_argument("--draft", default=None, metavar="PATH_OR_ID", help="the draft (replaces "
                   "the model's draft/)")
    p.add_argument("--revision", default=None, help="branch, tag or commit of a hub model")
    p.add_argument("--draft-revision", default=None, help="branch, tag or commit of a hub draft")
    p.add_argument("--dtype", choices=["auto", *sorted(DTYPES)], default="auto")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: "
                   "this machine only; 0.0.0.0 exposes the server to the network)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on the "
                   "/v1 routes (default: $DFLASH2RT_API_KEY, else no key)")
    p.add_argument("--served-model-name", action="append", default=None, metavar="NAME",
                   help="the model name(s) requests give (repeatable; default: the model's)")
    p.add_argument("--no-spec", action="store_true", help="target-only decoding")
    p.add_argument("--block-size", type=_block, default=None, help="the speculation block of "
                   "every step (default: the draft's), or 'auto': adaptive, chosen per step "
                   "(greedy requests stay batch-independent, seeded sampled ones do not)")
    p.add_argument("--max-num-seqs", type=int, default=16, help="the largest decoding batch")
    p.add_argument("--max-model-len", type=int, default=None, help="prompt + output tokens a "
                   "request may take (default: the target's context)")
    p.add_argument("--kv-cache-gib", type=float, default=None, help="memory budget of the KV "
                   "caches in GiB: the batch is lowered to what fits")
    p.add_argument("--max-queue", type=int, default=256, help="requests that may wait for a "
                   "slot; beyond that the server answers 503 with Retry-After")
    p.add_argument("--stream-interval", type=int, default=1, metavar="N", help="tokens a "
                   "streamed chunk gathers before it is sent (default 1: every step's tokens at "
                   "once; a request's first tokens and its end are never held): fewer chunks, "
                   "less host time per token, burstier streams")
    p.add_argument("--chat-template", default=None, metavar="FILE_OR_TEMPLATE",
                   help="a Jinja chat template (default: the model's, if it has one)")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="seconds SIGTERM waits "
                   "for the requests in flight before exiting")
    p.add_argument("--log-level", default="info",
                   choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..serve import build_server, check_drain_timeout, check_port, run_server

    check_port(args.port)                  # before the models load
    check_drain_timeout(args.drain_timeout)
    model = tuple(args.model.split(",", 1)) if "," in args.model else args.model
    server = build_server(
        model, args.backend, draft=args.draft, revision=args.revision,
        draft_revision=args.draft_revision,
        dtype="auto" if args.dtype == "auto" else DTYPES[args.dtype], spec=not args.no_spec,
        block_size=args.block_size, max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len, max_queue=args.max_queue,
        kv_cache_gib=args.kv_cache_gib, served_model_name=args.served_model_name,
        chat_template=args.chat_template,
        api_key=(args.api_key if args.api_key is not None
                 else os.environ.get("DFLASH2RT_API_KEY") or None),
        stream_interval=args.stream_interval)
    s = server.scheduler
    print(f"dflash2rt serve: {', '.join(server.limits.model_names)} on "
          f"{server.engine.backend.name}, "
          f"{_mode(s.block)}, batch {s.slots}, "
          f"context {s.max_model_len}, queue {s.max_queue}, chat "
          f"{'on' if server.template is not None else 'off (no template)'}; "
          f"http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    run_server(server, args.host, args.port, args.drain_timeout, args.log_level)
    return 0


def _block(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"an integer >= 2 or 'auto', got {text!r}") from None


def _mode(block: int | None) -> str:
    return "adaptive blocks" if block is None else "target-only" if block == 1 \
        else f"block {block}"


def add_bench_parser(tools: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``dflash2rt bench serve``: the server under load on the loopback (serve/load.py)."""
    p = tools.add_parser("serve", help="the OpenAI server under load on the loopback "
                         "(speculative at the draft's block, adaptive, target-only): "
                         "throughput, TTFT, TPOT, ITL, acceptance length, and run() on the "
                         "same requests beside it")
    p.add_argument("--model", default="stdlib-code", help="bundled name or a directory with "
                   "target/, draft/ and heldout_prompts.json (its prompts are sent)")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--concurrency", default="1,4,16", help="client counts, comma-separated")
    p.add_argument("--requests", type=int, default=48, help="requests per run (at most)")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds per run (at most)")
    p.add_argument("--max-tokens", default="64", metavar="N|LO:HI", help="output tokens per "
                   "request (EOS ignored): N each, or LO:HI, lengths spread evenly over the "
                   "range, each once in every largest-concurrency requests (a static batch "
                   "of that size holds each once)")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--servers", default="spec,adaptive,target-only", help="which servers, "
                   "comma-separated, from spec (the draft's block), adaptive and target-only")
    p.add_argument("--stream-interval", type=int, default=1, metavar="N", help="the servers' "
                   "--stream-interval")
    p.add_argument("--rounds", type=int, default=3, help="rounds over the concurrencies, "
                   "each server run beside its run() reference (the targets: paired medians)")
    p.add_argument("--markdown", default=None, metavar="FILE", help="also write the table")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument("--json-out", default=None, metavar="FILE", help="also write the JSON")
    p.set_defaults(func=bench)
    return p


def bench(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from ..api import backend_of, measured_table, resolve_model
    from ..serve.load import Offline, bench_serve, markdown, output_lengths, targets
    from ..bundled import heldout, model_dir
    from ..errors import InvalidInputError
    from ..serve.live import SpawnedServer

    root = model_dir(args.model)
    prompts = [h["prompt"] for h in heldout(root)]
    try:
        levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise InvalidInputError(f"--concurrency takes positive integers, comma-separated, got "
                                f"{args.concurrency!r}")
    if min(args.requests, args.rounds, args.stream_interval) < 1 or args.time_limit <= 0:
        raise InvalidInputError("--requests, --time-limit, --rounds and --stream-interval must "
                                "be positive")
    try:
        lengths = output_lengths(args.max_tokens, max(levels))
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None
    flags = {"spec": [], "adaptive": ["--block-size", "auto"], "target-only": ["--no-spec"]}
    servers = args.servers.split(",")
    if not set(servers) <= set(flags) or len(set(servers)) < len(servers):
        raise InvalidInputError(f"--servers takes distinct names from {', '.join(flags)}, "
                                f"comma-separated, got {args.servers!r}")

    def start(name: str) -> SpawnedServer:
        return SpawnedServer([str(root), "--backend", args.backend, *flags[name],
                              "--max-num-seqs", str(args.max_num_seqs),
                              "--max-queue", str(max(levels)),
                              "--stream-interval", str(args.stream_interval)])

    be = backend_of(args.backend)
    pair = resolve_model(str(root), be.device, "auto")
    table = measured_table(pair, be.device)
    blocks = {"spec": pair.draft.cfg.block_size, "adaptive": None, "target-only": 1}

    def baseline(name: str) -> Offline:
        return Offline(pair, be, blocks[name], prompts, lengths, table=table)

    log = (lambda m: print(m, file=sys.stderr, flush=True))
    res = bench_serve(start, baseline, prompts, levels, args.requests, lengths,
                      args.time_limit, log, contenders=servers, rounds=args.rounds)
    res["command"] = "dflash2rt bench serve " + " ".join(sys.argv[3:])
    table = markdown(res) + "\n" + targets(res)
    if args.markdown:
        Path(args.markdown).write_text(table, encoding="utf-8")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(res, indent=1) if args.json else table)
    return 0
