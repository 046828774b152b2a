"""A byte-level BPE tokenizer trained on the corpus, with an EOS token and a reserved DFlash mask id."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from ..errors import InvalidInputError

if TYPE_CHECKING:
    import tokenizers

EOS_TOKEN = "<|endoftext|>"
# The mask token is a plain vocabulary entry that no BPE merge produces: encoding text never yields
# it (an added special token would be matched whenever a file contains its literal text).
MASK_TOKEN = "<|mask|>"


@dataclass(frozen=True)
class TrainedTokenizer:
    backend: tokenizers.Tokenizer
    eos_id: int
    mask_id: int

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self.backend.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids, skip_special_tokens=False)

    def save(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(directory / "tokenizer.json"))
        return directory / "tokenizer.json"


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> TrainedTokenizer:
    """Byte-level BPE with ``vocab_size`` ids in all: EOS is id 0, the mask token the last id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 300:
        raise InvalidInputError(f"vocab_size={vocab_size} is too small for byte-level BPE (>= 300)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1, special_tokens=[EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=2, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    mask_id = max(vocab.values()) + 1
    if MASK_TOKEN in vocab:
        raise InvalidInputError(f"the corpus produced {MASK_TOKEN!r} as an ordinary token")
    vocab[MASK_TOKEN] = mask_id
    backend = Tokenizer.from_str(json.dumps(data))
    eos_id = backend.token_to_id(EOS_TOKEN)
    return TrainedTokenizer(backend, eos_id, mask_id)
