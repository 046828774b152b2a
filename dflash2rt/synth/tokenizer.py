"""A tokenizer.json laid out like the real one of a shape: byte-level BPE over ids
[0, regular_tokens), then the shape's special tokens at their real ids.

No hub is reachable, so the BPE merges are learnt here from a little of the Python standard
library (a few thousand tokens); the rest of the regular ids are filler vocabulary entries that
no merge produces (text never encodes to them; they decode to their own spelling). The ids,
the vocabulary size and the special tokens are those of the published tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .shapes import Shape

MERGED = 4096          # ids learnt by BPE; ids above it up to ``regular_tokens`` are filler


def _sample_text(chars: int = 400_000) -> list[str]:
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    texts, n = [], 0
    for name in sorted(root.glob("*.py")):
        text = name.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        n += len(text)
        if n >= chars:
            break
    return texts


def build_tokenizer(shape: Shape) -> Any:
    """A ``tokenizers.Tokenizer`` with ``shape``'s id layout."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    merged = min(MERGED, shape.regular_tokens)
    tok.train_from_iterator(_sample_text(), trainers.BpeTrainer(
        vocab_size=merged, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    data = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    next_id = max(vocab.values()) + 1
    i = 0
    while next_id < shape.regular_tokens:          # filler: entries no merge produces
        word = f"\u0120\u0120fill{i}"
        i += 1
        if word not in vocab:
            vocab[word] = next_id
            next_id += 1
    data["added_tokens"] = [
        {"id": shape.regular_tokens + k, "content": s, "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
        for k, s in enumerate(shape.specials)]
    return Tokenizer.from_str(json.dumps(data))


def write_tokenizer(shape: Shape, out: Path) -> None:
    """tokenizer.json, tokenizer_config.json and generation_config.json into ``out``."""
    t = shape.target
    tok = build_tokenizer(shape)
    tok.save(str(out / "tokenizer.json"))
    names = {shape.regular_tokens + k: s for k, s in enumerate(shape.specials)}
    eos = t["eos_token_id"]
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": names.get(eos),
        "bos_token": names.get(t.get("bos_token_id")), "model_max_length":
            t["max_position_embeddings"]}, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({
        "bos_token_id": t.get("bos_token_id"), "eos_token_id": eos,
        "pad_token_id": t.get("pad_token_id", eos)}, indent=2) + "\n")
