"""TP=N vs TP=1 greedy equivalence on one host (dflash2rt.qualify.tp_equivalence):

    python scripts/tp_equivalence.py stdlib-code --prompts 4 --tokens 64 --tp 2 [--json OUT]

``model``: a bundled name or a pair directory; prompts: the bundled pair's held-out prompts."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from dflash2rt.qualify.tp_equivalence import tp_equivalence

HELDOUT = Path(__file__).resolve().parents[1] / "dflash2rt/bundled/stdlib-code/heldout_prompts.json"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=None)
    ap.add_argument("--token-prompts", action="store_true",
                    help="use the prompts' token ids modulo the vocabulary (no tokenizer)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    prompts = [p["prompt"] for p in json.loads(HELDOUT.read_text())[:args.prompts]]
    if args.token_prompts:      # a synthetic pair without a tokenizer: bytes as token ids
        prompts = [list(p.encode()[:96]) for p in prompts]
    t0 = time.monotonic()
    res = tp_equivalence(args.model, prompts, args.tokens, args.tp, args.block_size)
    print(res.summary())
    print(f"  {res.tensor_parallel}; {time.monotonic() - t0:.0f}s")
    if args.json:
        args.json.write_text(json.dumps(res.to_dict(), indent=1))


if __name__ == "__main__":
    main()
