"""The host side of a run's tokens: the Collector (stop tokens, stop strings, streaming,
constraint trackers), dropping finished requests from the batch, and the masks of generic
constraint hooks that are built on the host (``host_masks``, ``verify_masks``)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..constraints.host import ConstraintTracker, block_masks
from ..models.tokenizer import TextTokenizer
from .request import Request, RequestOutput, stop_at, stop_cut
from .state import BatchState
from .stats import RunStats

CONTEXT = 4    # prompt tokens an output is decoded after, for tokenizers whose text depends on it


def output_text(tokenizer, prompt: Sequence[int], ids: Sequence[int]) -> str:
    """The text ``ids`` add after ``prompt``: decoded after the prompt's last ``CONTEXT``
    tokens, less their own text (a SentencePiece "▁" token decodes to a space only after
    another token); ``decode(ids)`` where the context's text is not a prefix of the whole."""
    return OutputText(tokenizer, prompt)(ids)


class OutputText:
    """``output_text`` for one prompt, called again as its output grows: the context and its
    text are worked out once, so each call decodes once."""

    def __init__(self, tokenizer, prompt: Sequence[int]) -> None:
        self.tokenizer, self.ctx = tokenizer, list(prompt[-CONTEXT:])
        self.head = tokenizer.decode(self.ctx) if self.ctx else None

    def __call__(self, ids: Sequence[int]) -> str:
        if self.head is None:
            return self.tokenizer.decode(list(ids))
        full = self.tokenizer.decode(self.ctx + list(ids))
        return (full[len(self.head):] if full.startswith(self.head) else
                self.tokenizer.decode(list(ids)))


class Collector:
    """``vocab``: the target's vocabulary, for the requests' constraint trackers (one per
    constrained request: where it reaches a dead end, and a generic hook's next mask).
    ``on_tokens(i, ids)``: each request's new tokens as they are kept; ``on_finish(i)``: once
    per request, when it gets its finish reason (after its last ``on_tokens``)."""

    def __init__(self, requests: Sequence[Request], tokenizer: TextTokenizer | None,
                 eos: Sequence[int], on_tokens: Callable[[int, list[int]], None] | None,
                 vocab: int | None = None,
                 on_finish: Callable[[int], None] | None = None) -> None:
        self.requests, self.tokenizer, self.eos = requests, tokenizer, tuple(eos)
        self.on_tokens, self.on_finish = on_tokens, on_finish
        self.outputs = [RequestOutput(q.prompt_ids) for q in requests]
        self.trackers = {i: ConstraintTracker(q.params.constraint, vocab)
                         for i, q in enumerate(requests) if q.params.constraint is not None}
        if tokenizer is None and any(q.params.stop_strings for q in requests):
            from ..errors import InvalidInputError
            raise InvalidInputError("stop_strings need a tokenizer; this model pair has none")

    def done(self, i: int) -> bool:
        return bool(self.outputs[i].finish_reason)

    def remaining(self, rows: Sequence[int]) -> list[int]:
        """Tokens each request may still emit (``max_new_tokens`` minus those it has): the
        adaptive schedule's horizon (a stop may end a request earlier)."""
        return [max(self.requests[i].params.max_new_tokens - len(self.outputs[i].token_ids), 1)
                for i in rows]

    def add(self, i: int, tokens: list[int],
            logprobs: list[tuple[float, dict[int, float]]] | None = None) -> None:
        """Append a step's committed tokens to request i, truncating at any stop condition;
        ``logprobs`` (one per token, for a request that asked for them) are kept alongside."""
        o, params = self.outputs[i], self.requests[i].params
        before, was_done = len(o.token_ids), bool(o.finish_reason)
        o.token_ids.extend(tokens)
        if params.logprobs is not None:
            if logprobs is None or len(logprobs) != len(tokens):
                raise RuntimeError(f"request {i} asked for logprobs but the step returned "
                                   f"{None if logprobs is None else len(logprobs)} for "
                                   f"{len(tokens)} tokens")
            o.logprobs = (o.logprobs or []) + [lp for lp, _ in logprobs]
            o.top_logprobs = (o.top_logprobs or []) + [top for _, top in logprobs]
        hit = stop_at(o.token_ids, params, self.eos)
        if hit is not None:
            del o.token_ids[hit[0]:]
            o.finish_reason = hit[1]
        if i in self.trackers:                             # dead end: the last token
            k = self.trackers[i].feed(o.token_ids[before:])
            if k is not None:
                del o.token_ids[before + k:]
                o.finish_reason = "constraint" if self.trackers[i].complete() \
                    else "constraint_unsatisfiable"
        if params.stop_strings:
            self._stop_strings(o, params.stop_strings, before)
        if o.logprobs is not None:                         # cut where the tokens were cut
            del o.logprobs[len(o.token_ids):], o.top_logprobs[len(o.token_ids):]
        if self.on_tokens is not None and len(o.token_ids) > before:
            self.on_tokens(i, o.token_ids[before:])
        if self.on_finish is not None and o.finish_reason and not was_done:
            self.on_finish(i)

    def next_mask(self, i: int) -> np.ndarray | None:
        """Request i's generic constraint hook's mask for its next token (None: it has no
        generic hook; token automata mask on the device)."""
        t = self.trackers.get(i)
        return None if t is None or t.table else t.mask

    def _stop_strings(self, o: RequestOutput, stops: Sequence[str], before: int) -> None:
        """Cut at the shortest new prefix whose text holds a stop string. Every prefix is
        decoded, as target-only decoding (one token a step) does: a prefix's text need not be
        a prefix of the longer text (byte fallback: "\\ufffd" then "é"), so the whole block's
        text alone could miss a stop that one token at a time would have hit."""
        text_of = OutputText(self.tokenizer, o.prompt_ids)
        for k in range(before + 1, len(o.token_ids) + 1):
            text = text_of(o.token_ids[:k])
            if any(s in text for s in stops):
                del o.token_ids[k:]
                o.finish_reason = "stop_string"
                return

    def finish(self) -> list[RequestOutput]:
        for o, q in zip(self.outputs, self.requests):
            if self.tokenizer is not None:
                o.text = output_text(self.tokenizer, o.prompt_ids, o.token_ids)
                cut = stop_cut(o.text, q.params.stop_strings,
                               q.params.include_stop_str_in_output)
                if o.finish_reason == "stop_string" and cut is not None:
                    o.text = o.text[:cut]
        return self.outputs


