"""The CPU bench of two checkouts side by side: ``dflash2rt bench`` run in each, alternated
(before, after, before, after ...) in one script so a drift of the machine's speed hits both,
then every row and contender in one table with the ratio of the medians of the rounds.

    git worktree add /tmp/before <commit>
    python scripts/bench_ab.py /tmp/before . [--rounds 2] [--out DIR] [-- BENCH ARGS ...]
    python scripts/bench_ab.py --table DIR        # the table again from a finished run

Both checkouts run with this environment's interpreter, each on its own code (``PYTHONPATH``).
Default bench arguments: the cpu backend, no transformers, 3 repeats, 4 prompts, 96 tokens,
T = 0, 0.7 / top-p 0.95 and 1 (batch 1 and batch 8 rows). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = ["--backend", "cpu", "--no-hf", "--repeats", "3", "--prompts", "4",
         "--max-new-tokens", "96", "--temperatures", "0,0.7,1"]


def run(checkouts: list[Path], rounds: int, out: Path, bench: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for r in range(1, rounds + 1):
        for i, co in enumerate(checkouts):
            env = {**os.environ, "PYTHONPATH": f"{co}:{co / 'conformance'}",
                   "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
            dest = out / f"{'ab'[i]}-{r}.json"
            subprocess.run([sys.executable, "-m", "dflash2rt", "bench", *bench,
                            "--json-out", str(dest)], cwd=co, env=env, check=True,
                           stdout=subprocess.DEVNULL)
            print(f"round {r}: {co} done", file=sys.stderr, flush=True)
    (out / "checkouts.json").write_text(json.dumps([str(c) for c in checkouts]))


def _rows(path: Path) -> dict[tuple[str, int, str], float]:
    res = json.loads(path.read_text())
    return {(row["temperature"], row["batch"], name): c["tokens_per_s"]
            for row in res["rows"] for name, c in row["contenders"].items()}


def table(out: Path) -> str:
    names = json.loads((out / "checkouts.json").read_text())
    runs = {side: [_rows(p) for p in sorted(out.glob(f"{side}-*.json"))] for side in "ab"}
    lines = [f"| row | contender | {names[0]} tok/s, rounds | {names[1]} tok/s, rounds | "
             "after / before (medians) |", "| --- | --- | --- | --- | --- |"]
    for key in runs["a"][0]:
        a = [r[key] for r in runs["a"]]
        b = [r[key] for r in runs["b"] if key in r]
        if not b:
            continue
        lines.append(f"| {key[0]}, b{key[1]} | {key[2]} | {', '.join(f'{x:.0f}' for x in a)} | "
                     f"{', '.join(f'{x:.0f}' for x in b)} | "
                     f"{statistics.median(b) / statistics.median(a):.2f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkouts", nargs="*", type=Path, help="before, after")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("out/bench-ab"))
    ap.add_argument("--table", type=Path, help="only print the table of a finished run")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])         # after "--": dflash2rt bench's own arguments
    if a.table:
        print(table(a.table))
        return 0
    if len(a.checkouts) != 2:
        ap.error("give two checkouts: before and after")
    bench = argv[cut + 1:] or BENCH
    run([c.resolve() for c in a.checkouts], a.rounds, a.out, bench)
    print(table(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
