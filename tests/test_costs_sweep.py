"""The cost model's arithmetic and bookkeeping (``bench/costs.py``) with every measurement
replaced: canned step seconds, a fixed copy bandwidth, a fake clock and a fixed figure of free
memory, so each expected value is worked out by hand (float64 sums for E[L], the K/V bytes as
layers × batch × context × kv heads × head dim × 2 × bytes, exact strings for the table)."""

from __future__ import annotations

import math
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.bench import costs
from dflash2rt.bench.cost_memory import row_memory
from dflash2rt.bench.costs import (alpha_for, copy_bandwidth, expected_len, kv_bytes,
                                   measure_costs, projected_table, step_costs)
from dflash2rt.errors import InvalidInputError
from dflash2rt.models.memory import GB

from tiny_models import tiny_pair

# tiny_pair's target: 3 layers, 2 K/V heads of 8, 512 positions, 34,128 weights (float64)
LAYERS, KV_HEADS, HEAD_DIM, POSITIONS, TARGET_WEIGHTS = 3, 2, 8, 512, 34_128


def series(alpha: float, block: int) -> float:
    """E[L] written out: 1 + α + α² + ... + α^(block-1), a float64 loop."""
    return math.fsum(alpha ** i for i in range(block))


@pytest.fixture(scope="module")
def pair():
    return tiny_pair("dflash2", block=4)


def test_expected_length_is_the_geometric_sum():
    for block in range(1, 17):
        for alpha in (0.0, 0.1, 0.5, 0.9, 0.999):
            assert math.isclose(expected_len(alpha, block), series(alpha, block),
                                rel_tol=1e-12), (alpha, block)
        assert expected_len(1.0, block) == block and expected_len(1.5, block) == block


@pytest.mark.parametrize("tau, block", [(1.0, 4), (3.0, 4), (4.0, 4), (1.5, 2), (6.07, 8)])
def test_alpha_for_inverts_the_sum_within_its_range(tau, block):
    alpha = alpha_for(tau, block)
    assert 0.0 <= alpha <= 1.0
    if tau == block:            # α → 1, where (1 - α^b) / (1 - α) keeps about 8 digits
        assert alpha > 1 - 1e-8 and math.isclose(series(alpha, block), tau, rel_tol=1e-8)
    else:
        assert math.isclose(series(alpha, block), tau, rel_tol=1e-12)
    if tau == 1.0:
        assert alpha < 1e-15


@pytest.mark.parametrize("tau", [1 - 1e-9, 4 + 1e-9, 0.0, 5.0])
def test_alpha_for_refuses_tau_outside_one_to_block(tau):
    with pytest.raises(InvalidInputError, match=r"tau must be in \[1, 4\] for block 4, got "):
        alpha_for(tau, 4)


def fake_clock(monkeypatch, ticks):
    """costs' perf_counter reads ``ticks`` in order (and fails past the end)."""
    it = iter(ticks)
    monkeypatch.setattr(costs, "time", SimpleNamespace(perf_counter=lambda: next(it)))


def test_copy_bandwidth_is_read_plus_write_bytes_over_the_best_copy(monkeypatch):
    """1 MiB of float32 (262,144 elements) copied 3 times taking 0.5, 0.25, 0.375 s: the best
    is 0.25 s, and 2 × 1 MiB moved in it is 0.008388608 GB/s; each copy between two syncs."""
    syncs = []
    monkeypatch.setattr(costs, "sync", syncs.append)
    fake_clock(monkeypatch, [0.0, 0.5, 1.0, 1.25, 2.0, 2.375])
    dev = torch.device("cpu")
    assert copy_bandwidth(dev, mbytes=1, reps=3) == pytest.approx(2 * 2**20 / 0.25 / 1e9,
                                                                  rel=1e-15)
    assert syncs == [dev] * 6


def test_copy_bandwidth_defaults_copy_256_mib_five_times(monkeypatch):
    syncs = []
    monkeypatch.setattr(costs, "sync", syncs.append)
    fake_clock(monkeypatch, [0.0, 4.0, 4.0, 6.0, 6.0, 9.0, 9.0, 10.0, 10.0, 12.0])
    assert copy_bandwidth(torch.device("cpu")) == pytest.approx(2 * 256 * 2**20 / 1.0 / 1e9,
                                                                rel=1e-15)
    assert len(syncs) == 10


