"""Watermark keys: a 256-bit secret and its three domain-separated subkeys A, B, C.

A (draft walk), B (target residual / bonus / target-only draws) and C (acceptance coin) must be
independent, or the draft's noise leaks into the residual draw and the result is biased (the
shared-noise bug). Each subkey is keyed BLAKE2b of its domain label under the secret: knowing one
subkey tells nothing about another or about the secret. A subkey is 96 bits: the 64-bit Philox key
and one 32-bit counter word of ``values.keyed_bits``.

Keys are secrets: ``repr`` / ``str`` show a one-way fingerprint (BLAKE2b under its own label),
never the secret or a subkey; they are read from a file or built from bytes, never from the command
line.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

import torch

from ..errors import InvalidInputError

SECRET_BYTES = 32
_LABEL = b"dflash2rt watermark v1 "
DRAFT, TARGET, COIN = "A", "B", "C"          # subkeys: draft walk, target draws, the coin


class WatermarkKeyError(InvalidInputError):
    """A watermark key that cannot be read or is malformed (the message never holds the key)."""


class SubKey:
    """96 bits of one subkey: Philox key words (k0, k1) and counter word ``word`` (uint32 ints).

    Built only by ``WatermarkKey``; its repr names the domain, never the bits."""

    __slots__ = ("name", "k0", "k1", "word")

    def __init__(self, name: str, digest: bytes) -> None:
        self.name = name
        self.k0, self.k1, self.word = (int.from_bytes(digest[i:i + 4], "little")
                                       for i in range(0, 12, 4))

    def __repr__(self) -> str:
        return f"SubKey({self.name})"

    __str__ = __repr__


class WatermarkKey:
    """A 256-bit watermark secret (``generate``, ``from_bytes``, ``from_file``; ``save``)."""

    __slots__ = ("_secret", "_subkeys")

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, (bytes, bytearray)) or len(secret) != SECRET_BYTES:
            size = len(secret) if isinstance(secret, (bytes, bytearray)) else "?"
            raise WatermarkKeyError(f"a watermark key is {SECRET_BYTES} bytes (256 bits); got "
                                    f"{type(secret).__name__} of length {size}")
        self._secret = bytes(secret)
        self._subkeys = {n: SubKey(n, self._derive(n.encode(), 12)) for n in (DRAFT, TARGET, COIN)}

    @classmethod
    def generate(cls) -> "WatermarkKey":
        """A fresh key from the operating system's CSPRNG."""
        return cls(secrets.token_bytes(SECRET_BYTES))

    @classmethod
    def from_bytes(cls, secret: bytes) -> "WatermarkKey":
        return cls(secret)

    @classmethod
    def from_file(cls, path: str | os.PathLike, allow_shared: bool = False) -> "WatermarkKey":
        """Read a key file: 64 hexadecimal digits (what ``save`` / ``watermark keygen`` write;
        surrounding whitespace ignored) or exactly 32 raw bytes. As ssh does with private keys,
        a file that its group or others may read is refused (``allow_shared``: read it anyway)."""
        path = Path(path).expanduser()
        try:
            with open(path, "rb") as f:
                mode = os.fstat(f.fileno()).st_mode
                data = f.read()
        except OSError as exc:
            raise WatermarkKeyError(f"cannot read watermark key file {str(path)!r}: "
                                    f"{exc.strerror or type(exc).__name__}") from None
        if os.name == "posix" and mode & 0o077 and not allow_shared:
            raise WatermarkKeyError(
                f"watermark key file {str(path)!r} is readable by its group or others (mode "
                f"{stat.S_IMODE(mode):04o}): a watermark key is a secret; run `chmod 600 "
                f"{path}` (or pass allow_shared=True / --watermark-key-allow-shared to read it "
                "anyway)")
        text = data.strip()
        if len(text) == 2 * SECRET_BYTES:
            try:
                return cls(bytes.fromhex(text.decode("ascii")))
            except (UnicodeDecodeError, ValueError):
                pass
        if len(data) == SECRET_BYTES:
            return cls(data)
        raise WatermarkKeyError(f"watermark key file {str(path)!r} must hold 64 hexadecimal "
                                f"digits or {SECRET_BYTES} raw bytes (make one with "
                                "`dflash2rt watermark keygen --out FILE`)")

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write the key as 64 hex digits + newline, readable by the owner only (mode 0600,
        whatever was at ``path`` before), atomically: a new file in the same folder, then
        renamed over ``path`` (``overwrite``) or linked to it (else an existing file is kept)."""
        path = Path(path).expanduser()
        if path.exists() and not overwrite:
            raise WatermarkKeyError(f"{str(path)!r} exists; refusing to overwrite a key "
                                    "(choose another path or delete it first)")
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self._secret.hex() + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)                    # whatever the umask did
            if overwrite:
                os.replace(tmp, path)
            else:
                os.link(tmp, path)                  # fails if the path appeared meanwhile
        except FileExistsError:
            raise WatermarkKeyError(f"{str(path)!r} exists; refusing to overwrite a key "
                                    "(choose another path or delete it first)") from None
        except OSError as exc:
            raise WatermarkKeyError(f"cannot write watermark key file {str(path)!r}: "
                                    f"{exc.strerror or type(exc).__name__}") from None
        finally:
            if tmp.exists():
                tmp.unlink()
        return path

    def _derive(self, label: bytes, size: int) -> bytes:
        return hashlib.blake2b(_LABEL + label, key=self._secret, digest_size=size).digest()

    def subkey(self, name: str) -> SubKey:
        """Subkey "A" (draft), "B" (target) or "C" (acceptance coin)."""
        try:
            return self._subkeys[name]
        except KeyError:
            raise WatermarkKeyError(f"no subkey {name!r}; use 'A', 'B' or 'C'") from None

    @property
    def draft(self) -> SubKey:
        return self._subkeys[DRAFT]

    @property
    def target(self) -> SubKey:
        return self._subkeys[TARGET]

    @property
    def coin(self) -> SubKey:
        return self._subkeys[COIN]

    @property
    def fingerprint(self) -> str:
        """16 hex digits identifying the key (one-way: says nothing about the secret)."""
        return self._derive(b"fingerprint", 8).hex()

    def __repr__(self) -> str:
        return f"WatermarkKey(fingerprint={self.fingerprint})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WatermarkKey) and hmac.compare_digest(self._secret, other._secret)

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __copy__(self) -> "WatermarkKey":
        return self                                   # immutable

    def __deepcopy__(self, memo: dict) -> "WatermarkKey":
        return self

    def __reduce__(self):
        raise TypeError("WatermarkKey is a secret and is not pickled; pass the key file path")


class SubKeyWords:
    """One subkey's words (k0, k1, word) as 0-d int64 tensors of a device tensor: what a
    captured step reads from its inputs, so that one graph serves every key (a Python int
    would be baked into the graph at capture). Same attributes as ``SubKey``; its repr names
    the domain, never the bits."""

    __slots__ = ("name", "words")

    def __init__(self, name: str, words: torch.Tensor) -> None:
        self.name, self.words = name, words                # [3] int64: k0, k1, word

    @property
    def k0(self) -> torch.Tensor:
        return self.words[0]

    @property
    def k1(self) -> torch.Tensor:
        return self.words[1]

    @property
    def word(self) -> torch.Tensor:
        return self.words[2]

    def __repr__(self) -> str:
        return f"SubKeyWords({self.name})"

    __str__ = __repr__


class KeyWords:
    """A key's three subkeys from one int64 tensor [9] (``words_of``): ``draft`` / ``target``
    / ``coin`` as ``WatermarkKey`` has them. Built by a graph body from its static inputs; it
    is never printed (its repr holds no bits) and never part of any stats."""

    __slots__ = ("draft", "target", "coin")

    def __init__(self, words: torch.Tensor) -> None:
        self.draft, self.target, self.coin = (SubKeyWords(n, words[i:i + 3])
                                              for n, i in ((DRAFT, 0), (TARGET, 3), (COIN, 6)))

    def __repr__(self) -> str:
        return "KeyWords(<secret>)"

    __str__ = __repr__


def words_of(key: WatermarkKey, device: torch.device | str) -> torch.Tensor:
    """int64 [9]: the draft, target and coin subkeys' (k0, k1, word) on ``device``."""
    return torch.tensor([w for s in (key.draft, key.target, key.coin)
                         for w in (s.k0, s.k1, s.word)], dtype=torch.int64, device=device)
