"""What ``dflash2rt inspect`` reports (``inspection.inspect_models`` fills it in): one ``Check``
per fit check, with the fix that would make a failing one pass, and the ``Report`` holding the
target's and the draft's descriptions, the checks, the weights' memory per dtype and whether a
device's free memory holds them, whether dflash2rt runs the pair, and notes. The report renders
itself as a dict (``--json``) or as the text ``dflash2rt inspect`` prints, and raises its first
mismatch as a DraftMismatchError on request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflash2rt.errors import DraftMismatchError
from dflash2rt.models.memory import GB

FORMATS = {"dflash2": "DFlash2", "dflash": "DFlash v1", "speculators": "speculators"}


@dataclass
class Check:
    """One fit check: ``fix`` says what would make a failing one pass."""

    name: str
    ok: bool
    detail: str
    fix: str = ""

    def error(self) -> DraftMismatchError:
        return DraftMismatchError(f"{self.name}: {self.detail}; {self.fix}")

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.name, "ok": self.ok, "detail": self.detail,
                **({"fix": self.fix} if not self.ok else {})}


@dataclass
class Report:
    """What ``inspect`` found; ``raise_for_fit`` raises the first mismatch."""

    target: dict[str, Any] | None
    draft: dict[str, Any] | None
    checks: list[Check] = field(default_factory=list)
    memory: dict[str, dict[str, int]] = field(default_factory=dict)
    device: dict[str, Any] | None = None
    runnable: bool | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def format(self) -> str | None:
        return self.draft["format"] if self.draft else None

    @property
    def problems(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def raise_for_fit(self) -> None:
        if self.problems:
            raise self.problems[0].error()

    def as_dict(self) -> dict[str, Any]:
        return {"format": self.format, "target": self.target, "draft": self.draft,
                "fit": None if not self.checks else {
                    "ok": not self.problems, "checks": [c.as_dict() for c in self.checks]},
                "memory": self.memory, "device": self.device, "runnable": self.runnable,
                "notes": self.notes}

    def text(self) -> str:
        out: list[str] = []
        if self.target:
            out += _target_lines(self.target)
        if self.draft:
            out += _draft_lines(self.draft)
        if self.checks:
            out.append("fit")
            for c in self.checks:
                out.append(f"  {'ok  ' if c.ok else 'FAIL'} {c.name:<11} {c.detail}"
                           + ("" if c.ok else f"\n       fix: {c.fix}"))
        if self.memory:
            out += self._memory_lines()
        if self.runnable is not None:
            out.append(f"runnable: {'yes' if self.runnable else 'no'}")
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)

    def _memory_lines(self) -> list[str]:
        parts = " + ".join(k for k in ("target", "draft") if getattr(self, k))
        out = [f"weights memory ({parts})"]
        for dt, m in self.memory.items():
            split = (f" (target {_bytes(m['target'])} + draft {_bytes(m['draft'])})"
                     if "target" in m and "draft" in m else "")
            fits = ""
            if self.device and self.device.get("fits") is not None:
                fits = "  fits" if self.device["fits"][dt] else "  does not fit"
            out.append(f"  {dt:<9} {_bytes(m['total']):>9}{split}{fits}")
        if self.device:
            free = self.device.get("free_bytes")
            out.append(f"  on {self.device['device']}: " + (
                f"{_bytes(free)} free" if free is not None else "free memory unknown")
                + " (weights only: the KV caches need more)")
        return out


def _target_lines(t: dict[str, Any]) -> list[str]:
    tok = t["tokenizer"]
    return [f"target  {_where(t)}",
            f"  {t['model_type']}: {t['layers']} layers, hidden {t['hidden']}, "
            f"{t['heads']} heads ({t['kv_heads']} KV, head_dim {t['head_dim']}), "
            f"MLP {t['intermediate']}, vocab {t['vocab']}, "
            f"{_count(t['parameters'])} parameters ({t['stored_dtype']})",
            f"  tokenizer: {tok['tokens']} tokens, ids 0..{tok['max_id']}" if tok
            else "  tokenizer: none (token-id prompts only)"]


def _draft_lines(d: dict[str, Any]) -> list[str]:
    out = [f"draft   {_where(d)}",
           f"  format {d['format']} ({FORMATS[d['format']]}"
           + (f", {d['algorithm']}" if d.get("algorithm") else "") + ")"]
    vocab = f"vocab {d['vocab']}" + (f" (draft vocabulary {d['draft_vocab']})"
                                     if d.get("draft_vocab") not in (None, d["vocab"])
                                     else "")
    out.append(f"  {d['layers']} layers, hidden {d['hidden']}, {d['heads']} heads "
               f"({d['kv_heads']} KV), {vocab}, block size {d['block_size']}, "
               f"taps {d['tap_layers']}, mask token {d['mask_token_id']}, "
               f"{_count(d['parameters'])} parameters ({d['stored_dtype']})")
    if d.get("vocab_mapping"):
        out.append("  vocabulary mapping: " + ", ".join(
            f"{k} {v}" for k, v in d["vocab_mapping"].items()))
    return out


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else \
        f"{n / 1e3:.1f}K"


def _bytes(n: int) -> str:
    return f"{n / GB:.2f} GB" if n >= GB else f"{n / 1e6:.1f} MB" if n >= 1e6 else \
        f"{n / 1e3:.1f} kB"


def _where(part: dict[str, Any]) -> str:
    rev = f" (revision {part['revision']})" if part.get("revision") else ""
    at = f" at {part['path']}" if part["path"] != part["source"] else ""
    return f"{part['source']}{rev}{at}"
