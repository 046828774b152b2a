"""Config dicts changed one key at a time: ``DROP`` removes a key, any other value sets it."""

from __future__ import annotations

DROP = object()


def apply(d: dict, changes: dict) -> dict:
    """``d`` with ``changes`` applied in place (``DROP``: the key removed); → ``d``."""
    for k, v in changes.items():
        if v is DROP:
            d.pop(k, None)
        else:
            d[k] = v
    return d
