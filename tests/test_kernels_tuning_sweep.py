"""Launch tuning and Triton facts (kernels/tuning.py) against their documented rules, written
anew: the default tiles obey Triton's shape rules, a vendor's tuning is picked by warp size with
the first entry for an unknown one, facts without a tuning are refused, and the interpreter
switch reads TRITON_INTERPRET as Triton does (on for 1, true, on, yes or y in any case), and
tunings and facts are frozen values.

Classes of bug held: a default tile that is no power of two (``tl.arange`` refuses it) or an
attention tile under 16 (``tl.dot``); a lookup that ignores the warp size, or that reads a
made-up warp size for an unknown one instead of the first entry; an empty tuning accepted (the
failure would come at the first launch); the interpreter switch read the wrong way round, or
on for a value Triton reads as off ("false"); a tuning that can be changed in place, or is no
dict key."""

from __future__ import annotations

import dataclasses

import pytest

from dflash2rt.kernels.tuning import DEFAULT, INTERPRET_REASON, TritonFacts, Tuning, interpreting


def _power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def test_default_tiles_obey_tritons_shape_rules():
    assert DEFAULT == Tuning()
    for f in dataclasses.fields(Tuning):
        value = getattr(DEFAULT, f.name)
        assert isinstance(value, int) and _power_of_two(value), (f.name, value)
    assert DEFAULT.attn_block_m >= 16 and DEFAULT.attn_block_n >= 16


WIDE, NARROW, ONE = Tuning(256, 2048, 4), Tuning(256, 2048, 8), Tuning(16, 32, 1)


def test_tuning_for_picks_by_warp_size_and_the_first_for_an_unknown_one():
    facts = TritonFacts(backend="hip", distribution="x", tuning={64: WIDE, 32: NARROW, 1: ONE})
    assert facts.tuning_for(64) is WIDE and facts.tuning_for(32) is NARROW
    assert facts.tuning_for(1) is ONE
    for unknown in (None, 0, 16, 128):
        assert facts.tuning_for(unknown) is WIDE, unknown
    only = TritonFacts(backend="cuda", distribution="triton", tuning={32: NARROW})
    assert only.tuning_for(64) is NARROW and only.tuning_for(None) is NARROW
    assert only.compile_targets == {}


def test_tunings_and_facts_are_immutable_values():
    """Frozen: a plugin's facts cannot be changed under the backends built from them, and equal
    tunings are one dict key / set member."""
    assert hash(Tuning(256, 2048, 8)) == hash(NARROW) and len({WIDE, NARROW, Tuning()}) == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT.block_v = 64                                    # type: ignore[misc]
    facts = TritonFacts(backend="cuda", distribution="triton", tuning={32: NARROW})
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.backend = "hip"                                   # type: ignore[misc]
    assert facts == TritonFacts(backend="cuda", distribution="triton", tuning={32: NARROW})


def test_facts_without_a_tuning_are_refused():
    with pytest.raises(ValueError, match="at least one warp size"):
        TritonFacts(backend="cuda", distribution="triton", tuning={})
    assert TritonFacts(backend="cuda", distribution="triton", tuning={32: DEFAULT}).tuning


# Triton's reading of a boolean variable (its getenv_bool): on for 1, true, on, yes or y in any
# case, off for everything else, unset included
INTERPRET_VALUES = [(None, False), ("", False), ("0", False), ("1", True), ("true", True),
                    ("TRUE", True), ("On", True), ("yes", True), ("y", True), ("false", False),
                    ("off", False), ("no", False), ("2", False), (" 1", False)]


@pytest.mark.parametrize("value, on", INTERPRET_VALUES)
def test_interpreting_reads_triton_interpret_as_triton_does(monkeypatch, value, on):
    """TRITON_INTERPRET=false must not count as interpreting: Triton compiles then, and a
    backend that believed otherwise would refuse to build, or run compiled kernels as if they
    were interpreted."""
    if value is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", value)
    assert interpreting() is on
    assert "TRITON_INTERPRET=1" in INTERPRET_REASON


def test_interpreting_agrees_with_tritons_own_reading(monkeypatch):
    """The same answer as the installed Triton's reader for every value above."""
    reader = getattr(pytest.importorskip("triton._C.libtriton"), "getenv_bool", None)
    if reader is None:
        pytest.skip("this Triton has no getenv_bool")
    for value, _ in INTERPRET_VALUES:
        if value is None:
            monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        else:
            monkeypatch.setenv("TRITON_INTERPRET", value)
        assert interpreting() is reader("TRITON_INTERPRET", False), value