def test_kv_bytes_is_every_target_layer_k_and_v(pair):
    for batch, context in ((1, 1), (2, 10), (8, 128)):
        assert kv_bytes(pair, batch, context) == \
            LAYERS * batch * context * KV_HEADS * HEAD_DIM * 2 * 8
    half = tiny_pair("dflash2", block=4, dtype=torch.bfloat16)
    assert kv_bytes(half, 2, 10) == LAYERS * 2 * 10 * KV_HEADS * HEAD_DIM * 2 * 2


# step_costs with the runner's trial replaced: per block, reps + 1 trials (the first a warm-up
# whose seconds are dropped) each filling its clock with the next canned seconds

DRAFT = {1: [90.0, 0.0, 0.0, 0.0, 0.0], 2: [90.0, 4.0, 1.0, 3.0, 2.0],
         4: [90.0, 1.0, 9.0, 5.0, 7.0]}
VERIFY = {1: [90.0, 8.0, 6.0, 7.0, 5.0], 2: [90.0, 2.0, 2.5, 1.5, 3.5],
          4: [90.0, 0.25, 0.75, 0.5, 1.0]}


@contextmanager
def canned_phases(runner, clocks, events):
    def trial(st, block, clock):
        k = sum(1 for e in events if e == ("trial", block))
        events.append(("trial", block))
        clocks[id(clock)] = (clock, {"draft": DRAFT[block][k], "verify": VERIFY[block][k],
                                     "capture": 0.0})
        return 0.0

    runner.trial = trial
    try:
        yield
    finally:
        del runner.trial


class Peer:
    def __init__(self, events):
        self.events, self.layers = events, [SimpleNamespace(keys=None, values=None)]

    def step(self):
        self.events.append("peer step")

    def kv_layers(self):
        return self.layers


@pytest.mark.parametrize("with_peer", [False, True])
def test_step_costs_are_medians_after_one_warm_up(pair, monkeypatch, with_peer):
    """reps 4: the upper median of the 4 timed trials (sorted[2]), per phase; the prefill's
    seconds between the two clock reads; a peer steps once after each target-only trial
    (warm-up included) and its cache moves to fresh memory with ours before any trial."""
    events: list = []
    monkeypatch.setattr(costs, "synced_phases",
                        lambda runner, clocks: canned_phases(runner, clocks, events))
    monkeypatch.setattr(costs, "fresh_placement",
                        lambda st, runner, layers: events.append(("fresh", tuple(layers))))
    fake_clock(monkeypatch, [10.0, 12.5])
    peer = Peer(events) if with_peer else None
    got = step_costs(pair, get_backend("cpu"), 2, 6, [1, 2, 4], reps=4, peer=peer)
    assert got == {0: {"prefill": 2.5}, 1: {"draft": 0.0, "verify": 7.0},
                   2: {"draft": 3.0, "verify": 2.5}, 4: {"draft": 7.0, "verify": 0.75}}
    trials = [("trial", b) for b in (1, 2, 4) for _ in range(5)]
    if with_peer:
        assert events == [("fresh", tuple(peer.layers))] + \
            [e for t in trials[:5] for e in (t, "peer step")] + trials[5:]
    else:
        assert events == trials


def test_step_costs_draws_seeded_prompts_of_the_context(pair, monkeypatch):
    """``batch`` prompts of ``context`` ids drawn from [0, vocab) by a generator seeded with
    ``seed``, each asking for the largest block + 1 new tokens; the prefill reads them."""
    made, prefilled = [], []
    real = costs.Request

    def request(prompt, params):
        made.append((prompt, params.max_new_tokens))
        return real(prompt, params)

    monkeypatch.setattr(costs, "Request", request)
    events: list = []
    monkeypatch.setattr(costs, "synced_phases",
                        lambda runner, clocks: canned_phases(runner, clocks, events))
    real_prefill = costs.Runner.prefill
    monkeypatch.setattr(costs.Runner, "prefill",
                        lambda self, st, prompts: (prefilled.append(list(prompts)),
                                                   real_prefill(self, st, prompts))[1])
    step_costs(pair, get_backend("cpu"), 3, 40, [2, 1], reps=1, seed=7)
    gen = torch.Generator().manual_seed(7)
    want = [tuple(torch.randint(0, 61, (40,), generator=gen).tolist()) for _ in range(3)]
    assert made == [(p, 3) for p in want] and prefilled == [want]
    ids = [t for p in want for t in p]
    assert min(ids) == 0 and max(ids) == 60                  # both ends of [0, vocab) drawn
    made.clear()
    step_costs(pair, get_backend("cpu"), 1, 12, [1], reps=1)          # the default seed: 0
    gen = torch.Generator().manual_seed(0)
    assert made == [(tuple(torch.randint(0, 61, (12,), generator=gen).tolist()), 2)]


