"""The one-line run stats ``dflash2rt run`` prints on stderr (single-process and --tp)."""

from __future__ import annotations


def counts(s) -> str:
    """The requests at each candidate count and those verified as a block ("candidates 16x2,
    64x1, block-verified 1, "; "" when none of either)."""
    out = ""
    if s.candidates:
        out = "candidates " + ", ".join(f"{k}x{n}" for k, n in s.candidates.items()) + ", "
    return out + (f"block-verified {s.block_verified}, " if s.block_verified else "")


def stats_line(s) -> str:
    """A run's stats in one line: throughput, τ, block sizes, speculation metrics, where the
    time went, fallbacks."""
    parts = [f"{k} {v:.3f}s" for k, v in s.time.items()]
    if s.calibration_steps:       # the adaptive schedule's timing steps: part of the wall time
        parts.append(f"calibration {s.calibration_s:.3f}s ({s.calibration_steps} steps)")
    if s.cost_noise:
        parts.append(str(s.cost_noise))
    split = ", ".join(parts)
    blocks = f"block {s.block_size}" if not s.adaptive else "adaptive blocks " + ", ".join(
        f"{b}x{n}" for b, n in sorted(s.block_sizes.items()))
    return (f"[{s.mode} on {s.backend}] {s.generated} tokens in {s.wall_s:.2f}s = "
            f"{s.tokens_per_s:.1f} tok/s, tau {s.tau:.2f} ({blocks}), "
            + counts(s) + f"accept histogram {s.accept_hist}; {spec_summary(s)}; {split}; "
            f"fallbacks: {s.fallbacks or 'none'}"
            + (f"; {s.model_pass}" if s.model_pass else ""))


def tp_stats_line(s) -> str:
    """A tensor-parallel run's stats in one line (rank 0's)."""
    return (f"[{s.mode} on {s.backend}, {s.tensor_parallel}] {s.generated} tokens in "
            f"{s.wall_s:.2f}s = {s.tokens_per_s:.1f} tok/s, tau {s.tau:.2f}; {counts(s)}"
            f"{spec_summary(s)}; fallbacks: {s.fallbacks or 'none'}")


def spec_summary(s) -> str:
    """The run's speculation metrics in one phrase (what --metrics writes)."""
    rates = " ".join(f"{r:.2f}" for r in s.acceptance_rate_per_pos)
    reached = " ".join(f"{r:.2f}" for r in s.conditional_acceptance_rate_per_pos)
    return (f"{s.num_drafts} drafts, {s.num_accepted_tokens}/{s.num_draft_tokens} draft tokens "
            f"accepted, mean acceptance length {s.mean_acceptance_length:.2f}, "
            f"per position [{rates}] (of drafts; of those reaching it [{reached}])")
