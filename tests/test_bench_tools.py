"""``dflash2rt bench TOOL``: each tool parses to its own command while plain ``bench`` keeps its
own, and the pure helpers behind the tools."""

from __future__ import annotations

import pytest

from dflash2rt.bench.watermark import fill_nulls
from dflash2rt.cli import build_parser
from dflash2rt.cli import bench_cmd
from dflash2rt.train.heldout import per_slot


def test_plain_bench_keeps_its_command_and_options():
    args = build_parser().parse_args(["bench", "--json", "--repeats", "2"])
    assert args.func is bench_cmd.run and args.tool is None and args.json and args.repeats == 2


@pytest.mark.parametrize("tool, argv, attr, value", [
    ("heldout", ["--max-new-tokens", "16"], "max_new_tokens", 16),
    ("sampling", ["--prompts", "2", "--repeats", "1"], "prompts", 2),
    ("watermark", ["--docs", "4", "--block-size", "8"], "block_size", 8),
    ("tp-equivalence", ["--tp", "3", "--token-prompts"], "tp", 3),
    ("ablation", ["--quick", "--batches", "1,4"], "batches", "1,4"),
    ("step-profile", ["--backend", "cuda"], "backend", "cuda"),
])
def test_each_tool_parses_to_its_own_command(tool, argv, attr, value):
    args = build_parser().parse_args(["bench", tool, *argv, "--json-out", "f.json"])
    assert args.tool == tool and args.func is not bench_cmd.run
    assert args.func.__module__ == "dflash2rt.cli.bench_tools"
    assert getattr(args, attr) == value and args.json_out == "f.json" and not args.json


def test_per_slot_acceptance_from_an_accept_histogram():
    # 10 steps: 2 accepted nothing, 3 one draft, 5 all three (block 4)
    assert per_slot([2, 3, 0, 5], 4) == [8 / 10, 5 / 8, 5 / 5]
    assert per_slot([4], 3) == [0.0, 0.0]            # padded; unreached slots are 0


def test_null_texts_are_topped_up_with_consecutive_chunks():
    nulls = [[9, 9]]
    fill_nulls(nulls, iter([[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11]]), 2, 4)
    assert nulls == [[9, 9], [1, 2], [3, 4], [6, 7]]
    full = [[0]] * 3
    fill_nulls(full, iter([[1, 2]]), 2, 3)
    assert full == [[0]] * 3
