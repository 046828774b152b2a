"""Hand-made mutants of the sampling surface, the streaming callback, the metrics, the watermark's
record and the constraints, and one or more per class of docs/testing.md's rules (batch
independence, every tile of a kernel loop, edges, mappings, independent references), each with
the tests expected to kill it.

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
BATCH = "tests/test_batch_independence.py"
TILES = "tests/test_kernel_tiles.py"
EDGES = "tests/test_edges.py"
MAPPINGS = "tests/test_mappings.py"
DETECT_REF = "tests/test_watermark_detect_reference.py"
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
        "[p.min_p for p in ps], also=[", "None, also=[", [WIRING]),
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
    # Batch independence: per-request options gathered, compacted or unpacked for the batch.
    "logprobs-raw-if-any-row": (
        "dflash2rt/ops/procs.py",
        "lp = torch.where(raw.view(r, 1, 1), torch.log_softmax(raw_logits.float(), -1), lp)",
        "lp = torch.log_softmax(raw_logits.float(), -1)", [BATCH]),
    "logprobs-wants-not-compacted": (
        "dflash2rt/ops/procs.py", "wants=tuple(self.wants[i] for i in idx))",
        "wants=self.wants[:len(idx)])", [BATCH]),
    "logprobs-mode-not-compacted": (
        "dflash2rt/ops/procs.py", "raw=None if self.raw is None else self.raw[t],",
        "raw=None if self.raw is None else self.raw[:len(idx)],", [BATCH]),
    "min-p-not-compacted": (
        "dflash2rt/ops/batch.py", "None if self.min_p is None else self.min_p[t])",
        "None if self.min_p is None else self.min_p[:len(idx)])", [BATCH]),
    "top-p-rows-not-compacted": (
        "dflash2rt/ops/batch.py", "tuple(new for new, old in enumerate(idx) if old in nucleus)",
        "tuple(i for i in nucleus if i < len(idx))", [BATCH]),
    "seeds-not-compacted": (
        "dflash2rt/engine/state.py", "self.seed[t], self.key[t]",
        "self.seed[:len(idx)], self.key[t]", [BATCH]),
    # Every tile: a kernel that covers only its first tile of a dimension.
    "conv-first-channel-tile": (
        "dflash2rt/kernels/conv.py", "grid = (n, triton.cdiv(h, tuning.block_h))",
        "grid = (n, 1)", [TILES]),
    "verify-argmax-first-chunk": (
        "dflash2rt/kernels/verify.py",
        "    for start in range(0, V, BLOCK_V):\n        offs = start + lanes\n"
        "        x = tl.load(",
        "    for start in range(0, BLOCK_V, BLOCK_V):\n        offs = start + lanes\n"
        "        x = tl.load(", [TILES]),
    "verify-residual-mass-first-chunk": (
        "dflash2rt/kernels/verify.py", "for start in range(0, V, BLOCK_V):           # pass 1",
        "for start in range(0, BLOCK_V, BLOCK_V):           # pass 1", [TILES]),
    "verify-keyed-draw-first-chunk": (
        "dflash2rt/kernels/verify.py",
        "    for start in range(0, V, BLOCK_V):\n        offs = start + lanes\n"
        "        live = offs < V",
        "    for start in range(0, BLOCK_V, BLOCK_V):\n        offs = start + lanes\n"
        "        live = offs < V", [TILES]),
    "exact32-residual-first-chunk": (
        "dflash2rt/kernels/exact32.py",
        "for start in range(0, V, BLOCK_V):                # scan 1",
        "for start in range(0, BLOCK_V, BLOCK_V):                # scan 1", [TILES]),
    "walk-record-first-chunk": (
        "dflash2rt/kernels/selector.py", "for m0 in range(0, n, BLOCK_M):",
        "for m0 in range(0, BLOCK_M, BLOCK_M):", [TILES]),
    "walk-slot-tile-fixed": (
        "dflash2rt/kernels/selector.py",
        "return max(GAMMA_TILE, triton.next_power_of_2(gamma))", "return GAMMA_TILE", [TILES]),
    "attention-first-key-tile": (
        "dflash2rt/kernels/attention.py", "for n0 in range(start, end, BLOCK_N):",
        "for n0 in range(start, start + BLOCK_N, BLOCK_N):", [TILES]),
    "attention-first-row-tile": (
        "dflash2rt/kernels/attention.py", "grid = (triton.cdiv(t * group, block_m), n_kv, r)",
        "grid = (1, n_kv, r)", [TILES]),
    "keyed-values-first-block": (
        "dflash2rt/kernels/watermark.py", "launch(_values_kernel, (triton.cdiv(n, block),)",
        "launch(_values_kernel, (1,)", [TILES]),
    # Edges of positions and byte strings.
    "stop-at-offset-zero-not-cut": (
        "dflash2rt/engine/request.py", "if k >= 0 and (best is None or (k, len(s)) < best):",
        "if k > 0 and (best is None or (k, len(s)) < best):", [EDGES]),
    "ignored-eos-stays-at-the-match": (
        "dflash2rt/constraints/automaton.py", "table[np.flatnonzero(final)[:, None], eos] = n",
        "table[np.flatnonzero(final)[:, None], eos] = np.flatnonzero(final)[:, None]", [EDGES]),
    "raw-key-stripped": (
        "dflash2rt/watermark/keys.py",
        "        if len(data) == SECRET_BYTES:\n            return cls(data)",
        "        if len(text) == SECRET_BYTES:\n            return cls(text)", [EDGES]),
    # Mappings and identities that fixtures make trivial.
    "reduced-vocab-ids-ascending": (
        "dflash2rt/models/draft.py",
        "return place_draft_logits(own, target_ids(self.d2t), self.cfg.arch.vocab_size)",
        "return place_draft_logits(own, self.t2d.nonzero().view(-1), self.cfg.arch.vocab_size)",
        [MAPPINGS]),
    "draft-takes-the-target-revision": (
        "dflash2rt/models/hub.py", 'd = locate(draft, draft_revision, "draft", weights)',
        'd = locate(draft, revision, "draft", weights)', [MAPPINGS]),
    "tp-hash-row-0": (
        "dflash2rt/distributed/consensus.py", "hashlib.blake2b(repr(host).encode()",
        "hashlib.blake2b(repr(host[0]).encode()", [MAPPINGS]),
    "tp-hash-tokens-only": (
        "dflash2rt/distributed/consensus.py", "hashlib.blake2b(repr(host).encode()",
        "hashlib.blake2b(repr([h[2:] for h in host]).encode()", [MAPPINGS]),
    # Independent references: the detector's statistic off by less than one grid cell.
    "detect-value-not-its-cell": (
        "dflash2rt/watermark/detect.py", "m = np.maximum(r_a, r_b) - _GRID",
        "m = np.maximum(r_a, r_b)", [DETECT_REF]),
    "detect-one-cell-up": (
        "dflash2rt/watermark/detect.py", "m = np.maximum(r_a, r_b) - _GRID",
        "m = np.maximum(r_a, r_b) + _GRID", [DETECT_REF]),
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
