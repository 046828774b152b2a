"""A scripted ``time.perf_counter`` for tests that check the seconds a module reports: it moves
only when a test (or a stand-in it installs) says so, never with the machine's speed."""

from __future__ import annotations

import time
import types


class Clock:
    """``now`` moves when told (``clock.now += s``) and by ``tick`` at each reading."""

    def __init__(self, now: float = 1000.0, tick: float = 0.0) -> None:
        self.now, self.tick = now, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now

    def time_module(self) -> types.SimpleNamespace:
        """The ``time`` module with this clock as its ``perf_counter``."""
        out = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time)
                                       if not k.startswith("_")})
        out.perf_counter = self
        return out

    def install(self, monkeypatch, *modules) -> "Clock":
        """Every module's ``time`` replaced by ``time_module()``; → self."""
        for mod in modules:
            monkeypatch.setattr(mod, "time", self.time_module())
        return self


class Readings:
    """A clock that reads ``first`` once and ``then`` at every later reading: the start and the
    end of code that times itself with two readings."""

    def __init__(self, first: float, then: float) -> None:
        self.first, self.then, self.n = first, then, 0

    def __call__(self) -> float:
        self.n += 1
        return self.first if self.n == 1 else self.then
