"""``dflash2rt synth``: target / draft pairs with real shapes and the real on-disk layout,
filled with seeded random weights (no model hub is reachable; loading, memory, kernels and
step costs at scale depend on shapes and layout, not on trained values).

The draft is written in any published format and layout (``shapes.LAYOUTS``): DFlash2 (as
published, codebooks with ``.weight``, mixed sliding / full attention), DFlash v1 (block size at
the top level or in ``dflash_config``) and speculators (DFlash v1 or DFlash2, optionally with a
reduced draft vocabulary: ``d2t`` / ``t2d`` and a ``lm_head`` of the chosen target ids). A
speculators draft's ``embed_tokens`` and ``lm_head`` are the target's (speculators copies the
verifier's into the checkpoint)."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..errors import InvalidInputError
from ..models.config import TargetConfig
from ..models.draft_config import DraftConfig
from ..models.draft_config_write import draft_config_dict
from ..models.draft_loader import CODEBOOKS
from ..models.draft_loader import expected_tensors as draft_tensors
from ..models.hf_loader import target_tensors
from .shapes import (SHAPES, TOY_SHAPES, Shape, check_layout, draft_config, get_shape,
                     mixed_attention, v1_config)
from .tokenizer import write_tokenizer
from .write import GB, tensor_for, write_model

__all__ = ["SHAPES", "TOY_SHAPES", "synthesize"]


def synthesize(name: str, out: str | Path, seed: int = 0, layers: int | None = None,
               draft_layers: int | None = None, dtype: torch.dtype = torch.bfloat16,
               max_shard_bytes: int = 4 * GB, draft_format: str = "dflash2",
               draft_vocab: int | None = None, layout: str | None = None) -> dict[str, Any]:
    """Write ``out/target`` (config.json, shards + index, tokenizer) and ``out/draft`` (format
    ``draft_format`` in ``layout``, ``shapes.LAYOUTS``) for shape ``name``. ``layers``: fewer
    target layers, same layout; ``draft_vocab``: a speculators DFlash draft proposing among
    that many of the target's ids. Returns a summary (sizes, files, seconds)."""
    t0 = time.perf_counter()
    if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int) \
            or max_shard_bytes < 1:
        raise InvalidInputError(f"the largest shard must be a positive size, got "
                                f"{max_shard_bytes!r} bytes (--shard-gb > 0)")
    layout = check_layout(draft_format, layout, draft_vocab)
    shape = get_shape(name, layers)
    out = Path(out)
    tcfg_dict = shape.target
    tcfg = TargetConfig.from_dict(tcfg_dict)
    dcfg_dict, dcfg = _draft(shape, tcfg, draft_layers, draft_format, layout, draft_vocab)
    dcfg.check_target(tcfg)
    tshapes, dshapes = target_tensors(tcfg), draft_tensors(dcfg)
    fixed = _draft_fixed(shape, tcfg, dcfg, seed, dtype)
    if layout == "codebook-weight":
        dshapes = {(n + ".weight" if n in CODEBOOKS else n): s for n, s in dshapes.items()}
    for sub in ("target", "draft"):
        try:
            (out / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidInputError(f"output directory {str(out / sub)!r}: cannot create it "
                                    f"({exc.strerror})") from None
    tfiles = write_model(out / "target", tcfg_dict, tshapes, seed, dtype, max_shard_bytes)
    write_tokenizer(shape, out / "target")
    dfiles = write_model(out / "draft", dcfg_dict, dshapes, seed + 1, dtype, max_shard_bytes,
                         fixed)
    size = lambda files: sum(f.stat().st_size for f in files)  # noqa: E731
    return {"shape": name, "out": str(out), "target_layers": shape.num_layers,
            "draft_format": draft_format, "layout": layout,
            "draft_vocab": dcfg.head_rows,
            "target_params": sum(math.prod(s) for s in tshapes.values()),
            "draft_params": sum(math.prod(s) for s in dshapes.values()),
            "target_bytes": size(tfiles), "draft_bytes": size(dfiles),
            "target_shards": len(tfiles), "draft_shards": len(dfiles),
            "seconds": round(time.perf_counter() - t0, 1)}



def _draft(shape: Shape, tcfg: TargetConfig, draft_layers: int | None, draft_format: str,
           layout: str, draft_vocab: int | None) -> tuple[dict[str, Any], DraftConfig]:
    """The draft's config.json and its DraftConfig, in ``draft_format`` / ``layout``."""
    if draft_format == "dflash":
        d = v1_config(shape, draft_layers, block_at_top=layout == "block-at-top")
        return d, DraftConfig.from_dict(d)
    if draft_format == "dflash2" or layout == "dflash2":
        d = draft_config(shape, draft_layers)
        if layout == "mixed-attention":
            d = mixed_attention(d)
    else:
        d = v1_config(shape, draft_layers, block_at_top=False)
    if draft_format != "speculators":
        return d, DraftConfig.from_dict(d)
    cfg = replace(DraftConfig.from_dict(d), source_format="speculators", own_head=True,
                  own_embedding=True, draft_vocab_size=draft_vocab or 0)
    cfg.validate()
    d = draft_config_dict(cfg, "speculators")
    return d, DraftConfig.from_dict(d).with_tensors(draft_tensors(cfg))


def draft_ids(shape: Shape, vocab: int, n: int) -> torch.Tensor:
    """[n] the target ids a reduced draft vocabulary keeps, ascending: the shape's first special
    tokens (its bos / eos / chat markers, at most n // 8) and the lowest regular ids."""
    specials = [shape.regular_tokens + k for k in range(min(len(shape.specials), n // 8))]
    regular = list(range(min(n - len(specials), shape.regular_tokens)))
    ids = sorted(set(regular) | set(specials))
    return torch.tensor(ids[:n] if len(ids) >= n else
                        ids + [i for i in range(vocab) if i not in set(ids)][:n - len(ids)])


def _draft_fixed(shape: Shape, tcfg: TargetConfig, dcfg: DraftConfig, seed: int,
                 dtype: torch.dtype) -> dict[str, Any]:
    """A speculators draft's tensors that are not random: ``embed_tokens`` / ``lm_head`` copied
    from the target (rows of the kept ids), ``d2t`` / ``t2d``."""
    if dcfg.source_format != "speculators":
        return {}
    v, h = tcfg.vocab_size, tcfg.hidden_size
    emb = lambda: tensor_for("model.embed_tokens.weight", (v, h), seed, dtype)  # noqa: E731
    head = emb if tcfg.tie_word_embeddings else \
        (lambda: tensor_for("lm_head.weight", (v, h), seed, dtype))
    fixed: dict[str, Any] = {"embed_tokens.weight": emb, "lm_head.weight": head}
    if dcfg.reduced_vocab:
        ids = draft_ids(shape, v, dcfg.draft_vocab_size)
        fixed["lm_head.weight"] = lambda: head()[ids].contiguous()
        fixed["d2t"] = lambda: ids - torch.arange(ids.numel())
        fixed["t2d"] = lambda: torch.zeros(v, dtype=torch.bool).index_fill_(0, ids, True)
    return fixed
