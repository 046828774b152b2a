"""A soak run: many sampled decode steps in one process, with resident memory sampled along
the way, then the first call replayed by a fresh process.

    python scripts/soak.py [--steps 20000] [--backend cpu] [--json FILE]

Batch 4 on the bundled pair, every call T = 1 with repetition, frequency and presence
penalties, a regex constraint on row 0, watermarked under one key (the key is per call in
this API: every sampled row is marked, the constrained one included), adaptive block sizes
from a fixed cost table (so the outputs are reproducible; the measured table follows the
machine) and the backend's graphs where it has them. Calls repeat with new seeds and prompts
until ``--steps`` decode steps ran. Reported: steps, tokens, wall time, the resident set size
(VmRSS) after the first call, at 1k steps and at the end, its growth after warm-up, crashes,
and whether a fresh process gives the first call's tokens again. Exit status 1 if anything
crashed, the replay differs, or memory grew more than ``--max-growth-mb`` after warm-up.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

BATCH = 4
REGEX = r"[\w \n.,:()=\[\]'\"+*/<>-]*"
KEY = bytes(range(100, 132))


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def build(backend: str):
    import torch  # noqa: F401

    from dflash2rt import get_backend
    from dflash2rt.bundled import bundled_path, heldout
    from dflash2rt.constraints import TokenAutomaton
    from dflash2rt.engine.engine import Engine
    from dflash2rt.engine.policy.adaptive import AdaptivePolicy
    from dflash2rt.engine.policy.schedule import default_candidates
    from dflash2rt.models.pair import load_pair

    root = bundled_path("stdlib-code")
    be = get_backend(backend)
    pair = load_pair(root / "target", root / "draft", device=be.device)
    engine = Engine(pair, be)
    cands = default_candidates(pair.draft.cfg.block_size)
    engine.policy = AdaptivePolicy(cands, {b: 1.0 + 0.15 * b.bit_length() for b in cands})
    auto = TokenAutomaton.from_regex(REGEX, pair.tokenizer, pair.target.cfg.vocab_size,
                                     pair.eos_token_ids)
    ids = [tuple(pair.tokenizer.encode(p["prompt"])[-96:]) for p in heldout(root)]
    return engine, auto, ids


def requests(call: int, auto, prompts):
    from dflash2rt.engine.request import Request, SamplingParams

    out = []
    for r in range(BATCH):
        p = prompts[(call * BATCH + r) % len(prompts)]
        out.append(Request(p, SamplingParams(
            max_new_tokens=160 + 16 * r, temperature=1.0, seed=1000 * call + r,
            repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.1,
            constraint=auto if r == 0 else None)))
    return out


def digest(outputs) -> str:
    h = hashlib.sha256()
    for o in outputs:
        h.update(json.dumps([o.token_ids, o.finish_reason]).encode())
    return h.hexdigest()[:16]


def first_call(backend: str) -> str:
    from dflash2rt.watermark import WatermarkKey

    engine, auto, prompts = build(backend)
    outs, _ = engine.generate(requests(0, auto, prompts), watermark=WatermarkKey(KEY))
    return digest(outs)


def soak(args) -> dict:
    from dflash2rt.watermark import WatermarkKey

    engine, auto, prompts = build(args.backend)
    key = WatermarkKey(KEY)
    rss, steps, tokens, calls, crashes, first = [], 0, 0, 0, [], None
    drafted = accepted = 0
    reasons: dict[str, int] = {}
    graphs = fallbacks = None
    t0 = time.perf_counter()
    while steps < args.steps:
        try:
            outs, stats = engine.generate(requests(calls, auto, prompts), watermark=key)
        except Exception:                          # noqa: BLE001 - a crash is a result here
            crashes.append(traceback.format_exc(limit=8))
            if len(crashes) >= 3:
                break
            calls += 1
            continue
        if first is None:
            first = digest(outs)
            rss.append((0, rss_mb()))
        calls += 1
        steps += stats.steps
        tokens += stats.generated
        drafted += stats.num_draft_tokens
        accepted += stats.num_accepted_tokens
        for o in outs:
            reasons[o.finish_reason] = reasons.get(o.finish_reason, 0) + 1
        graphs, fallbacks = stats.graphs, stats.fallbacks
        if not rss or steps - rss[-1][0] >= args.sample_every:
            rss.append((steps, rss_mb()))
            if args.verbose:
                print(f"  {steps} steps, {tokens} tokens, RSS {rss[-1][1]:.1f} MB", flush=True)
    wall = time.perf_counter() - t0
    at_1k = next((m for s, m in rss if s >= 1000), rss[-1][1] if rss else float("nan"))
    warm = next((m for s, m in rss if s >= args.warmup), at_1k)
    replay = subprocess.run([sys.executable, __file__, "--first-call", "--backend",
                             args.backend], capture_output=True, text=True)
    fresh = replay.stdout.strip().splitlines()[-1] if replay.returncode == 0 else \
        f"failed: {replay.stderr.strip()[-400:]}"
    return {"steps": steps, "calls": calls, "tokens": tokens, "wall_s": round(wall, 1),
            "steps_per_s": round(steps / wall, 1) if wall else None,
            "acceptance": round(accepted / drafted, 3) if drafted else None,
            "finish_reasons": reasons, "crashes": len(crashes), "crash_traces": crashes,
            "rss_mb_first_call": round(rss[0][1], 1) if rss else None,
            "rss_mb_at_1k": round(at_1k, 1), "rss_mb_end": round(rss[-1][1], 1),
            "rss_growth_after_warmup_mb": round(rss[-1][1] - warm, 1),
            "warmup_steps": args.warmup, "rss_samples": [(s, round(m, 1)) for s, m in rss],
            "first_call": first, "fresh_process_first_call": fresh,
            "replay_identical": first == fresh, "backend": args.backend,
            "graphs": "none (the backend has no graphs)" if not graphs else
            {str(k): v for k, v in graphs.items()}, "fallbacks": fallbacks or []}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--warmup", type=int, default=2000,
                    help="steps after which memory must stay flat (default 2000)")
    ap.add_argument("--sample-every", type=int, default=500)
    ap.add_argument("--max-growth-mb", type=float, default=64.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--first-call", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.first_call:
        print(first_call(args.backend))
        return 0
    res = soak(args)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    show = {k: v for k, v in res.items() if k not in ("rss_samples", "crash_traces")}
    print(json.dumps(show, indent=1))
    for trace in res["crash_traces"]:
        print(trace, file=sys.stderr)
    ok = (res["crashes"] == 0 and res["replay_identical"]
          and res["rss_growth_after_warmup_mb"] <= args.max_growth_mb)
    print(f"soak {'PASS' if ok else 'FAIL'}: {res['steps']} steps, {res['crashes']} crashes, "
          f"RSS {res['rss_mb_at_1k']} MB at 1k steps, {res['rss_mb_end']} MB at the end "
          f"(+{res['rss_growth_after_warmup_mb']} MB after {args.warmup} steps), replay "
          f"{'identical' if res['replay_identical'] else 'DIFFERS'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
