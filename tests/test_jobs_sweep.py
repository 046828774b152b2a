"""What the engine thread hands the HTTP side is a value and a job is itself: an ``Event``
cannot change once sent (two alike are equal), two jobs with the same request are two
jobs (each hashable, equal only to itself), so a scheduler's sets and lookups never mistake
one request for another."""

from __future__ import annotations

import dataclasses

import pytest

from dflash2rt.engine.request import Request
from dflash2rt.serve.jobs import Event, Job


def test_an_event_cannot_change_once_made():
    e = Event("tokens", [1, 2], [-0.5, -0.25])
    for name, value in (("kind", "done"), ("tokens", [3]), ("logprobs", None)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(e, name, value)
    assert (e.kind, e.tokens, e.logprobs) == ("tokens", [1, 2], [-0.5, -0.25])
    assert Event("done") == Event("done") != Event("aborted")


def test_two_jobs_of_one_request_are_two_jobs():
    request, sink = Request((1, 2)), print
    a, b = Job(request, sink, arrival=1.0), Job(request, sink, arrival=1.0)
    assert a == a and a != b and not (a == b)
    assert len({a, b}) == 2 and {a: 1, b: 2}[a] == 1
    assert [a, b].index(b) == 1