# measure_costs with step_costs, the copy bandwidth and the free memory canned

BW = 2.0                                             # GB/s


def canned_steps(calls):
    def fake(pair, backend, batch, context, blocks, reps, peer=None):
        calls.append((batch, context, list(blocks), reps, peer))
        out = {0: {"prefill": 0.125 * batch}, 1: {"draft": 0.0, "verify": 0.5 * batch}}
        for b in blocks:
            if b > 1:
                out[b] = {"draft": 0.0625 * b, "verify": 0.25 * batch + 0.5}
        return out
    return fake


@pytest.fixture
def canned(monkeypatch):
    calls: list = []
    monkeypatch.setattr(costs, "step_costs", canned_steps(calls))
    monkeypatch.setattr(costs, "copy_bandwidth", lambda device: BW)
    return calls


def test_each_row_is_the_co_design_formula_on_canned_seconds(pair, canned):
    logs: list = []
    res = measure_costs(pair, get_backend("cpu"), blocks=(4, 2), contexts=(8, 20),
                        batches=(1, 2), tau=3.0, tau_block=4, reps=2, log=logs.append,
                        available=lambda device: None)
    assert [c[:4] for c in canned] == [(b, c, [1, 2, 4], 2) for b in (1, 2) for c in (8, 20)]
    assert all(c[4] is None for c in canned)
    weights = TARGET_WEIGHTS * 8
    alpha = res["acceptance"]["alpha"]
    assert math.isclose(series(alpha, 4), 3.0, rel_tol=1e-12)
    assert res["acceptance"]["tau"] == 3.0 and res["acceptance"]["tau_block"] == 4
    for b in (1, 2, 4):
        assert math.isclose(res["acceptance"]["expected_len"][b], series(alpha, b),
                            rel_tol=1e-12)
    assert res["copy_bandwidth_gbps"] == BW and res["target_weight_bytes"] == weights
    assert res["draft_weight_bytes"] == sum(p.numel() for p in pair.draft.parameters()) * 8
    assert res["skipped_contexts"] == [] and res["skipped_rows"] == []
    assert (res["backend"], res["device"], res["dtype"]) == ("cpu", "cpu", "torch.float64")
    assert [(r["batch"], r["context"]) for r in res["rows"]] == [(1, 8), (1, 20), (2, 8), (2, 20)]
    for r in res["rows"]:
        batch, context = r["batch"], r["context"]
        t = 0.5 * batch
        moved = weights + LAYERS * batch * context * KV_HEADS * HEAD_DIM * 2 * 8
        assert r["t_target_s"] == t and r["t_prefill_s"] == 0.125 * batch
        assert r["bytes_per_target_step"] == moved
        assert r["estimated_bytes"] == row_memory(pair, batch, context, [1, 2, 4], False,
                                                  None).needed
        assert math.isclose(r["achieved_gbps"], moved / t / 1e9, rel_tol=1e-15)
        assert math.isclose(r["bandwidth_fraction"], moved / t / 1e9 / BW, rel_tol=1e-15)
        assert set(r["blocks"]) == {2, 4} and "transformers" not in r
        for b in (2, 4):
            draft, verify = 0.0625 * b, 0.25 * batch + 0.5
            assert r["blocks"][b] == pytest.approx(
                {"t_draft_s": draft, "t_verify_s": verify,
                 "step_over_target": (draft + verify) / t}, rel=1e-15)
            assert math.isclose(r["projected_speedup"][b],
                                series(alpha, b) * t / (draft + verify), rel_tol=1e-12)
    assert logs[0] == (f"batch 1, context 8: target step 500.00 ms, "
                       f"{(weights + 768 * 8) / 1e9:.3f} GB moved "
                       f"({res['rows'][0]['bandwidth_fraction']:.0%} of 2.0 GB/s)")
    assert res["transformers_prefill_logits"] is None and res["kv_placement"] is None


