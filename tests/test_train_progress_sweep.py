"""The training progress printer (``dflash2rt.train.progress``) against hand-written lines: its
clock is a fake one (tests/fake_clock.py) that moves only when a test says so, and each expected
line (the step, the metrics, tok/s over the window since the last line, elapsed, ETA) is worked
out by hand, as are ``fmt_s``'s strings at the edges of its three forms."""

from __future__ import annotations

import io

import pytest

from dflash2rt.train import progress
from dflash2rt.train.progress import Progress, fmt_s

from fake_clock import Clock


class FlushLog(io.StringIO):
    """A stream that records what it held at each flush."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[str] = []

    def flush(self) -> None:
        super().flush()
        self.flushed.append(self.getvalue())


@pytest.mark.parametrize("seconds, text", [
    (0.0, "0.0s"), (3.44, "3.4s"), (59.9, "59.9s"),
    (60.0, "1m00s"), (61.0, "1m01s"), (123.0, "2m03s"), (123.4, "2m03s"), (123.6, "2m04s"),
    (3599.0, "59m59s"), (3599.6, "1h00m00s"), (3600.0, "1h00m00s"), (3723.0, "1h02m03s"),
    (36000.0 + 5 * 60 + 7, "10h05m07s"),
])
def test_fmt_s_forms(seconds, text):
    """Under a minute: seconds to one decimal; then whole seconds (rounded) as m:ss, and from an
    hour on as h:mm:ss."""
    assert fmt_s(seconds) == text


def _clocked(monkeypatch) -> Clock:
    return Clock(now=1000.0).install(monkeypatch, progress)


def test_lines_at_every_nth_step_and_the_last(monkeypatch):
    """every 2, total 5: lines after steps 2, 4 and 5; each step one second on the clock.
    tok/s is the window's tokens over the window's seconds, elapsed from construction, and
    ETA = elapsed / i * (total - i)."""
    clock = _clocked(monkeypatch)
    out = FlushLog()
    p = Progress("draft", 5, every=2, stream=out)
    for i, tokens in enumerate((10, 20, 30, 40, 50), start=1):
        clock.now += 1.0
        p.step(i, tokens, loss=1.5 / i, acc=0.25)
    assert out.getvalue().splitlines() == [
        "[draft] step 2/5 loss 0.7500 acc 0.2500 tok/s 15 elapsed 2.0s eta 3.0s",
        "[draft] step 4/5 loss 0.3750 acc 0.2500 tok/s 35 elapsed 4.0s eta 1.0s",
        "[draft] step 5/5 loss 0.3000 acc 0.2500 tok/s 50 elapsed 5.0s eta 0.0s",
    ]
    assert p.tokens == 150
    assert len(out.flushed) == 3 and out.flushed[-1] == out.getvalue()   # each line flushed


def test_eta_and_elapsed_in_minutes(monkeypatch):
    """Step 30 of 100 at 90 s: tok/s = 3000 tokens / 90 s, ETA = 90 / 30 * 70 = 210 s."""
    clock = _clocked(monkeypatch)
    out = io.StringIO()
    p = Progress("target", 100, every=30, stream=out)
    for i in range(1, 31):
        clock.now += 3.0
        p.step(i, 100)
    assert out.getvalue() == "[target] step 30/100  tok/s 33 elapsed 1m30s eta 3m30s\n"
    clock.now += 4.5
    assert p.elapsed() == 94.5


def test_default_every_is_ten(monkeypatch):
    clock = _clocked(monkeypatch)
    out = io.StringIO()
    p = Progress("p", 25, stream=out)
    for i in range(1, 26):
        clock.now += 1.0
        p.step(i, 1)
    assert [line.split()[2] for line in out.getvalue().splitlines()] == [
        "10/25", "20/25", "25/25"]


@pytest.mark.parametrize("every", [0, 1, -3])
def test_every_below_one_means_every_step(monkeypatch, every):
    clock = _clocked(monkeypatch)
    out = io.StringIO()
    p = Progress("p", 3, every=every, stream=out)
    for i in range(1, 4):
        clock.now += 2.0
        p.step(i, 4)
    assert out.getvalue().splitlines() == [
        f"[p] step {i}/3  tok/s 2 elapsed {2 * i}.0s eta {2 * (3 - i)}.0s" for i in (1, 2, 3)]


def test_a_window_of_no_seconds_divides_by_a_nanosecond(monkeypatch):
    """The clock has not moved since the last line: tok/s is tokens / 1e-9, not an error."""
    _clocked(monkeypatch)
    out = io.StringIO()
    Progress("p", 1, stream=out).step(1, 3)
    assert out.getvalue() == "[p] step 1/1  tok/s 3000000000 elapsed 0.0s eta 0.0s\n"


def test_default_stream_is_stderr(monkeypatch, capsys):
    _clocked(monkeypatch)
    p = Progress("recipe", 1)
    p.log("corpus done")
    p.step(1, 0)
    got = capsys.readouterr()
    assert got.out == ""
    assert got.err.splitlines() == ["[recipe] corpus done",
                                    "[recipe] step 1/1  tok/s 0 elapsed 0.0s eta 0.0s"]


def test_log_prefixes_the_phase_and_flushes():
    out = FlushLog()
    Progress("gen", 1, stream=out).log("42 continuations")
    assert out.flushed == ["[gen] 42 continuations\n"]
