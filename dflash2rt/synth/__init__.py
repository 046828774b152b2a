"""``dflash2rt synth``: target / DFlash2 draft pairs with real shapes and the real on-disk layout,
filled with seeded random weights (no model hub is reachable; loading, memory, kernels and
step costs at scale depend on shapes and layout, not on trained values)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from ..models.config import TargetConfig
from ..models.draft_config import DraftConfig
from ..models.draft_loader import expected_tensors as draft_tensors
from ..models.hf_loader import target_tensors
from .shapes import SHAPES, draft_config, get_shape
from .tokenizer import write_tokenizer
from .write import GB, write_model

__all__ = ["SHAPES", "synthesize"]


def synthesize(name: str, out: str | Path, seed: int = 0, layers: int | None = None,
               draft_layers: int | None = None, dtype: torch.dtype = torch.bfloat16,
               max_shard_bytes: int = 4 * GB) -> dict[str, Any]:
    """Write ``out/target`` (config.json, shards + index, tokenizer) and ``out/draft`` (the
    published DFlash2 layout) for shape ``name``. ``layers``: fewer target layers, same layout.
    Returns a summary (sizes, files, seconds)."""
    t0 = time.perf_counter()
    shape = get_shape(name, layers)
    out = Path(out)
    tcfg_dict = shape.target
    tcfg = TargetConfig.from_dict(tcfg_dict)
    dcfg_dict = draft_config(shape, draft_layers)
    dcfg = DraftConfig.from_dict(dcfg_dict)
    dcfg.check_target(tcfg)
    tshapes, dshapes = target_tensors(tcfg), draft_tensors(dcfg)
    tfiles = write_model(out / "target", tcfg_dict, tshapes, seed, dtype, max_shard_bytes)
    write_tokenizer(shape, out / "target")
    dfiles = write_model(out / "draft", dcfg_dict, dshapes, seed + 1, dtype, max_shard_bytes)
    size = lambda files: sum(f.stat().st_size for f in files)  # noqa: E731
    return {"shape": name, "out": str(out), "target_layers": shape.num_layers,
            "target_params": sum(math.prod(s) for s in tshapes.values()),
            "draft_params": sum(math.prod(s) for s in dshapes.values()),
            "target_bytes": size(tfiles), "draft_bytes": size(dfiles),
            "target_shards": len(tfiles), "draft_shards": len(dfiles),
            "seconds": round(time.perf_counter() - t0, 1)}

