"""``dflash2rt run``'s progress: the streamed text of one prompt, held back wherever a stop
string could still begin, or a token count."""

from __future__ import annotations

import sys
from typing import Callable


class Progress:
    """Streams the text of a single prompt to stdout; counts tokens on stderr otherwise.

    The prompt is echoed with the first tokens (the run has passed validation by then), and the
    tail that could still be the start of a stop string is held back, so that stdout ends up
    exactly prompt + the API's text (``finish``)."""

    def __init__(self, tokenizer, stream_text: bool, prompt: Callable[[], str],
                 stops: list[str], prompt_ids: Callable[[], list[int]] = list,
                 include_stop: bool = False) -> None:
        self.tokenizer, self.stream_text = tokenizer, stream_text and tokenizer is not None
        self.prompt, self.stops, self.include_stop = prompt, stops, include_stop
        self.prompt_ids = prompt_ids
        self.ids: list[int] = []
        self.shown: str | None = None            # None: not even the prompt is out yet

    def _write(self, text: str) -> None:
        if self.shown is None:
            sys.stdout.write(self.prompt())
            self.shown = ""
        if text.startswith(self.shown):
            sys.stdout.write(text[len(self.shown):])
            self.shown = text
        sys.stdout.flush()

    def __call__(self, i: int, ids: list[int]) -> None:
        self.ids += ids
        if self.stream_text:
            from ..engine.output import output_text

            text = output_text(self.tokenizer, self.prompt_ids(), self.ids)   # as the API's
            if text.endswith("\ufffd"):        # an incomplete UTF-8 sequence: wait for more
                return
            self._write(text[:safe_len(text, self.stops, self.include_stop)])
        else:
            print(f"\r{len(self.ids)} tokens generated", end="", file=sys.stderr, flush=True)

    def finish(self, text: str) -> None:
        self._write(text)
        sys.stdout.write("\n")


def safe_len(text: str, stops: list[str], include: bool = False) -> int:
    """Length of the prefix of ``text`` no stop string can still reach into: where the API's
    text ends once a stop string occurs (``request.stop_cut``, the one rule), or else all but
    the longest tail that begins some stop string."""
    from ..engine.request import stop_cut

    cut = stop_cut(text, stops, include)
    if cut is not None:         # the request has stopped: the API's text ends right there
        return cut
    return len(text) - max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])),
                           default=0)
