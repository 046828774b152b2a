"""The bench's arguments are checked before anything is timed: each wrong one, alone, is an
InvalidInputError naming it (the CLI prints it and exits 2), never a ZeroDivisionError or an
index error from an empty measurement."""

from __future__ import annotations

import math

import pytest

from dflash2rt.bench.costs import alpha_for, measure_costs
from dflash2rt.bench.suite import parse_temperatures, run_bench
from dflash2rt.bundled import bundled_path
from dflash2rt.cli import main
from dflash2rt.errors import InvalidInputError

GOOD = dict(max_new=4, repeats=1, blocks=(2, 4), n_prompts=1)


@pytest.mark.parametrize("name, value", [
    ("max_new", 0), ("max_new", 2.0), ("repeats", 0), ("repeats", -1), ("repeats", True),
    ("n_prompts", 0), ("n_prompts", "8"), ("blocks", ()), ("blocks", (1,)), ("blocks", (8, 1)),
    ("blocks", (0,)), ("blocks", (4.0,)),
])
def test_run_bench_refuses_each_argument_alone(name, value):
    kw = {**GOOD, name: value}
    with pytest.raises(InvalidInputError, match=name):
        run_bench(None, bundled_path("stdlib-code"), "cpu", kw["max_new"], kw["repeats"],
                  kw["blocks"], kw["n_prompts"], with_hf=False)


@pytest.mark.parametrize("text", ["x", "0,x", "0,1:x", "0,:0.5", "0,1:"])
def test_temperatures_that_are_not_numbers(text):
    if text == "0,1:":
        assert [t.top_p for t in parse_temperatures(text)] == [1.0, 1.0]   # empty top-p: off
        return
    with pytest.raises(InvalidInputError, match="temperatures take T or T:TOP_P"):
        parse_temperatures(text)


@pytest.mark.parametrize("text", ["-1", "0,-0.5", "inf", "nan", "1:0", "1:1.5", "1:-0.1",
                                  "1:nan"])
def test_temperatures_outside_their_domain(text):
    with pytest.raises(InvalidInputError, match="T must be a finite number >= 0 and top-p"):
        parse_temperatures(text)


def test_temperatures_at_their_edges():
    got = parse_temperatures("0,1e-9:1,5:1e-9,2:1")
    assert [(t.temperature, t.top_p) for t in got] == [(0.0, 1.0), (1e-9, 1.0), (5.0, 1e-9),
                                                       (2.0, 1.0)]


@pytest.mark.parametrize("name, value", [
    ("blocks", []), ("blocks", [0]), ("contexts", [0]), ("contexts", [64, -1]),
    ("batches", [0, 1]), ("batches", [1.0]), ("reps", 0),
])
def test_measure_costs_refuses_each_argument_alone(name, value):
    from dflash2rt.models.pair import load_pair

    root = bundled_path("stdlib-code")
    pair = load_pair(root / "target", root / "draft")
    kw = dict(blocks=[2], contexts=[16], batches=[1], reps=1)
    kw[name] = value
    with pytest.raises(InvalidInputError, match=f"{name} must be integers >= 1"):
        measure_costs(pair, "cpu", **kw)


@pytest.mark.parametrize("tau", [0.5, 0.99, 16.01, math.nan, math.inf])
def test_tau_outside_one_to_the_block(tau):
    with pytest.raises(InvalidInputError, match="tau must be in \\[1, 16\\]"):
        alpha_for(tau, 16)
    assert 0 <= alpha_for(1.0, 16) < 1e-9 and alpha_for(16.0, 16) > 1 - 1e-9


@pytest.mark.parametrize("args, message", [
    (["--prompts", "0"], "n_prompts must be"), (["--blocks", "8,x"], "--blocks takes integers"),
    (["--temperatures", "0,x"], "temperatures take"),
    (["--costs", "--contexts", "16,x"], "--contexts takes integers"),
    (["--costs", "--batches", "0"], "batches must be integers >= 1"),
])
def test_the_cli_says_what_to_fix(capsys, args, message):
    assert main(["bench", "--backend", "cpu", "--no-hf", *args]) == 2
    err = capsys.readouterr().err
    assert "InvalidInputError" in err and message in err and "Traceback" not in err
