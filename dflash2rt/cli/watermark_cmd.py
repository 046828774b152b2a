"""``dflash2rt watermark``: ``keygen`` writes a key file; ``detect`` scores a text or token list
under a key (no model needed; a tokenizer only for ``--text``). Keys come from files only, and
nothing this command prints holds key material."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import InvalidInputError


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..watermark.detect import DEFAULT_CONTEXT_WIDTH

    p = sub.add_parser("watermark", help="watermark keys and the detector")
    wsub = p.add_subparsers(dest="watermark_command", required=True)
    k = wsub.add_parser("keygen", help="write a new 256-bit watermark key file (mode 0600)")
    k.add_argument("--out", required=True, type=Path, help="key file to create")
    k.add_argument("--force", action="store_true", help="overwrite an existing file")
    k.set_defaults(func=keygen)
    d = wsub.add_parser("detect", help="test a text or token list for the watermark of a key")
    d.add_argument("--key-file", required=True, type=Path)
    d.add_argument("--allow-shared", action="store_true",
                   help="read a key file that its group or others may read (refused otherwise)")
    src = d.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text to test (tokenized with --model's tokenizer)")
    src.add_argument("--tokens", type=Path, help="a JSON file holding a list of token ids")
    d.add_argument("--model", default="stdlib-code", help="tokenizer for --text: a bundled model "
                   "name, or a directory with tokenizer.json (or target/tokenizer.json)")
    d.add_argument("--fpr", type=float, default=0.01, help="false-positive rate of the verdict")
    d.add_argument("--context-width", type=int, default=DEFAULT_CONTEXT_WIDTH,
                   help="tokens of context the values are keyed by (as at generation)")
    d.add_argument("--json", action="store_true", help="print the result as a JSON object")
    d.set_defaults(func=detect)


def keygen(args: argparse.Namespace) -> int:
    from ..watermark.keys import WatermarkKey

    key = WatermarkKey.generate()
    path = key.save(args.out, overwrite=args.force)
    print(f"wrote {path} ({key!r})")
    return 0


def _tokenizer(model: str):
    from ..models.tokenizer import load_tokenizer

    path = Path(model).expanduser()
    if not path.is_dir():
        from ..bundled import bundled_path  # raises "no such model directory", with the names

        path = bundled_path(model)
    for d in (path, path / "target"):
        if (d / "tokenizer.json").is_file():
            return load_tokenizer(d)
    raise InvalidInputError(f"{path} has no tokenizer.json (nor target/tokenizer.json); pass "
                            "--tokens with token ids instead")


def _read_tokens(path: Path) -> list:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise InvalidInputError(f"cannot read {str(path)!r}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidInputError(f"{str(path)!r} is not JSON ({exc}); --tokens wants a JSON "
                                "list of token ids") from None
    if not isinstance(data, list):
        raise InvalidInputError(f"{str(path)!r} holds a {type(data).__name__}; --tokens wants a "
                                "JSON list of token ids")
    return data


def detect(args: argparse.Namespace) -> int:
    from ..watermark.detect import detect as run_detect
    from ..watermark.keys import WatermarkKey

    key = WatermarkKey.from_file(args.key_file, allow_shared=args.allow_shared)
    if args.text is not None:
        tokens = _tokenizer(args.model).encode(args.text, add_special_tokens=False)
    else:
        tokens = _read_tokens(args.tokens)
    result = run_detect(key, tokens, fpr=args.fpr, context_width=args.context_width)
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        verdict = "watermarked" if result.watermarked else "not watermarked"
        print(f"{verdict} at fpr {result.fpr:g}: p-value {result.p_value:.3g} "
              f"(log10 {result.log10_p_value:.2f}), score {result.score:.2f} over "
              f"{result.tokens_scored} tokens ({result.repeated_skipped} repeated skipped, "
              f"{min(result.context_width, result.tokens_total)} context-only)")
    return 0