def test_the_log_line_of_a_row(pair, canned, monkeypatch):
    """Batch 8 at context 500: 273,024 weight bytes + 768 × 8 × 500 K/V bytes = 3,345,024
    bytes moved in a 4 s target step, 0.000836256 GB/s: 84 % of a 0.001 GB/s copy."""
    monkeypatch.setattr(costs, "copy_bandwidth", lambda device: 0.001)
    logs: list = []
    res = measure_costs(pair, get_backend("cpu"), blocks=(2,), contexts=(500,), batches=(8,),
                        reps=1, log=logs.append, available=lambda device: None)
    assert res["rows"][0]["bytes_per_target_step"] == 3_345_024
    assert logs == ["batch 8, context 500: target step 4000.00 ms, 0.003 GB moved "
                    "(84% of 0.0 GB/s)"]


def test_tau_is_read_at_block_16_by_default(pair, canned):
    res = measure_costs(pair, get_backend("cpu"), blocks=(2,), contexts=(8,), batches=(1,),
                        tau=6.0, reps=1, log=lambda m: None, available=lambda device: None)
    acc = res["acceptance"]
    assert acc["tau_block"] == 16 and math.isclose(series(acc["alpha"], 16), 6.0, rel_tol=1e-12)


def test_without_tau_there_is_no_projection(pair, canned):
    res = measure_costs(pair, get_backend("cpu"), blocks=(2,), contexts=(8,), batches=(1,),
                        reps=1, log=lambda m: None, available=lambda device: None)
    assert res["acceptance"] is None and "projected_speedup" not in res["rows"][0]


def test_the_defaults_and_the_last_context_that_fits(pair, canned):
    """Blocks 1, 2, 4, 8, 16, contexts 128, 2048, 8192, batches 1 and 8, 3 reps; a context
    fits while context + the largest block + 1 <= the target's 512 positions."""
    res = measure_costs(pair, get_backend("cpu"), log=lambda m: None,
                        available=lambda device: None)
    assert [c[:4] for c in canned] == [(1, 128, [1, 2, 4, 8, 16], 3),
                                       (8, 128, [1, 2, 4, 8, 16], 3)]
    assert res["skipped_contexts"] == [2048, 8192]
    canned.clear()
    limit = POSITIONS - 16 - 1
    res = measure_costs(pair, get_backend("cpu"), blocks=(16,), contexts=(limit, limit + 1),
                        batches=(1,), reps=1, log=lambda m: None, available=lambda d: None)
    assert [c[1] for c in canned] == [limit] and res["skipped_contexts"] == [limit + 1]


def test_a_row_runs_when_it_needs_exactly_the_memory_free(pair, canned):
    need = row_memory(pair, 1, 8, [1, 2], False, None).needed
    res = measure_costs(pair, get_backend("cpu"), blocks=(2,), contexts=(8,), batches=(1,),
                        reps=1, log=lambda m: None, available=lambda device: need)
    assert len(res["rows"]) == 1 and res["skipped_rows"] == []
    logs: list = []
    res = measure_costs(pair, get_backend("cpu"), blocks=(2,), contexts=(8,), batches=(1,),
                        reps=1, log=logs.append, available=lambda device: need - 1)
    assert res["rows"] == [] and canned == [canned[0]]
    (skip,) = res["skipped_rows"]
    assert logs == [f"batch 1, context 8: skipped: {skip['reason']}"]


@pytest.mark.parametrize("dtype, hint", [(torch.float64, ", or the dtype (bfloat16 halves "
                                                         "float32)"),
                                         (torch.float32, ", or the dtype (bfloat16 halves "
                                                         "float32)"),
                                         (torch.bfloat16, "")])
