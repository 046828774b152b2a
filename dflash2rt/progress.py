"""``LLM.generate``'s progress bar (vLLM's ``use_tqdm``): the prompts processed, updated as each
request ends, with the output tokens per second so far."""

from __future__ import annotations

import time
from typing import Any, Callable

from .errors import InvalidInputError, MissingExtraError

DESC = "Processed prompts"


def bar_factory(use_tqdm: object) -> Callable[..., Any] | None:
    """None for ``use_tqdm=False``; ``tqdm.tqdm`` for True; a callable as given (vLLM: a tqdm
    class or a function taking tqdm's keyword arguments)."""
    if use_tqdm is False:
        return None
    if use_tqdm is True:
        try:
            from tqdm import tqdm
        except ImportError as exc:
            raise MissingExtraError("use_tqdm=True needs tqdm: pip install tqdm (or pass "
                                    "use_tqdm=False)") from exc
        return tqdm
    if callable(use_tqdm) and not isinstance(use_tqdm, (int, float)):
        return use_tqdm
    raise InvalidInputError(f"use_tqdm must be True, False or a callable that makes a tqdm "
                            f"bar, got {use_tqdm!r}")


class Progress:
    """One call's bar: ``tokens(i, ids)`` counts output tokens, ``finish(i)`` moves the bar by
    one prompt; ``close()`` ends it (whatever happened)."""

    def __init__(self, factory: Callable[..., Any], total: int,
                 on_tokens: Callable[[int, list[int]], None] | None = None) -> None:
        if on_tokens is not None and not callable(on_tokens):
            raise InvalidInputError(f"on_tokens must be None or a callable on_tokens(i, ids), "
                                    f"got {type(on_tokens).__name__}")
        self.bar = factory(total=total, desc=DESC, dynamic_ncols=True)
        self.inner, self.out_tokens, self.t0 = on_tokens, 0, time.perf_counter()

    def tokens(self, i: int, ids: list[int]) -> None:
        self.out_tokens += len(ids)
        if self.inner is not None:
            self.inner(i, ids)

    def finish(self, i: int) -> None:
        seconds = time.perf_counter() - self.t0
        rate = self.out_tokens / seconds if seconds > 0 else 0.0
        self.bar.set_postfix_str(f"est. speed output: {rate:.2f} toks/s", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
