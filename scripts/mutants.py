"""Hand-made mutants of the sampling surface, the streaming callback, the metrics, the watermark's
record and the constraints, each with the tests expected to kill it.

    python scripts/mutants.py [NAME ...]     # all by default; prints one line per mutant

Each mutant replaces one exact snippet of one file, runs its tests (``pytest -x``), restores the
file and reports KILLED (a test failed: which one) or SURVIVED. A snippet that no longer exists
is reported STALE (the code moved: update the mutant). Exit status 1 if any survived or is
stale. Run on a clean tree: the files are restored, but an interrupted run leaves a mutant in
place (``git checkout`` the file).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WIRING = "tests/test_sampling_wiring.py"
MUTANTS = {
    "prefill-unprocessed": (
        "dflash2rt/engine/stages.py",
        "last = processed(st, out.logits[:, :1])", "last = out.logits[:, :1]", [WIRING]),
    "prefill-token-not-counted": (
        "dflash2rt/engine/stages.py",
        "    commit(st, token.view(-1, 1), torch.ones_like(n))",
        "    [e.commit_(token.view(-1, 1), torch.ones_like(n) * (e.batch is not st.procs))\n"
        "     for e in st.extensions]", [WIRING]),
    "target-only-unprocessed": (
        "dflash2rt/engine/stages.py",
        "    logits = processed(st, out.logits)\n    token, bad = sample_next(",
        "    logits = out.logits\n    token, bad = sample_next(", [WIRING]),
    "step-counts-the-accepted-only": (
        "dflash2rt/engine/runner.py",
        "    stages.commit(st, res.tokens, res.accept_len + 1)",
        "    [e.commit_(res.tokens, res.accept_len + (e.batch is not st.procs))\n"
        "     for e in st.extensions]", [WIRING]),
    "verify-rows-with-committed-counts": (
        "dflash2rt/ops/procs.py",
        "return counts.unsqueeze(1) + torch.cumsum(hot, dim=1, dtype=counts.dtype)",
        "return counts.unsqueeze(1).expand(-1, gamma + 1, -1)", [WIRING]),
    "min-p-not-staged": (
        "dflash2rt/engine/state.py",
        "[p.top_p for p in ps], dev, [p.min_p for p in ps]),",
        "[p.top_p for p in ps], dev, None),", [WIRING]),
    "repetition-ignores-prompt": (
        "dflash2rt/ops/procs.py",
        "r_ = torch.where(prompt.unsqueeze(1) | seen, rep.view(r, 1, 1), 1.0)",
        "r_ = torch.where(seen, rep.view(r, 1, 1), 1.0)", [WIRING]),
    "presence-counts-like-frequency": (
        "dflash2rt/ops/procs.py",
        "- pres.view(r, 1, 1) * seen.float()",
        "- pres.view(r, 1, 1) * counts.float()", [WIRING]),
    "on-tokens-whole-output": (
        "dflash2rt/engine/output.py",
        "self.on_tokens(i, o.token_ids[before:])",
        "self.on_tokens(i, o.token_ids)", ["tests/test_on_tokens.py"]),
    "on-tokens-before-the-cut": (
        "dflash2rt/engine/output.py",
        "self.on_tokens(i, o.token_ids[before:])",
        "self.on_tokens(i, list(tokens))", ["tests/test_on_tokens.py"]),
    "wm-step-records-accepted-only": (
        "dflash2rt/engine/runner.py",
        "    stages.commit(st, res.tokens, res.accept_len + 1)",
        "    [e.commit_(res.tokens, res.accept_len + (e.batch is not st.wm))\n"
        "     for e in st.extensions]", ["tests/test_watermark_record.py"]),
    "wm-prefill-not-recorded": (
        "dflash2rt/engine/stages.py",
        "    commit(st, token.view(-1, 1), torch.ones_like(n))",
        "    [e.commit_(token.view(-1, 1), torch.ones_like(n) * (e.batch is not st.wm))\n"
        "     for e in st.extensions]", ["tests/test_watermark_record.py"]),
    "wm-record-ignored": (
        "dflash2rt/watermark/generate.py",
        "return Marks(self.key, ctx, ~(self.in_record(ctx) | repeat), has_fp64)",
        "return Marks(self.key, ctx, ~repeat, has_fp64)",
        ["tests/test_watermark_record.py"]),
    "wm-record-past-used": (
        "dflash2rt/watermark/generate.py",
        "valid = torch.arange(m, device=ctx.device).view(1, 1, m) < self.used.view(-1, 1, 1)",
        "valid = torch.arange(m, device=ctx.device).view(1, 1, m) >= 0",
        ["conformance:recorded"]),
    "detector-no-dedup": (
        "dflash2rt/watermark/detect.py",
        'kept = ~ev["repeated"]', 'kept = np.ones_like(ev["repeated"])',
        ["tests/test_watermark_detect.py"]),
    "metrics-rate-over-reached": (
        "dflash2rt/engine/stats.py",
        "return [a / n if n else 0.0 for a in self.accepted_per_pos]",
        "return [a / r if r else 0.0 for a, r in zip(self.accepted_per_pos, "
        "self.reached_per_pos)]", ["tests/test_metrics.py"]),
    "constraint-specials-as-text": (
        "dflash2rt/constraints/vocab.py",
        "                out[added[\"id\"]] = None", "                pass",
        ["tests/test_constraint_property.py"]),
    "constraint-no-pruning": (
        "dflash2rt/constraints/automaton.py",
        "    live = final.copy()\n", "    live = np.ones_like(final)\n",
        ["tests/test_constraint_property.py"]),
    "constraint-eos-anywhere": (
        "dflash2rt/constraints/automaton.py",
        "table[np.flatnonzero(final)[:, None], eos] = n",
        "table[np.arange(n)[:, None], eos] = n", ["tests/test_constraint_property.py"]),
    "constraint-lone-bytes-as-text": (
        "dflash2rt/constraints/vocab.py",
        "            return bytes([int(m.group(1), 16)])",
        "            return piece.encode(\"utf-8\")", ["tests/test_constraint_property.py"]),
    "constraint-stuck-is-complete": (
        "dflash2rt/engine/output.py",
        'o.finish_reason = "constraint" if self.trackers[i].complete() \\',
        'o.finish_reason = "constraint" if True \\', ["tests/test_constraint_engine.py"]),
    "stop-strings-in-list-order": (
        "dflash2rt/engine/request.py",
        "if k >= 0 and (best is None or (k, len(s)) < best):",
        "if k >= 0 and best is None:", ["tests/test_stop_rule.py"]),
    "logprobs-log-of-probs": (
        "dflash2rt/ops/sampling.py",
        "    lp = torch.log_softmax(x, dim=-1)",
        "    lp = torch.log(torch.softmax(x, dim=-1))", ["tests/test_procs.py"]),
    "key-file-keeps-old-mode": (
        "dflash2rt/watermark/keys.py",
        "            os.chmod(tmp, 0o600)                    # whatever the umask did",
        "            os.chmod(tmp, 0o644)", ["tests/test_watermark_keys.py"]),
}


def _pytest(tests: list[str]) -> tuple[bool, str]:
    """Run ``tests`` (``conformance:EXPR``: the cpu conformance suite, -k EXPR) → (all
    passed, the first failing test's id)."""
    out = []
    ok = True
    for t in tests:
        if t.startswith("conformance:"):
            cmd = [sys.executable, "-m", "dflash2rt", "conformance", "--backend", "cpu",
                   "-k", t.split(":", 1)[1]]
        else:
            cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", t]
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        out.append(res.stdout + res.stderr)
        if res.returncode != 0:
            ok = False
            break
    failed = [ln.split(" ", 1)[1].split(" - ")[0] for ln in "".join(out).splitlines()
              if ln.startswith("FAILED ")]
    return ok, failed[0] if failed else "(no FAILED line: see the run)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="mutants to run (default: all)")
    args = ap.parse_args(argv)
    names = args.names or list(MUTANTS)
    bad = 0
    for name in names:
        path, old, new, tests = MUTANTS[name]
        f = ROOT / path
        src = f.read_text(encoding="utf-8")
        if src.count(old) != 1:
            print(f"STALE     {name}: the snippet occurs {src.count(old)} times in {path}")
            bad += 1
            continue
        t0 = time.perf_counter()
        f.write_text(src.replace(old, new), encoding="utf-8")
        try:
            ok, killer = _pytest(tests)
        finally:
            f.write_text(src, encoding="utf-8")
        took = time.perf_counter() - t0
        if ok:
            print(f"SURVIVED  {name} ({path}; ran {', '.join(tests)}) {took:.0f}s")
            bad += 1
        else:
            print(f"KILLED    {name} by {killer} {took:.0f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
