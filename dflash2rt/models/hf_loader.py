"""Load and save Hugging Face Qwen3/Llama checkpoints: config.json plus safetensors (never pickle)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from dflash2rt.errors import CheckpointError, InvalidInputError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.memory import GB, check_fits
from dflash2rt.models.target import TargetModel
from dflash2rt.models.tokenizer import TextTokenizer, load_tokenizer, read_json_object

__all__ = ["load_target", "load_tokenizer", "read_config", "save_target", "target_tensors",
           "TextTokenizer"]

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Tensors that old checkpoints carry but that are recomputed, as transformers also ignores them.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def read_config(path: str | Path) -> dict[str, Any]:
    """The config.json dict of a checkpoint directory."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise CheckpointError(f"{path}: config.json not found (expected a Hugging Face checkpoint directory)")
    return read_json_object(file)


def tensor_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint: model.safetensors, else the shards of the index."""
    if (path / SINGLE_FILE).is_file():
        return [path / SINGLE_FILE]
    if (path / INDEX_FILE).is_file():
        weight_map = read_json_object(path / INDEX_FILE).get("weight_map")
        if not isinstance(weight_map, dict) \
                or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{path / INDEX_FILE}: its weight_map must map tensor names to "
                                  "shard file names")
        files = [path / name for name in sorted(set(weight_map.values()))]
        for file in files:
            if not file.is_file():
                raise CheckpointError(f"{path / INDEX_FILE} names shard {file.name}, which does not exist")
        return files
    others = sorted(p.name for p in path.glob("*.safetensors"))
    hint = f" (found {others} but no {INDEX_FILE})" if others else ""
    if not others and (any(path.glob("*.bin")) or any(path.glob("*.pt"))):
        hint = " (pickle checkpoints such as *.bin / *.pt are never loaded; convert them to safetensors)"
    raise CheckpointError(f"{path}: no safetensors files: expected {SINGLE_FILE} or {INDEX_FILE}{hint}")


def scan_tensors(files: list[Path]) -> dict[str, tuple[Path, tuple[int, ...], str]]:
    """name -> (file, shape, dtype) without reading tensor data."""
    from safetensors import safe_open

    found: dict[str, tuple[Path, tuple[int, ...], str]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():
                    if name in found:
                        raise CheckpointError(f"tensor {name} appears in both {found[name][0].name} and {file.name}")
                    sl = f.get_slice(name)
                    found[name] = (file, tuple(sl.get_shape()), sl.get_dtype())
        except CheckpointError:
            raise
        except Exception as exc:  # safetensors raises its own SafetensorError on corrupt headers
            raise CheckpointError(f"cannot read {file}: {exc}") from exc
    return found


def check_tensor_names(expected: dict[str, tuple[int, ...]], found: dict[str, Any],
                       cfg: TargetConfig) -> None:
    """Every stored tensor (``scan_tensors``) is one the model expects (``stored_shapes``) with
    that shape, and every expected one is stored: CheckpointError naming the first that is
    not (unused suffixes and a tied LM head aside)."""
    for name, (file, shape, dtype) in sorted(found.items()):
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # checked against the embedding after loading
        if name not in expected:
            raise CheckpointError(f"unexpected tensor {name} in {file.name} (not part of a {cfg.model_type} model)")
        if shape != expected[name]:
            raise CheckpointError(f"tensor {name} has shape {list(shape)}, expected {list(expected[name])}")
        if dtype not in ("F64", "F32", "F16", "BF16"):
            raise CheckpointError(f"tensor {name} has dtype {dtype}; only float checkpoints are supported")
    for name in expected:
        if name not in found:
            raise CheckpointError(f"missing tensor {name} (a {cfg.model_type} checkpoint must contain it)")



def target_tensors(cfg: TargetConfig, tap_layer_ids: Sequence[int] = ()) -> dict[str, tuple[int, ...]]:
    """Every tensor a target checkpoint stores for ``cfg``, with its shape (no ``lm_head.weight``
    when the embeddings are tied)."""
    with torch.device("meta"):
        return stored_shapes(TargetModel(cfg, tap_layer_ids), cfg)


def stored_shapes(model: TargetModel, cfg: TargetConfig) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor a checkpoint of ``model`` stores (a tied LM head is not)."""
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        del shapes["lm_head.weight"]
    return shapes


def check_weights_fit(shapes: dict[str, tuple[int, ...]], dtype: torch.dtype,
                      device: torch.device | str, what: str) -> None:
    """ResourceError before anything is read when the weights cannot fit ``device``."""
    n = sum(math.prod(shape) for shape in shapes.values())
    size = torch.empty((), dtype=dtype).element_size()
    lower = (f"the dtype (in bfloat16 they need {n * 2 / GB:.2f} GB) or use a device with more "
             "memory") if size > 2 else None       # 16-bit already: only more memory helps
    check_fits(n * size, device,
               f"{what} ({n / 1e9:.2f}B parameters in {str(dtype).replace('torch.', '')})",
               lower)


def load_target(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    tap_layer_ids: Sequence[int] = (),
) -> tuple[TargetModel, TargetConfig]:
    """Build a TargetModel from a HF checkpoint directory, weights cast to `dtype` on `device`, grads off."""
    from safetensors import safe_open

    path = Path(path)
    cfg = TargetConfig.from_dict(read_config(path))
    with torch.device("meta"):
        model = TargetModel(cfg, tap_layer_ids)  # no memory for weights until they are loaded
    expected = stored_shapes(model, cfg)
    found = scan_tensors(tensor_files(path))
    check_tensor_names(expected, found, cfg)
    check_weights_fit(expected, dtype, device, f"the target at {path}")
    wanted = set(expected) | ({"lm_head.weight"} & set(found) if cfg.tie_word_embeddings else set())
    # One tensor at a time: read (memory-mapped file), convert straight to the device and dtype,
    # drop the source; host memory peaks at about the model (CPU) or one tensor (accelerators).
    state: dict[str, torch.Tensor] = {}
    head = None
    for file in sorted({found[name][0] for name in wanted}):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name == "lm_head.weight" and cfg.tie_word_embeddings:
                    head = f.get_tensor(name)          # compared with the embedding below
                elif name in wanted:
                    state[name] = f.get_tensor(name).to(device=device, dtype=dtype)
    if head is not None and not torch.equal(head.to(device=device, dtype=dtype),
                                            state["model.embed_tokens.weight"]):
        raise CheckpointError(
            "tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight"
        )
    del head
    if cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]   # shared, not copied
    model.load_state_dict(state, strict=True, assign=True)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    model.to(device)  # the rope buffer was built on the CPU
    model.requires_grad_(False)
    model.source_dir = str(path)  # where its weights came from (load reports)
    return model.eval(), cfg


def save_target(model: TargetModel, cfg_dict: dict[str, Any] | None, path: str | Path) -> Path:
    """Write config.json (cfg_dict, or model.cfg.to_dict()) and model.safetensors into directory `path`."""
    from safetensors.torch import save_file

    cfg_dict = model.cfg.to_dict() if cfg_dict is None else dict(cfg_dict)
    if TargetConfig.from_dict(cfg_dict) != model.cfg:
        raise InvalidInputError("save_target: cfg_dict describes a different architecture than the model")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().to("cpu").contiguous() for name, t in model.state_dict().items()}
    if model.cfg.tie_word_embeddings:
        del state["lm_head.weight"]
    save_file(state, str(path / SINGLE_FILE), metadata={"format": "pt"})
    (path / CONFIG_FILE).write_text(json.dumps(cfg_dict, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path
