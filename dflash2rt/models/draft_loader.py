"""Load and save DFlash2 / DFlash v1 drafts in the published format (config.json + safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dflash2rt.errors import CheckpointError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft import DraftModel
from dflash2rt.models.draft_config import DraftConfig, draft_config_dict
from dflash2rt.models.hf_loader import (CONFIG_FILE, SINGLE_FILE, _scan, _tensor_files,
                                        check_weights_fit, read_config)

_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


def expected_tensors(cfg: DraftConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name the draft format holds for ``cfg``, with its shape."""
    with torch.device("meta"):
        model = DraftModel(cfg)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def check_draft_tensors(cfg: DraftConfig, found: dict[str, tuple[Path, tuple[int, ...], str]],
                        where: object) -> dict[str, tuple[int, ...]]:
    """CheckpointError unless ``found`` (name → (file, shape, dtype), from the safetensors
    headers) holds exactly the tensors of ``cfg``; returns the expected shapes."""
    expected = expected_tensors(cfg)
    for name, (file, shape, dt) in sorted(found.items()):
        if name not in expected:
            hint = " (DFlash2 tensors in a DFlash v1 draft?)" if cfg.variant == "dflash1" else ""
            raise CheckpointError(f"unexpected tensor {name} in {Path(file).name}{hint}")
        if shape != expected[name]:
            raise CheckpointError(f"tensor {name} has shape {list(shape)}, expected "
                                  f"{list(expected[name])}")
        if dt not in _FLOAT_DTYPES:
            raise CheckpointError(f"tensor {name} has dtype {dt}; only float tensors are supported")
    missing = sorted(set(expected) - set(found))
    if missing:
        raise CheckpointError(f"missing tensor {missing[0]}" + (
            f" (and {len(missing) - 1} more)" if len(missing) > 1 else "") +
            f" in the {cfg.variant} draft at {where}")
    return expected


def load_draft(path: str | Path, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu",
               target: TargetConfig | None = None) -> tuple[DraftModel, DraftConfig]:
    """Read a draft directory; with ``target``, refuse a draft that does not fit it."""
    from safetensors import safe_open

    path = Path(path)
    cfg = DraftConfig.from_dict(read_config(path))
    if target is not None:
        cfg.check_target(target)
    found = _scan(_tensor_files(path))
    expected = check_draft_tensors(cfg, found, path)
    check_weights_fit(expected, dtype, device, f"the draft at {path}")
    state: dict[str, torch.Tensor] = {}
    for file in sorted({f for f, _, _ in found.values()}):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                state[name] = f.get_tensor(name).to(device=device, dtype=dtype)
    with torch.device("meta"):
        model = DraftModel(cfg)
    model.load_state_dict(state, strict=True, assign=True)
    model.to(device)
    model.requires_grad_(False)
    model.source_dir = str(path)  # where its weights came from (load reports)
    return model.eval(), cfg


def save_draft(model: DraftModel, path: str | Path) -> Path:
    """Write config.json and model.safetensors with the published tensor names."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {n: t.detach().to("cpu").contiguous() for n, t in model.state_dict().items()}
    save_file(state, str(path / SINGLE_FILE), metadata={"format": "pt"})
    (path / CONFIG_FILE).write_text(json.dumps(draft_config_dict(model.cfg), indent=2) + "\n")
    return path
