"""Write seeded random checkpoints in the published on-disk layout: config.json, safetensors shards
``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json`` (as transformers'
``save_pretrained`` writes them), one shard in memory at a time."""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path
from typing import Any

import torch

from ..models.hf_loader import CONFIG_FILE, INDEX_FILE, SINGLE_FILE

GB = 10**9
STD = 0.02


def tensor_for(name: str, shape: tuple[int, ...], seed: int, dtype: torch.dtype,
               device: torch.device | str = "cpu") -> torch.Tensor:
    """A seeded tensor that depends only on (seed, name, shape, device type): ones for norms,
    N(0, 0.02²) otherwise (so any shard can be written, or rewritten, alone). Drawn on
    ``device`` by its own generator (an accelerator's draws differ from the CPU's, and are as
    deterministic), so a model can be filled where it runs without a host copy."""
    if name.endswith("norm.weight") or len(shape) == 1:
        return torch.ones(shape, dtype=dtype, device=device)
    gen = torch.Generator(device).manual_seed(
        (seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    return torch.randn(shape, generator=gen, device=device).mul_(STD).to(dtype)


def plan_shards(shapes: dict[str, tuple[int, ...]], itemsize: int, max_bytes: int
                ) -> list[list[str]]:
    """Names in order, cut into shards of at most ``max_bytes`` (a bigger tensor is alone)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        n = itemsize * math.prod(shape)
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def write_safetensors(out: Path, shapes: dict[str, tuple[int, ...]], seed: int,
                      dtype: torch.dtype, max_shard_bytes: int,
                      fixed: dict[str, Any] | None = None) -> list[Path]:
    """The tensors ``shapes`` as one ``model.safetensors`` or as shards with an index;
    ``fixed``: name → a function returning that tensor (the others are ``tensor_for``)."""
    fixed = fixed or {}
    from safetensors.torch import save_file

    itemsize = torch.empty((), dtype=dtype).element_size()
    shards = plan_shards(shapes, itemsize, max_shard_bytes)
    n = len(shards)
    files, weight_map, total = [], {}, 0
    for i, names in enumerate(shards):
        file = SINGLE_FILE if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        state = {name: fixed[name]() if name in fixed else
                 tensor_for(name, shapes[name], seed, dtype) for name in names}
        total += sum(t.numel() * t.element_size() for t in state.values())
        save_file(state, str(out / file), metadata={"format": "pt"})
        del state
        weight_map.update({name: file for name in names})
        files.append(out / file)
    if n > 1:
        (out / INDEX_FILE).write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    return files


def write_model(out: Path, config: dict[str, Any], shapes: dict[str, tuple[int, ...]], seed: int,
                dtype: torch.dtype, max_shard_bytes: int,
                fixed: dict[str, Any] | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return write_safetensors(out, shapes, seed, dtype, max_shard_bytes, fixed)
