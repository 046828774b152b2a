"""Whether a draft fits its target, for ``dflash2rt inspect``, from the two descriptions
``inspect_read`` makes: vocabulary (shared, or mapped by d2t / t2d of the right shapes), hidden
size, tap layers, mask token and tokenizer, each a ``Check`` that names its fix; then the memory
the weights need per dtype (and whether a device's free memory holds them), and whether
dflash2rt runs the pair at all, with a note saying why not or what is special about it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dflash2rt.models import hub
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.inspect_read import tokenizer_vocab
from dflash2rt.models.inspect_report import Check, Report
from dflash2rt.models.memory import available_bytes
from dflash2rt.models.tokenizer import read_json_object

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def fit_checks(t: dict[str, Any], tcfg: TargetConfig, d: dict[str, Any],
         d_loc: hub.Located) -> list[Check]:
    other = "use a draft made for this target"
    checks = [_vocab_check(t, d)]
    hid = d.get("hidden")
    checks.append(Check("hidden size", hid == t["hidden"],
                        f"draft {hid}, target {t['hidden']}" if hid != t["hidden"]
                        else f"{hid}", f"the draft reads another model's hidden states; {other}"))
    taps = d.get("tap_layers")
    n = t["layers"]
    if taps is None:
        checks.append(Check("tap layers", True, "the draft's config names none"))
    else:
        bad = [i for i in taps if not 0 <= i < n]
        trained = d.get("num_target_layers")
        ok = not bad and trained in (None, n)
        detail = (f"{taps} within the target's {n} layers" if ok else
                  f"{bad} outside the target's {n} layers" if bad else
                  f"the draft was trained for a {trained}-layer target, this one has {n}")
        checks.append(Check("tap layers", ok, detail,
                            f"the draft taps another model's layers; {other}"))
    mask = d.get("mask_token_id")
    if mask is None:
        checks.append(Check("mask token", True, "none declared"))
    else:
        ok = isinstance(mask, int) and 0 <= mask < t["vocab"]
        tok = t.get("tokenizer")
        where = "" if not ok or not tok else (" (a tokenizer token)" if mask <= tok["max_id"]
                                              else " (past the tokenizer's ids: an unused row)")
        checks.append(Check("mask token", ok,
                            f"{mask} within the target's {t['vocab']} ids{where}" if ok else
                            f"{mask} is outside the target's {t['vocab']} ids",
                            f"{other}, or set the draft's mask_token_id to the id it was "
                            "trained with"))
    checks.append(_tokenizer_check(t, d, d_loc))
    return checks


def _vocab_check(t: dict[str, Any], d: dict[str, Any]) -> Check:
    tv, dv, mapping = t["vocab"], d.get("draft_vocab"), d.get("vocab_mapping") or {}
    fix = (f"use a draft trained for this target's vocabulary ({tv} ids, its tokenizer), or a "
           f"reduced-vocabulary draft that ships d2t/t2d mapping tensors")
    if d.get("vocab") not in (None, tv) and d["format"] == "speculators":
        return Check("vocabulary", False, f"the draft was made for a verifier with a "
                     f"{d['vocab']}-token vocabulary, the target has {tv}", fix)
    if dv == tv and not mapping:
        return Check("vocabulary", True, f"draft and target share {tv} ids")
    if not mapping:
        return Check("vocabulary", False,
                     f"the draft declares a {dv}-token vocabulary, the target has {tv}, and the "
                     "draft has no d2t/t2d tensors to map between them", fix)
    want = {"d2t": [dv], "t2d": [tv]}
    bad = {k: s for k, s in mapping.items() if s != want[k]}
    if bad:
        return Check("vocabulary", False, "vocabulary mapping " + ", ".join(
            f"{k} has shape {s}, expected {want[k]}" for k, s in bad.items()), fix)
    return Check("vocabulary", True, f"draft vocabulary of {dv} ids mapped to the target's {tv} "
                 f"by {'/'.join(mapping)}")


def _tokenizer_check(t: dict[str, Any], d: dict[str, Any], d_loc: hub.Located) -> Check:
    tok = t.get("tokenizer")
    if tok is None:
        return Check("tokenizer", True, "the target has no tokenizer.json (token-id prompts)")
    if tok["max_id"] >= t["vocab"]:
        return Check("tokenizer", False, f"the target's tokenizer has ids up to {tok['max_id']}"
                     f", past its {t['vocab']}-row embedding",
                     "use the tokenizer.json that belongs to this target checkpoint")
    if d.get("tokenizer"):
        tv = tokenizer_vocab(read_json_object(Path(tok["file"])))
        dv = tokenizer_vocab(read_json_object(Path(d["tokenizer"]["file"])))
        if tv != dv:
            differ = len(set(tv.items()) ^ set(dv.items()))
            return Check("tokenizer", False, f"the draft's tokenizer.json differs from the "
                         f"target's ({differ} token/id pairs not shared)",
                         "use a draft trained with this target's tokenizer")
    eos_d = d.get("eos_token_id")
    eos_d = [eos_d] if isinstance(eos_d, int) else list(eos_d or [])
    eos = ""
    if eos_d and t["eos_token_ids"]:      # a base and an instruct model differ here: a hint only
        eos = (", eos ids agree" if set(eos_d) & set(t["eos_token_ids"]) else
               f"; the draft's eos_token_id {eos_d} is none of the target's "
               f"{t['eos_token_ids']} (a draft for a sibling model, or another tokenizer?)")
    return Check("tokenizer", True, f"{tok['tokens']} tokens, ids 0..{tok['max_id']} within the "
                 f"vocabulary{eos}")


# --- memory, and whether dflash2rt runs it ----------------------------------------------------

def weights_memory(report: Report, device: torch.device | str | None) -> None:
    parts = {k: p["parameters"] for k, p in (("target", report.target), ("draft", report.draft))
             if p is not None}
    n = sum(parts.values())
    report.memory = {dt: {**{k: v * size for k, v in parts.items()}, "total": n * size}
                     for dt, size in DTYPE_BYTES.items()}
    if device is not None:
        dev = torch.device(device)
        free = available_bytes(dev)
        report.device = {"device": str(dev), "free_bytes": free,
                         "fits": None if free is None else {
                             dt: m["total"] <= free for dt, m in report.memory.items()}}


def runnable(report: Report, dcfg: DraftConfig | None) -> bool | None:
    if report.target is None:
        report.notes.append("a draft on its own: give its target too (inspect TARGET --draft "
                            "DRAFT) to check the fit")
        return None
    if report.draft is None:
        report.notes.append("no draft: target-only decoding (spec=False / --no-spec)")
        return True
    d = report.draft
    ok = not report.problems
    if dcfg is None:
        report.notes.append(f"speculators format ({d.get('algorithm')}) detected: dflash2rt "
                            "runs DFlash and DFlash2 drafts only")
        ok = False
    elif d.get("vocab_mapping") and not dcfg.reduced_vocab:
        report.notes.append("d2t/t2d tensors in a draft whose config declares no reduced "
                            "vocabulary (the speculators format's draft_vocab_size): not run")
        ok = False
    elif dcfg.reduced_vocab:
        report.notes.append(f"a reduced-vocabulary draft: it proposes among "
                            f"{dcfg.draft_vocab_size} of the target's {dcfg.arch.vocab_size} ids "
                            "(d2t), the others with probability 0; verification stays exact")
    return ok
