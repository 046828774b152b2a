"""Load and save DFlash2 / DFlash v1 drafts in the published layouts (config.json + safetensors):
the native z-lab layouts and the speculators format (``draft_config.py``,
``speculators_config.py``).

Tensor names: the published DFlash2 checkpoints store the selector's codebooks as bare
parameters (``candidate_selector.predecessor_codebook``); checkpoints saved from an
``nn.Embedding`` selector (the z-lab reference's module, some converters) store them with a
``.weight`` suffix. Both are read (``canonical_names``); ``save_draft`` writes either. A
speculators draft adds ``embed_tokens.weight`` / ``lm_head.weight`` and, with a reduced
vocabulary, the integer ``d2t`` [draft vocab] and boolean ``t2d`` [V] mapping tensors."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dflash2rt.errors import CheckpointError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft import DraftModel
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.draft_config_write import draft_config_dict
from dflash2rt.models.hf_loader import (CONFIG_FILE, SINGLE_FILE, check_weights_fit,
                                        read_config, scan_tensors, tensor_files)
from dflash2rt.ops.vocab import target_ids

_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
_INT_TENSORS = {"d2t": ("I64", "I32"), "t2d": ("BOOL", "U8")}      # mapping tensors, not weights
CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")


def canonical_names(found: dict[str, tuple]) -> dict[str, str]:
    """{stored name: model name}: a DFlash2 codebook stored as ``<codebook>.weight`` is the
    parameter ``<codebook>``; CheckpointError if both spellings are present."""
    out = {}
    for name in found:
        base = name.removesuffix(".weight")
        if base in CODEBOOKS and name != base:
            if base in found:
                raise CheckpointError(f"both {base} and {name} are stored")
            out[name] = base
        else:
            out[name] = name
    return out


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
    names = canonical_names(found)
    found = {names[n]: v for n, v in found.items()}
    for name, (file, shape, dt) in sorted(found.items()):
        if name not in expected:
            hint = " (DFlash2 tensors in a DFlash v1 draft?)" if cfg.variant == "dflash1" else ""
            raise CheckpointError(f"unexpected tensor {name} in {Path(file).name}{hint}")
        if shape != expected[name]:
            raise CheckpointError(f"tensor {name} has shape {list(shape)}, expected "
                                  f"{list(expected[name])}")
        if dt not in _INT_TENSORS.get(name, _FLOAT_DTYPES):
            raise CheckpointError(f"tensor {name} has dtype {dt}; expected one of "
                                  f"{', '.join(_INT_TENSORS.get(name, _FLOAT_DTYPES))}")
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
    found = scan_tensors(tensor_files(path))
    cfg = cfg.with_tensors(canonical_names(found).values())
    expected = check_draft_tensors(cfg, found, path)
    check_weights_fit(expected, dtype, device, f"the draft at {path}")
    names = canonical_names(found)
    state: dict[str, torch.Tensor] = {}
    for file in sorted({f for f, _, _ in found.values()}):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                state[names[name]] = t.to(device=device, dtype=dtype) if t.is_floating_point() \
                    else t.to(device=device, dtype=torch.bool if name == "t2d" else torch.int64)
    if cfg.reduced_vocab:
        check_vocab_mapping(state["d2t"], state["t2d"], cfg, path)
    with torch.device("meta"):
        model = DraftModel(cfg)
    model.load_state_dict(state, strict=True, assign=True)
    model.to(device)
    model.requires_grad_(False)
    model.source_dir = str(path)  # where its weights came from (load reports)
    return model.eval(), cfg


def check_vocab_mapping(d2t: torch.Tensor, t2d: torch.Tensor, cfg: DraftConfig,
                        where: object) -> None:
    """CheckpointError unless d2t places the draft's ids on distinct target ids (``i + d2t[i]``
    in [0, V)) and t2d marks exactly those ids."""
    v = cfg.arch.vocab_size
    ids = target_ids(d2t)
    bad = ((ids < 0) | (ids >= v)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise CheckpointError(f"{where}: d2t[{i}] = {int(d2t[i])} places draft id {i} at target "
                              f"id {int(ids[i])}, outside [0, {v}) (target_id = draft_id + d2t)")
    if torch.unique(ids).numel() != ids.numel():
        raise CheckpointError(f"{where}: d2t maps two draft ids to the same target id")
    mask = torch.zeros(v, dtype=torch.bool, device=d2t.device)
    mask[ids] = True
    if not torch.equal(mask, t2d.to(torch.bool)):
        raise CheckpointError(f"{where}: t2d does not mark exactly the target ids d2t maps to "
                              f"({int(t2d.sum())} marked, {ids.numel()} mapped)")


def stored_state(model: DraftModel, codebook_suffix: bool = False) -> dict[str, torch.Tensor]:
    """The tensors to write, by stored name (``codebook_suffix``: codebooks as ``.weight``)."""
    state = {n: t.detach().to("cpu").contiguous() for n, t in model.state_dict().items()}
    if codebook_suffix:
        state = {(n + ".weight" if n in CODEBOOKS else n): t for n, t in state.items()}
    return state


def save_draft(model: DraftModel, path: str | Path, fmt: str | None = None,
               codebook_suffix: bool = False, block_at_top: bool = False) -> Path:
    """Write config.json and model.safetensors with the published tensor names, in layout
    ``fmt`` (default: the one the draft was read from; ``draft_config_dict``)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = draft_config_dict(model.cfg, fmt, block_at_top)
    save_file(stored_state(model, codebook_suffix), str(path / SINGLE_FILE),
              metadata={"format": "pt"})
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return path