def test_a_skipped_row_says_what_it_needed_and_what_to_change(canned, dtype, hint):
    small = tiny_pair("dflash2", block=4, dtype=dtype)
    mem = row_memory(small, 2, 8, [1, 2], False, None)
    res = measure_costs(small, get_backend("cpu"), blocks=(2,), contexts=(8,), batches=(2,),
                        reps=1, log=lambda m: None, available=lambda device: 1000)
    assert res["skipped_rows"] == [{
        "batch": 2, "context": 8, "needed_bytes": mem.needed, "ours_alone_bytes": mem.ours_alone,
        "available_bytes": 1000, "peak_at": mem.peak_at, "parts": mem.parts,
        "reason": f"{mem.describe()}, {1000 / GB:.2f} GB available on cpu; lower the batch or "
                  f"the context{hint}, or use a device with more memory"}]


class FakeHF:
    """transformers' side: HFDecode replaced by a recorder whose result is canned."""

    def __init__(self, calls):
        self.model, self.calls = object(), calls

    def decode(self, hf, batch, context, vocab, steps):
        assert hf is self
        self.calls.append(("decode", batch, context, vocab, steps))
        return SimpleNamespace(result=lambda: {"t_step_s": 0.75, "t_prefill_s": 1.5,
                                               "cache": "static", "prompts": [[1]],
                                               "tokens": [[2]]},
                               kv_layers=lambda: [], step=lambda: None)


@pytest.mark.parametrize("keeps", [True, False])
def test_with_transformers_the_row_carries_its_step(pair, canned, monkeypatch, keeps):
    calls: list = []
    hf = FakeHF(calls)
    monkeypatch.setattr(costs, "HFDecode", hf.decode)
    monkeypatch.setattr(costs, "keeps_last_logits", lambda model: keeps)
    res = measure_costs(pair, get_backend("cpu"), blocks=(2,), contexts=(8,), batches=(2,),
                        reps=3, hf=hf, log=lambda m: None, available=lambda device: None)
    assert calls == [("decode", 2, 8, 61, 5)]
    assert canned[0][4] is not None
    (row,) = res["rows"]
    assert row["transformers"] == {"t_step_s": 0.75, "t_prefill_s": 1.5, "cache": "static"}
    assert row["estimated_bytes"] == row_memory(pair, 2, 8, [1, 2], False, 5, keeps).needed
    assert res["transformers_prefill_logits"] == (
        "last row only (logits_to_keep=1)" if keeps else
        "every row: this transformers' forward takes no logits_to_keep")
    assert res["kv_placement"] == ("before each row's steps, both target K/V caches copied into "
                                   "fresh memory, layer by layer, alternately "
                                   "(costs.fresh_placement)")


def test_a_row_that_fits_without_transformers_at_exactly_its_need(pair, canned, monkeypatch):
    hf = FakeHF([])
    monkeypatch.setattr(costs, "HFDecode", hf.decode)
    monkeypatch.setattr(costs, "keeps_last_logits", lambda model: True)
    mem = row_memory(pair, 2, 8, [1, 2], False, 3, True)
    assert mem.ours_alone < mem.needed
    for free, fits_alone in ((mem.ours_alone, True), (mem.ours_alone - 1, False)):
        res = measure_costs(pair, get_backend("cpu"), blocks=(2,), contexts=(8,), batches=(2,),
                            reps=1, hf=hf, log=lambda m: None, available=lambda device: free)
        (skip,) = res["skipped_rows"]
        fix = (f"ours alone needs {mem.ours_alone / GB:.2f} GB: pass --no-hf to measure it "
               "without transformers") if fits_alone else \
            ("lower the batch or the context, or the dtype (bfloat16 halves float32), or use a "
             "device with more memory")
        assert skip["reason"] == f"{mem.describe()}, {free / GB:.2f} GB available on cpu; {fix}"


def test_the_memory_check_names_where_free_memory_is_read(pair, canned):
    res = measure_costs(pair, get_backend("cpu"), blocks=(2,), contexts=(8,), batches=(1,),
                        reps=1, log=lambda m: None)
    assert res["memory_check"] == (
        "each row's memory estimated before it allocates (bench/cost_memory.py: ours and "
        "transformers', every phase) against cpu's free memory (MemAvailable in /proc/meminfo); "
        "rows that do not fit are in skipped_rows")
    assert costs._memory_check(torch.device("cuda", 0), lambda d: 1) == (
        "each row's memory estimated before it allocates (bench/cost_memory.py: ours and "
        "transformers', every phase) against cuda:0's free memory (torch.cuda.mem_get_info, "
        "plus what torch's allocator holds unused) (a stand-in for the device's free memory); "
        "rows that do not fit are in skipped_rows")