def drop_finished(st: BatchState, out: Collector) -> BatchState:
    alive = [i for i, row in enumerate(st.rows) if not out.done(row)]
    return st.retain(alive)


def verify_masks(st: BatchState, out: Collector, stats: RunStats, block: int,
                 count: bool = True) -> Callable[[dict], None] | None:
    """Generic constraint hooks in a speculative step: a ``Runner.step`` callback that copies
    the step's drafts to the host (one more device→host round trip, counted in ``syncs`` and
    ``constraint_host_masks``) and sets every verify row's mask, row j with the hook's state
    after d_1..d_j (``constraints.host.block_masks``); None when the batch has no such hook.
    ``count`` False: a calibration step's (its syncs are not the run's decode syncs)."""
    c = st.constraint
    if block < 2 or c is None or c.host_mask is None:
        return None

    def between(drafted: dict) -> None:
        drafts = drafted["draft"].tolist()                  # the extra round trip
        if count:
            stats.syncs += 1
            stats.constraint_host_masks += 1
        masks = np.ones((st.size, block, c.host_mask.shape[1]), bool)
        for i, row in enumerate(st.rows):
            tracker = out.trackers.get(row)
            if tracker is not None and not tracker.table:
                masks[i] = block_masks(tracker, drafts[i])
        c.set_host_block_(masks)
    return between


def host_masks(st: BatchState, out: Collector, stats: RunStats) -> None:
    """Generic constraint hooks: their masks for the next token (a target-only step's row, a
    speculative step's row 0), built
    on the host from the tokens it already has, copied to the device — one host round trip per
    step, counted in ``stats.constraint_host_masks``. Token automata need none of this."""
    if st.size and st.constraint is not None and st.constraint.host_mask is not None:
        st.constraint.set_host_masks_([out.next_mask(row) for row in st.rows])
        stats.constraint_host_masks += 1
