"""``dflash2rt inspect``: what a target and a draft are, whether they fit, and the memory their
weights need, read from configs, tokenizer.json and safetensors headers only (no weight is
ever read, and for a hub id only configs are fetched: headers come by range requests).

Draft formats: ``dflash2`` (DFlash2DraftModel), ``dflash`` (DFlash v1, DFlashDraftModel) and
``speculators`` (vLLM's speculators format: its DFlash / DFlash2 drafts run, with a reduced
vocabulary mapped by d2t/t2d; its other algorithms, e.g. EAGLE-3, are detected and described,
not run).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dflash2rt.errors import CheckpointError, DraftMismatchError
from dflash2rt.models import hub
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft_config import ARCH_V1, ARCH_V2, SPECULATORS_TYPES, DraftConfig
from dflash2rt.models.draft_loader import canonical_names, check_draft_tensors
from dflash2rt.models.hf_loader import (INDEX_FILE, SINGLE_FILE, _check_names, _tensor_files,
                                        read_config, target_tensors)
from dflash2rt.models.memory import GB, available_bytes
from dflash2rt.models.tokenizer import read_json_object

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MAPPING_TENSORS = ("d2t", "t2d")        # draft → target ids, target → draft mask (EAGLE-3)
FORMATS = {"dflash2": "DFlash2", "dflash": "DFlash v1", "speculators": "speculators"}
_MAX_HEADER = 100 * 2**20
Found = dict[str, tuple[Path, tuple[int, ...], str]]      # name → (file, shape, dtype)


def detect_format(cfg: dict[str, Any]) -> str:
    """``dflash2``, ``dflash`` (v1), ``speculators``, or ``target`` (no draft: a decoder)."""
    if "speculators_model_type" in cfg or "speculators_config" in cfg:
        return "speculators"
    arch = (cfg.get("architectures") or [None])[0]
    if arch == ARCH_V1:
        return "dflash"
    if arch == ARCH_V2 or "dflash_config" in cfg:
        return "dflash2"
    return "target"


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
            t = self.target
            out.append(f"target  {_where(t)}")
            out.append(f"  {t['model_type']}: {t['layers']} layers, hidden {t['hidden']}, "
                       f"{t['heads']} heads ({t['kv_heads']} KV, head_dim {t['head_dim']}), "
                       f"MLP {t['intermediate']}, vocab {t['vocab']}, "
                       f"{_count(t['parameters'])} parameters ({t['stored_dtype']})")
            tok = t["tokenizer"]
            out.append(f"  tokenizer: {tok['tokens']} tokens, ids 0..{tok['max_id']}" if tok
                       else "  tokenizer: none (token-id prompts only)")
        if self.draft:
            d = self.draft
            out.append(f"draft   {_where(d)}")
            out.append(f"  format {d['format']} ({FORMATS[d['format']]}"
                       + (f", {d['algorithm']}" if d.get("algorithm") else "") + ")")
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
        if self.checks:
            out.append("fit")
            for c in self.checks:
                out.append(f"  {'ok  ' if c.ok else 'FAIL'} {c.name:<11} {c.detail}"
                           + ("" if c.ok else f"\n       fix: {c.fix}"))
        if self.memory:
            parts = " + ".join(k for k in ("target", "draft") if getattr(self, k))
            out.append(f"weights memory ({parts})")
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
        if self.runnable is not None:
            out.append(f"runnable: {'yes' if self.runnable else 'no'}")
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


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


def inspect_models(model: object, draft: object = None, revision: str | None = None,
                   draft_revision: str | None = None,
                   device: torch.device | str | None = None) -> Report:
    """Inspect a target (and draft): ``model`` / ``draft`` as ``dflash2rt.run`` takes them
    (a directory with target/ and draft/, one checkpoint, a hub id, a bundled name, a tuple);
    a lone draft checkpoint is described alone. ``device``: also say whether each dtype's
    weights fit its free memory. Reads configs and safetensors headers only; mismatches are
    in ``Report.problems`` (``raise_for_fit`` raises the first as DraftMismatchError)."""
    t_loc, d_loc, _ = hub.locate_pair(model, draft, revision, draft_revision, weights=False)
    t_raw = read_config(t_loc.path)
    if d_loc is None and detect_format(t_raw) != "target":
        t_loc, d_loc, t_raw = None, t_loc, None                 # a draft on its own
    elif detect_format(t_raw) != "target":
        raise CheckpointError(f"{t_loc.source} is a {detect_format(t_raw)} draft, not a target: "
                              "name the target first and the draft with --draft")
    d_raw = read_config(d_loc.path) if d_loc is not None else None
    if d_raw is not None and detect_format(d_raw) == "target":
        raise CheckpointError(f"{d_loc.source} is not a draft (its config.json has no "
                              "dflash_config or speculators_config): give a DFlash, DFlash2 or "
                              "speculators draft")
    report = Report(None, None)
    tcfg = tpart = None
    if t_loc is not None:
        tcfg = TargetConfig.from_dict(t_raw)
        tpart = _target_part(t_loc, tcfg)
        report.target = tpart
    dpart, dcfg = _draft_part(d_loc, d_raw) if d_loc is not None else (None, None)
    report.draft = dpart
    if tpart is not None and dpart is not None:
        report.checks = _fit(tpart, tcfg, dpart, d_loc)
        native_mapped = dpart["vocab_mapping"] and dcfg is not None and not dcfg.reduced_vocab
        if dcfg is not None and not report.problems and not native_mapped:
            try:                          # the loader's own check agrees (a safety net)
                dcfg.check_target(tcfg)
            except DraftMismatchError as exc:
                report.checks.append(Check("draft config", False, str(exc),
                                           "use a draft made for this target"))
    _memory(report, device)
    report.runnable = _runnable(report, dcfg)
    return report


# --- what each checkpoint is ------------------------------------------------------------------

def read_header(file: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """{tensor: (shape, dtype)} from a safetensors file's JSON header; no tensor data is read."""
    try:
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 2 <= n <= _MAX_HEADER:
                raise CheckpointError(f"{file}: not a safetensors file (header size {n})")
            header = json.loads(f.read(n))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read the safetensors header of {file}: {exc}") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{file}: malformed safetensors header")
    header.pop("__metadata__", None)
    try:
        return {name: (tuple(int(x) for x in info["shape"]), str(info["dtype"]))
                for name, info in header.items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{file}: malformed safetensors header ({exc})") from exc


def _headers(loc: hub.Located) -> Found:
    """Every tensor of the checkpoint: local files' headers, or for a hub id whose weights are
    not cached, the headers read remotely (offline: 'not in the cache')."""
    path = loc.path
    if (path / SINGLE_FILE).is_file():
        files = [SINGLE_FILE]
    elif (path / INDEX_FILE).is_file():
        weight_map = read_json_object(path / INDEX_FILE).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{path / INDEX_FILE}: no weight_map")
        files = sorted(set(weight_map.values()))
    elif loc.repo_id is None or hub.offline():
        if loc.repo_id is not None and not any(
                p.suffix in hub.PICKLE_SUFFIXES for p in path.iterdir()):
            raise hub._not_cached(loc.repo_id, loc.revision, True, SINGLE_FILE)
        files = [f.name for f in _tensor_files(path)]     # raises: no safetensors (or pickle)
    else:
        files = [SINGLE_FILE]            # no index fetched: a single-file checkpoint, if any
    found: Found = {}
    for name in files:
        file = path / name
        if file.is_file():
            tensors = read_header(file)
        elif loc.repo_id is None:
            raise CheckpointError(f"{path / INDEX_FILE} names shard {name}, which does not exist")
        elif hub.offline():
            raise hub._not_cached(loc.repo_id, loc.revision, True, name)
        else:
            tensors = hub.file_headers(loc.repo_id, loc.repo_path(name), loc.commit)
        for t, (shape, dt) in tensors.items():
            if t in found:
                raise CheckpointError(f"tensor {t} appears in both {found[t][0].name} and {name}")
            found[t] = (Path(name), shape, dt)
    return found


def _stored_dtype(found: Found) -> str:
    counts = Counter(dt for _, _, dt in found.values())
    return counts.most_common(1)[0][0] if counts else "none"


def _place(loc: hub.Located) -> dict[str, Any]:
    return {"source": loc.source, "path": str(loc.path), "revision": loc.revision,
            "commit": loc.commit}


def _target_part(loc: hub.Located, cfg: TargetConfig) -> dict[str, Any]:
    found = _headers(loc)
    expected = target_tensors(cfg)
    _check_names(expected, found, cfg)
    return {**_place(loc), "model_type": cfg.model_type, "layers": cfg.num_hidden_layers,
            "hidden": cfg.hidden_size, "heads": cfg.num_attention_heads,
            "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
            "intermediate": cfg.intermediate_size, "vocab": cfg.vocab_size,
            "tied_embeddings": cfg.tie_word_embeddings,
            "bos_token_id": cfg.bos_token_id, "eos_token_ids": list(cfg.eos_token_ids),
            "parameters": sum(math.prod(s) for s in expected.values()),
            "stored_dtype": _stored_dtype(found), "tokenizer": _tokenizer(loc.path)}


def _draft_part(loc: hub.Located, raw: dict[str, Any]
                ) -> tuple[dict[str, Any], DraftConfig | None]:
    fmt = detect_format(raw)
    found = _headers(loc)
    mapping = {k: list(found[k][1]) for k in MAPPING_TENSORS if k in found}
    part: dict[str, Any] = {**_place(loc), "format": fmt, "vocab_mapping": mapping or None,
                            "stored_dtype": _stored_dtype(found),
                            "eos_token_id": raw.get("eos_token_id"),
                            "bos_token_id": raw.get("bos_token_id"),
                            "tokenizer": _tokenizer(loc.path)}
    if fmt == "speculators" and raw.get("speculators_model_type") not in SPECULATORS_TYPES:
        part.update(_speculators(raw))
        part["parameters"] = sum(math.prod(s) for n, (_, s, _) in found.items()
                                 if n not in MAPPING_TENSORS)
        return part, None
    cfg = DraftConfig.from_dict(raw)
    if fmt == "speculators":
        cfg = cfg.with_tensors(canonical_names(found).values())
        part.update(_speculators(raw))
        body = found
    else:
        body = {n: v for n, v in found.items() if n not in MAPPING_TENSORS}
    expected = check_draft_tensors(cfg, body, loc.source)
    a = cfg.arch
    part.update(layers=a.num_hidden_layers, hidden=a.hidden_size, heads=a.num_attention_heads,
                kv_heads=a.num_key_value_heads, head_dim=a.head_dim,
                intermediate=a.intermediate_size, vocab=a.vocab_size,
                draft_vocab=found["d2t"][1][0] if "d2t" in found else cfg.head_rows,
                block_size=cfg.block_size, tap_layers=list(cfg.target_layer_ids),
                num_target_layers=cfg.num_target_layers, mask_token_id=cfg.mask_token_id,
                sliding_windows=list(cfg.sliding_windows),
                causal_layers=[cfg.causal(i) for i in range(a.num_hidden_layers)],
                own_embedding=cfg.own_embedding, own_head=cfg.own_head,
                parameters=sum(math.prod(s) for s in expected.values()))
    if cfg.variant == "dflash2":
        part.update(selector_rank=cfg.selector_rank, selector_top_k=cfg.selector_top_k,
                    conv_kernel_size=cfg.conv_kernel_size)
    return part, cfg


def _speculators(raw: dict[str, Any]) -> dict[str, Any]:
    """The shapes a speculators config declares (``transformer_layer_config`` for the draft
    layers, ``draft_vocab_size``, the verifier's aux hidden-state layers)."""
    sc = raw.get("speculators_config") or {}
    tl = raw.get("transformer_layer_config") or {}
    methods = sc.get("proposal_methods") or []
    default = sc.get("default_proposal_method")
    method = next((m for m in methods if m.get("proposal_type") == default),
                  methods[0] if methods else {})
    taps = (raw.get("eagle_aux_hidden_state_layer_ids") or raw.get("aux_hidden_state_layer_ids")
            or raw.get("target_layer_ids") or (raw.get("dflash_config") or {}).get(
                "target_layer_ids"))
    heads = tl.get("num_attention_heads")
    vocab = tl.get("vocab_size", raw.get("vocab_size"))
    block = raw.get("block_size") or (method.get("speculative_tokens") + 1
                                      if method.get("speculative_tokens") else None)
    return {"algorithm": raw.get("speculators_model_type") or sc.get("algorithm"),
            "verifier": (sc.get("verifier") or {}).get("name_or_path"),
            "layers": tl.get("num_hidden_layers"),
            "hidden": raw.get("target_hidden_size") or tl.get("hidden_size"),
            "draft_hidden": tl.get("hidden_size"), "heads": heads,
            "kv_heads": tl.get("num_key_value_heads", heads),
            "head_dim": tl.get("head_dim"), "intermediate": tl.get("intermediate_size"),
            "vocab": vocab, "draft_vocab": raw.get("draft_vocab_size", vocab),
            "block_size": block, "tap_layers": list(taps) if taps else None,
            "num_target_layers": raw.get("num_target_layers"),
            "mask_token_id": raw.get("mask_token_id")}


def _tokenizer(path: Path) -> dict[str, Any] | None:
    """Size and id range of ``path/tokenizer.json`` (regular and added tokens), or None."""
    file = path / "tokenizer.json"
    if not file.is_file():
        return None
    data = read_json_object(file)
    vocab = _vocab(data)
    ids = set(vocab.values())
    return {"tokens": len(ids), "max_id": max(ids) if ids else -1, "file": str(file)}


def _vocab(data: dict[str, Any]) -> dict[str, int]:
    """token → id of a tokenizer.json (BPE / WordLevel / WordPiece dicts, Unigram lists), with
    its added tokens."""
    model = data.get("model") or {}
    raw = model.get("vocab") or {}
    vocab = {str(k): int(v) for k, v in raw.items()} if isinstance(raw, dict) else {
        str(entry[0]): i for i, entry in enumerate(raw)}
    for tok in data.get("added_tokens") or []:
        if isinstance(tok, dict) and "content" in tok and "id" in tok:
            vocab[str(tok["content"])] = int(tok["id"])
    return vocab


# --- whether they fit -------------------------------------------------------------------------

def _fit(t: dict[str, Any], tcfg: TargetConfig, d: dict[str, Any],
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
        tv = _vocab(read_json_object(Path(tok["file"])))
        dv = _vocab(read_json_object(Path(d["tokenizer"]["file"])))
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

def _memory(report: Report, device: torch.device | str | None) -> None:
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


def _runnable(report: Report, dcfg: DraftConfig | None) -> bool | None:
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
