"""``build_server`` and ``run_server`` at the far ends of their numeric options, over the
stand-ins of test_serve_init_sweep.py: a KV budget near the largest float keeps the batch asked
for (its bytes do not overflow into NaN), an int too large for a float is refused as an option
like infinity is, and the wait for the HTTP side after the drain is ``drain_timeout`` + 10 s,
capped at the longest wait a thread can take (instead of an OverflowError after serving)."""

from __future__ import annotations

import sys
import threading

import pytest

from dflash2rt.errors import InvalidInputError
from dflash2rt.serve import check_drain_timeout, check_options, run_server

from test_serve_init_sweep import HTTP, Engine, Rig, fake_pair, row_bytes
from test_serve_init_sweep import uvicorn_stand_in  # noqa: F401 - a fixture used below

GOOD = {"max_num_seqs": 4, "max_model_len": None, "max_queue": 0, "kv_cache_gib": None,
        "served_model_name": None, "api_key": None, "stream_interval": 1}


@pytest.mark.parametrize("budget", [1e300, sys.float_info.max, 10 ** 300, 2.0 ** 1000],
                         ids=["huge-1e300", "huge-max", "huge-int", "huge-2**1000"])
def test_a_budget_near_the_largest_float_keeps_the_batch_asked_for(monkeypatch, budget):
    pair = fake_pair()
    rows = 300 + 8 + 1
    got = Rig(monkeypatch, pair).build(max_model_len=300, max_num_seqs=5, kv_cache_gib=budget)
    assert got["slots"] == 5 and got["bytes"] == 5 * rows * row_bytes(pair, True)


def test_a_budget_of_whole_slots_holds_them_all(monkeypatch):
    pair = fake_pair()
    per = (300 + 8 + 1) * row_bytes(pair, True)
    rig = Rig(monkeypatch, pair)
    for slots in (1, 2, 3, 7):                       # exactly that many slots' bytes
        assert rig.build(max_model_len=300, kv_cache_gib=slots * per / 2**30)["slots"] == slots
    assert rig.build(max_model_len=300, kv_cache_gib=3)["slots"] == 16      # an int budget


@pytest.mark.parametrize("value", [10 ** 400, -10 ** 400], ids=["huge-int", "huge-negative"])
def test_an_int_too_large_for_a_float_is_refused_with_the_options_error(value):
    with pytest.raises(InvalidInputError) as info:
        check_options(**{**GOOD, "kv_cache_gib": value})
    assert str(info.value) == f"kv_cache_gib must be a number of GiB > 0, got {value!r}"
    with pytest.raises(InvalidInputError) as info:
        check_drain_timeout(value)
    assert str(info.value) == f"drain_timeout must be a number of seconds >= 0, got {value!r}"
    check_options(**{**GOOD, "kv_cache_gib": 10 ** 300})           # within a float: a budget
    check_drain_timeout(10 ** 300)


class Joined(threading.Thread):
    """A thread that records the timeouts it was joined with."""

    timeouts: list = []

    def join(self, timeout=None) -> None:
        Joined.timeouts.append(timeout)
        super().join(timeout)


@pytest.mark.parametrize("drain, wait", [
    (0.0, 10.0), (2.5, 12.5), (1e300, threading.TIMEOUT_MAX), (10 ** 300, threading.TIMEOUT_MAX),
    (threading.TIMEOUT_MAX - 10, threading.TIMEOUT_MAX)],
    ids=["0", "2.5", "huge-float", "huge-int", "longest"])
def test_the_http_side_is_waited_for_the_drain_and_10_s_more(uvicorn_stand_in, monkeypatch,
                                                              drain, wait):
    monkeypatch.setattr(threading, "Thread", Joined)
    Joined.timeouts = []
    run_server(Engine(), port=0, drain_timeout=drain)
    (http,) = HTTP.made
    assert http.config.timeout_graceful_shutdown == drain and http.seen["finished"]
    assert Joined.timeouts == [wait]
