"""What each checkpoint is, for ``dflash2rt inspect``, read from its config.json, its
tokenizer.json and its safetensors headers only (no tensor data; for a hub id whose weights are
not cached, the headers come by range requests): the draft format a config declares
(``detect_format``), every tensor's shape and dtype, and a description of the target or the draft
(shapes, taps, vocabulary and its d2t / t2d mapping, parameter count, stored dtype, tokenizer).
The tensors are checked against what the loaders expect, so a description is of a checkpoint
that loads; a speculators draft of another algorithm is described from its config alone.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from dflash2rt.errors import CheckpointError
from dflash2rt.models import hub
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.draft_fields import ARCH_V1, ARCH_V2
from dflash2rt.models.draft_loader import canonical_names, check_draft_tensors
from dflash2rt.models.hf_loader import (INDEX_FILE, SINGLE_FILE, check_tensor_names, tensor_files,
                                        target_tensors)
from dflash2rt.models.speculators_config import SPECULATORS_TYPES
from dflash2rt.models.tokenizer import read_json_object

MAPPING_TENSORS = ("d2t", "t2d")        # draft → target ids, target → draft mask (EAGLE-3)
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


def read_header(file: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """{tensor: (shape, dtype)} from a safetensors file's JSON header; no tensor data is read."""
    try:
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 2 <= n <= _MAX_HEADER:
                raise CheckpointError(f"{file}: not a safetensors file (header size {n})")
            header = json.loads(f.read(n))
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"cannot read the safetensors header of {file}: {exc}") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{file}: malformed safetensors header")
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        shape = info.get("shape") if isinstance(info, dict) else None
        dtype = info.get("dtype") if isinstance(info, dict) else None
        if not isinstance(shape, list) or not isinstance(dtype, str) or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape):
            raise CheckpointError(f"{file}: malformed safetensors header (tensor {name!r}: "
                                  f"{info!r:.120}; a shape is a list of sizes, a dtype a name)")
        out[name] = (tuple(shape), dtype)
    return out


def tensor_headers(loc: hub.Located) -> Found:
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
            raise hub.not_cached(loc.repo_id, loc.revision, True, SINGLE_FILE)
        files = [f.name for f in tensor_files(path)]     # raises: no safetensors (or pickle)
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
            raise hub.not_cached(loc.repo_id, loc.revision, True, name)
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


def target_part(loc: hub.Located, cfg: TargetConfig) -> dict[str, Any]:
    found = tensor_headers(loc)
    expected = target_tensors(cfg)
    check_tensor_names(expected, found, cfg)
    return {**_place(loc), "model_type": cfg.model_type, "layers": cfg.num_hidden_layers,
            "hidden": cfg.hidden_size, "heads": cfg.num_attention_heads,
            "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
            "intermediate": cfg.intermediate_size, "vocab": cfg.vocab_size,
            "tied_embeddings": cfg.tie_word_embeddings,
            "bos_token_id": cfg.bos_token_id, "eos_token_ids": list(cfg.eos_token_ids),
            "parameters": sum(math.prod(s) for s in expected.values()),
            "stored_dtype": _stored_dtype(found), "tokenizer": tokenizer_summary(loc.path)}


def draft_part(loc: hub.Located, raw: dict[str, Any]
                ) -> tuple[dict[str, Any], DraftConfig | None]:
    fmt = detect_format(raw)
    found = tensor_headers(loc)
    mapping = {k: list(found[k][1]) for k in MAPPING_TENSORS if k in found}
    part: dict[str, Any] = {**_place(loc), "format": fmt, "vocab_mapping": mapping or None,
                            "stored_dtype": _stored_dtype(found),
                            "eos_token_id": raw.get("eos_token_id"),
                            "bos_token_id": raw.get("bos_token_id"),
                            "tokenizer": tokenizer_summary(loc.path)}
    if fmt == "speculators" and raw.get("speculators_model_type") not in SPECULATORS_TYPES:
        part.update(_speculators_shapes(raw))
        part["parameters"] = sum(math.prod(s) for n, (_, s, _) in found.items()
                                 if n not in MAPPING_TENSORS)
        return part, None
    cfg = DraftConfig.from_dict(raw)
    if fmt == "speculators":
        cfg = cfg.with_tensors(canonical_names(found).values())
        part.update(_speculators_shapes(raw))
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


def _speculators_shapes(raw: dict[str, Any]) -> dict[str, Any]:
    """The shapes a speculators config declares (``transformer_layer_config`` for the draft
    layers, ``draft_vocab_size``, the verifier's aux hidden-state layers); a CheckpointError
    where its sections are not of the kinds the format defines."""
    try:
        return _declared_shapes(raw)
    except (AttributeError, TypeError, KeyError) as exc:
        raise CheckpointError(f"malformed speculators config ({exc}): speculators_config, "
                              "transformer_layer_config and each proposal method are objects"
                              ) from exc


def _declared_shapes(raw: dict[str, Any]) -> dict[str, Any]:
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


def tokenizer_summary(path: Path) -> dict[str, Any] | None:
    """Size and id range of ``path/tokenizer.json`` (regular and added tokens), or None."""
    file = path / "tokenizer.json"
    if not file.is_file():
        return None
    data = read_json_object(file)
    try:
        vocab = tokenizer_vocab(data)
    except (AttributeError, TypeError, ValueError, IndexError, KeyError) as exc:
        raise CheckpointError(f"{file}: malformed tokenizer.json vocabulary ({exc})") from exc
    ids = set(vocab.values())
    return {"tokens": len(ids), "max_id": max(ids) if ids else -1, "file": str(file)}


def tokenizer_vocab(data: dict[str, Any]) -> dict[str, int]:
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