def _row(batch, context, speedups=None, hf=None):
    r = {"batch": batch, "context": context, "t_target_s": 0.0125, "t_prefill_s": 1.5,
         "bandwidth_fraction": 0.25,
         "blocks": {2: {"step_over_target": 1.5}, 4: {"step_over_target": 2.25}}}
    if speedups:
        r["projected_speedup"] = speedups
    if hf:
        r["transformers"] = hf
    return r


def test_projected_table_text():
    res = {"copy_bandwidth_gbps": 12.345, "model_pass": "linears: torch F.linear",
           "acceptance": {"alpha": 0.8125, "tau": 3.0, "tau_block": 4},
           "rows": [_row(1, 8, {2: 1.25, 4: 1.75},
                         {"t_step_s": 0.02, "t_prefill_s": 0.5, "cache": "static"}),
                    _row(16, 2048, {2: 0.5, 4: 1.0})],
           "skipped_rows": [{"batch": 8, "context": 8192, "reason": "needs 9 GB"}],
           "skipped_contexts": [16384],
           "transformers_prefill_logits": "last row only (logits_to_keep=1)"}
    assert projected_table(res).split("\n") == [
        "copy bandwidth 12.3 GB/s; acceptance: alpha 0.812 (tau 3.00 at block 4); "
        "linears: torch F.linear",
        "batch  1 context     8: target step    12.50 ms, prefill 1.50 s (transformers 20.00 ms, "
        "prefill 0.50 s, static cache),  25% of bandwidth; projected speedup (spec step / "
        "target step) b2: x1.25 (1.50) b4: x1.75 (2.25)",
        "batch 16 context  2048: target step    12.50 ms, prefill 1.50 s,  25% of bandwidth; "
        "projected speedup (spec step / target step) b2: x0.50 (1.50) b4: x1.00 (2.25)",
        "batch  8 context  8192: skipped: needs 9 GB",
        "skipped contexts (beyond the target's positions): [16384]",
        "transformers' prefill logits: last row only (logits_to_keep=1)"]


def test_projected_table_without_acceptance_skips_or_logits():
    res = {"copy_bandwidth_gbps": 2.0, "acceptance": None, "rows": [_row(1, 8)],
           "skipped_contexts": [], "transformers_prefill_logits": None}
    assert projected_table(res).split("\n") == [
        "copy bandwidth 2.0 GB/s",
        "batch  1 context     8: target step    12.50 ms, prefill 1.50 s,  25% of bandwidth; "
        "projected speedup (spec step / target step) b2: (1.50) b4: (2.25)"]


@pytest.mark.parametrize("peer_layers", [0, 1, 5])
def test_fresh_placement_with_a_peer_of_fewer_or_more_layers(pair, peer_layers):
    """Ours has 3 layers; a peer's 0, 1 or 5: every layer of each side is copied once."""
    from dflash2rt.backend import Fallbacks
    from dflash2rt.engine.engine import Engine
    from dflash2rt.engine.request import Request, SamplingParams

    backend = get_backend("cpu")
    reqs = [Request((1, 2, 3), SamplingParams(max_new_tokens=5))]
    with Engine(pair, backend) as engine, torch.inference_mode(), backend.run_context():
        runner = engine.runner
        st = runner.start(reqs, True, 4, None, Fallbacks().report, {})
        old = st.target_storage
        peer = [SimpleNamespace(keys=torch.full((1, 2, 3, 4), float(i)),
                                values=torch.full((1, 2, 3, 4), -float(i)))
                for i in range(peer_layers)]
        theirs = [(p.keys, p.values) for p in peer]
        costs.fresh_placement(st, runner, peer)
        new = st.target_storage
        assert len(new.k) == len(old.k) == LAYERS and new.side is old.side
        for a, b in zip((*old.k, *old.v), (*new.k, *new.v)):
            assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
        for p, (k, v) in zip(peer, theirs, strict=True):
            assert torch.equal(p.keys, k) and p.keys.data_ptr() != k.data_ptr()
            assert torch.equal(p.values, v) and p.values.data_ptr() != v.data_ptr()
