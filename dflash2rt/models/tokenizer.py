"""TextTokenizer: a small wrapper over a checkpoint's tokenizer.json and its end-of-sequence ids."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash2rt.errors import CheckpointError

if TYPE_CHECKING:
    import tokenizers


@dataclass(frozen=True)
class TextTokenizer:
    """encode/decode with the defaults of transformers' tokenizers (special tokens added, not skipped)."""

    backend: tokenizers.Tokenizer
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding an object; anything else is a CheckpointError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:     # RecursionError: nested too deep
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


def _ids(value: Any, where: Path) -> tuple[int, ...]:
    values = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise CheckpointError(f"{where}: eos_token_id must be an int or a list of ints, got {value!r}")
    return tuple(values)


def load_tokenizer(path: str | Path) -> TextTokenizer:
    """Read `path/tokenizer.json`; eos ids come from generation_config.json, else config.json."""
    import tokenizers

    path = Path(path)
    file = path / "tokenizer.json"
    if not file.is_file():
        raise CheckpointError(f"{path}: tokenizer.json not found")
    try:
        backend = tokenizers.Tokenizer.from_file(str(file))
    except Exception as exc:  # the tokenizers library raises a bare Exception on malformed files
        raise CheckpointError(f"cannot load {file}: {exc}") from exc
    eos: tuple[int, ...] = ()
    bos = None
    for name in ("generation_config.json", "config.json"):
        if (path / name).is_file():
            data = read_json_object(path / name)
            if not eos:
                eos = _ids(data.get("eos_token_id"), path / name)
            if bos is None:
                bos = data.get("bos_token_id")
    return TextTokenizer(backend=backend, eos_token_ids=eos, bos_token_id=bos)
