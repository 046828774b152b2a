"""Each bug class planted in an out-of-tree backend (tests/fixtures/mutants/)
is killed by the conformance suite: by the full suite on a backend declaring float32, float64 and
bfloat16, and by ``--dflash2rt-quick`` (small samples only) on a backend that declares only
float32 — so no kill hangs on an exhaustive sample or a bf16 accident. The ``-k`` selections are
subsets of what ``dflash2rt conformance`` runs; each failure must name its level and case."""

from __future__ import annotations

import os

import pytest

from fixture_dists import install_mutant

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow          # each test runs the conformance suite in a subprocess

KILLS = {  # mutant: (-k selection, failure heads that must appear)
    "topp-boundary": ("L1 and (target_probs or sample_next or verify)", [
        "[L1 target_probs case=topp_boundary_ties_v37",
        "[L1 sample_next case=topp_boundary_ties_v37",
        "[L1 verify case=topp_boundary_ties "]),
    "accept-8-slots": ("L1 and verify", [
        "[L1 verify case=deep_accept_b16_greedy_every_slot",
        "[L1 verify case=deep_accept_b16_sampled_every_slot"]),
    "chunk-argmax-tie": ("L1 and verify", ["[L1 verify case=vocab_chunks_greedy_ties_v3001"]),
    "chunk-icdf-no-carry": ("L1 and verify", [
        "[L1 verify case=vocab_chunks_residual_bonus_v3001"]),
    "conv-tile-group": ("L1 and conv", [
        "[L1 conv_prepare case=b4_r2_h392_g14_t3_multi_tile",
        "[L1 conv_finish case=b16_r1_h520_g65_t2_multi_tile"]),
    "accept-in-float32": ("L1 and verify", ["[L1 verify case=accept_f32_vs_f64_q_not_pow2"]),
    "walk-as-accept": ("L2", ["[L2 law case=quarter-q1]", "[L2 law case=plain dtype=float32]"]),
    "procs-pre-block-counts": ("(L1 and procs) or (L3 and procs and frequency)", [
        "[L1 procs case=frequency]", "[L1 procs case=repetition]",
        "[L3 procs case=procs-frequency-"]),
    "procs-row0-everywhere": ("(L1 and procs) or (L3 and procs and frequency)", [
        "[L1 procs case=presence]", "[L3 procs case=procs-frequency-"]),
    "wm-one-key": ("watermark", ["[L4 watermark case=T1 slot=",
                                 "[L4 watermark-exact case=T1]"]),
    "wm-coin-reuses-draw": ("watermark", ["[L4 watermark case=T1 slot=",
                                          "[L4 watermark-exact case=T1]"]),
    "wm-accept-ignores-q": ("watermark", ["[L4 watermark-lattice case=T1",
                                          "[L4 watermark-lattice case=T0.7-topp0.95"]),
    "constraint-row0-everywhere": ("constraint", [
        "[L1 constraint case=every_row_moves]", "[L3 constraint case=constraint-unmasked-V4-",
        "[L3 constraint case=constraint-masked-V4-"]),
    "schedule-peeks-accept": ("L3 and adaptive", [
        "[L3 adaptive case=adaptive-V4-b4-K3-L4-accept-driven dtype=float32]",
        "[L3 adaptive case=adaptive-V4-b4-K3-L4-cost-model dtype=float32]"]),
}
FULL_ONLY = {  # exhaustive-tier cases (too slow for the Triton-interpreter lane's --quick)
    "schedule-peeks-accept": ["[L3 adaptive case=adaptive-V4-b4-K3-L4-hashed dtype=bfloat16]"],
    "chunk-argmax-tie": ["[L1 verify case=real_vocab_v151936"],
    "chunk-icdf-no-carry": ["[L1 verify case=real_vocab_v151936"],
}
MODES = {"quick-float32-only": ("float32", ["--dflash2rt-quick"]), "full": ("all", [])}
# The quick mode of the logit-processor and constraint mutants runs their L1 cases only:
# the full mode shows that L3 kills them too.
QUICK = {"procs-pre-block-counts": ("L1 and procs", [
             "[L1 procs case=frequency]", "[L1 procs case=repetition]"]),
         "procs-row0-everywhere": ("L1 and procs", ["[L1 procs case=presence]"]),
         "constraint-row0-everywhere": ("L1 and constraint", [
             "[L1 constraint case=every_row_moves]"])}


@pytest.fixture
def run_mutant(pytester, monkeypatch, tmp_path):
    """Install mutant ``mutant`` for ``dtypes`` and run the suite on it in a subprocess."""
    def run(mutant: str, dtypes: str, *args: str):
        plugins = tmp_path / "plugins"
        plugins.mkdir()
        name = install_mutant(plugins, mutant, dtypes)
        # The caller's PYTHONPATH stays after the plugins (a worktree's checkout, not the
        # installed one, is then the code under test).
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
            [str(plugins)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        return pytester.runpytest_subprocess("--pyargs", "dflash2rt_conformance", "-p",
                                             "no:cacheprovider", "--dflash2rt-backend", name,
                                             *args)
    return run


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("mutant", list(KILLS))
def test_mutant_is_killed(run_mutant, mutant, mode):
    dtypes, extra = MODES[mode]
    selection, heads = QUICK[mutant] if mode != "full" and mutant in QUICK else KILLS[mutant]
    res = run_mutant(mutant, dtypes, *extra, "-k", selection)
    out = res.stdout.str()
    assert res.ret == 1, f"{mutant} ({mode}) was not killed:\n{out[-3000:]}"
    if dtypes == "float32":
        assert "dtype=float64" not in out and "dtype=bfloat16" not in out, out[-3000:]
    for head in heads + (FULL_ONLY.get(mutant, []) if mode == "full" else []):
        assert head in out, f"{mutant} ({mode}): {head!r} not in the failures\n{out[-4000:]}"
