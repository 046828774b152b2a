"""A target / draft pair with its tokenizer, loaded from directories or built in memory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from dflash2rt.errors import CheckpointError, InvalidInputError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft import DraftModel
from dflash2rt.models.draft_loader import canonical_names, expected_tensors, load_draft
from dflash2rt.models.hf_loader import (check_weights_fit, load_target, load_tokenizer,
                                        read_config, scan_tensors, target_tensors,
                                        tensor_files)
from dflash2rt.models.target import TargetModel
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.tokenizer import TextTokenizer


@dataclass
class ModelPair:
    """The target (with taps at the draft's ``target_layer_ids``), the draft, and a tokenizer."""

    target: TargetModel
    draft: DraftModel | None
    tokenizer: TextTokenizer | None = None
    name: str = ""

    def __post_init__(self) -> None:
        vocab = self.target.cfg.vocab_size      # config.json's EOS ids: checked by TargetConfig
        tok = () if self.tokenizer is None else self.tokenizer.eos_token_ids
        outside = sorted({t for t in tok if not 0 <= t < vocab})
        if outside:
            raise CheckpointError(f"the tokenizer's eos_token_id {outside} (generation_config"
                                  f".json or config.json beside tokenizer.json) is outside the "
                                  f"vocabulary [0, {vocab}): such a token can never be "
                                  f"generated")
        if self.draft is not None:
            self.draft.cfg.check_target(self.target.cfg)
            if tuple(self.target.tap_layer_ids) != tuple(self.draft.cfg.target_layer_ids):
                raise InvalidInputError(
                    f"target taps {self.target.tap_layer_ids} differ from the draft's "
                    f"target_layer_ids {self.draft.cfg.target_layer_ids}; build the target with "
                    "tap_layer_ids=draft.cfg.target_layer_ids")

    @property
    def dtype(self) -> torch.dtype:
        return self.target.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.target.lm_head.weight.device

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        eos = set(self.target.cfg.eos_token_ids)
        if self.tokenizer is not None:
            eos |= set(self.tokenizer.eos_token_ids)
        return tuple(sorted(eos))


CHECKPOINT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16,
                     "float32": torch.float32, "float64": torch.float64}
# The strings a caller may give for a dtype: the checkpoint names and vLLM's aliases.
DTYPE_NAMES = {**CHECKPOINT_DTYPES, "float": torch.float32, "half": torch.float16}


def check_dtype(dtype: object) -> torch.dtype | str:
    """A model dtype as given to ``run`` / ``LLM`` / ``resolve_model``: "auto", a
    floating-point torch dtype, or one of ``DTYPE_NAMES`` (vLLM's strings) → "auto" or the torch
    dtype; anything else is an InvalidInputError. Whether a backend runs it is the engine's
    check."""
    if isinstance(dtype, str) and (dtype == "auto" or dtype in DTYPE_NAMES):
        return dtype if dtype == "auto" else DTYPE_NAMES[dtype]
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    raise InvalidInputError(f"dtype must be 'auto', a floating-point torch dtype or one of "
                            f"{', '.join(repr(n) for n in DTYPE_NAMES)}, got {dtype!r}")


def resolve_dtype(dtype: torch.dtype | str, target_dir: str | Path,
                  device: torch.device | str) -> torch.dtype:
    """``"auto"``: float32 on the CPU; elsewhere the checkpoint's dtype (config.json ``dtype`` /
    ``torch_dtype``; bfloat16 when absent). Any other dtype: ``check_dtype``'s."""
    dtype = check_dtype(dtype)
    if isinstance(dtype, torch.dtype):
        return dtype
    if torch.device(device).type == "cpu":
        return torch.float32
    cfg = read_config(target_dir)
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    if name not in CHECKPOINT_DTYPES:
        raise CheckpointError(f"{target_dir}/config.json: dtype {name!r} is not one of "
                              f"{', '.join(CHECKPOINT_DTYPES)}; pass dtype explicitly")
    return CHECKPOINT_DTYPES[name]


def load_pair(target_dir: str | Path, draft_dir: str | Path | None,
              dtype: torch.dtype | str = torch.float32, device: torch.device | str = "cpu",
              name: str = "") -> ModelPair:
    """Load a HF target directory and a DFlash draft directory (``None``: target only);
    ``dtype="auto"``: see ``resolve_dtype``."""
    dtype = resolve_dtype(dtype, target_dir, device)
    draft_cfg = None
    if draft_dir is not None:
        draft_cfg = DraftConfig.from_dict(read_config(draft_dir))
        draft_cfg.check_target(TargetConfig.from_dict(read_config(target_dir)))
        if draft_cfg.source_format == "speculators":      # its own embedding / head, if shipped
            draft_cfg = draft_cfg.with_tensors(
                canonical_names(scan_tensors(tensor_files(Path(draft_dir)))).values())
    taps = draft_cfg.target_layer_ids if draft_cfg else ()
    _check_pair_fits(target_dir, draft_cfg, taps, dtype, device)
    target, target_cfg = load_target(target_dir, dtype, device, taps)
    draft = None
    if draft_dir is not None:
        draft, _ = load_draft(draft_dir, dtype, device, target=target_cfg)
    tok = None
    if (Path(target_dir) / "tokenizer.json").is_file():
        tok = load_tokenizer(target_dir)
    elif not Path(target_dir).is_dir():
        raise CheckpointError(f"{target_dir} is not a directory")
    return ModelPair(target, draft, tok, name or Path(target_dir).name)


def _check_pair_fits(target_dir: str | Path, draft_cfg: DraftConfig | None, taps, dtype: torch.dtype,
                     device: torch.device | str) -> None:
    """ResourceError before any weight is read when target + draft cannot fit ``device``."""
    cfg = TargetConfig.from_dict(read_config(target_dir))
    shapes = {f"target.{n}": s for n, s in target_tensors(cfg, taps).items()}
    if draft_cfg is not None:
        shapes.update({f"draft.{n}": s for n, s in expected_tensors(draft_cfg).items()})
    check_weights_fit(shapes, dtype, device, f"the models at {target_dir}"
                      + (" with their draft" if draft_cfg is not None else ""))
