"""The backend contract (probes, specs, fallbacks, the model pass, device identity, run context,
op wiring) against its docstrings, written out by hand: exact strings, call counts, each check
alone."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from dflash2rt import backend as backend_mod
from dflash2rt.backend import (OPS, Backend, BackendSpec, Fallbacks, Probe, TorchOpsBackend,
                               same_device)
from dflash2rt.ops import exact32, fused
from dflash2rt.ops import selector as selector_op
from dflash2rt.ops import verify as verify_op
from dflash2rt.ops.rng import Stream, uniforms


class _Mini(Backend):
    """The least a backend defines: the abstract ops."""

    def __init__(self, device: str = "cpu") -> None:
        super().__init__()
        self.name, self.device, self.dtypes = "mini", torch.device(device), ()

    def conv_prepare(self, x, base, delta, block_size):
        raise NotImplementedError

    def conv_finish(self, h, a, base, delta, block_size):
        raise NotImplementedError

    def select(self, *args):
        raise NotImplementedError

    def verify(self, *args, **kwargs):
        raise NotImplementedError


# Probe and BackendSpec ------------------------------------------------------------------------

@pytest.mark.parametrize("available, reason, ok", [
    (True, "", True), (True, "a note", True), (True, "  ", True),
    (False, "why", True), (False, " x ", True),
    (False, "", False), (False, "  ", False), (False, "\n\t", False),
])
def test_probe_reason_rule_each_case(available, reason, ok):
    """An unavailable backend must give a reason that is not blank; an available one may not."""
    if ok:
        assert Probe(available, reason).reason == reason
    else:
        with pytest.raises(ValueError, match="must say why"):
            Probe(available, reason)


def test_probe_and_spec_defaults_and_frozen():
    p = Probe(True)
    assert (p.reason, p.device, p.kernels, p.dtypes, p.graphs, dict(p.details), p.fp64) == \
        ("", "", "", (), "", {}, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.available = False
    s = BackendSpec("n", 1, lambda: p, lambda q: None)
    assert (s.summary, s.opt_in, s.probe_device) == ("", False, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.priority = 2
    assert len({s, BackendSpec("n", 1, s.probe, s.create)}) == 1


# Fallbacks and standing fallbacks -------------------------------------------------------------

def test_fallbacks_keep_each_once_in_order_standing_first():
    f = Fallbacks(["b", "a", "b"])
    assert f.reported == ["b", "a"]
    for what in ("c", "a", "c", "d"):
        f.report(what)
    assert f.reported == ["b", "a", "c", "d"]
    assert Fallbacks().reported == []


def test_standing_and_kernel_fallbacks_are_recorded_once():
    be = TorchOpsBackend("t", "cpu", (torch.float32,))
    assert be.standing_fallbacks == () and be.kernel_fallbacks == []
    be.report_fallback("graphs off")
    be.report_kernel_fallback("no triton")
    be.report_kernel_fallback("no triton")
    be.report_fallback("graphs off")
    be.report_kernel_fallback("old driver")
    be.report_fallback("no triton")
    assert be.standing_fallbacks == ("graphs off", "no triton", "old driver")
    assert be.kernel_fallbacks == ["no triton", "old driver"]
    twin = be.with_standing_fallback("tensor parallel")
    assert twin.standing_fallbacks == ("graphs off", "no triton", "old driver", "tensor parallel")
    assert be.standing_fallbacks == ("graphs off", "no triton", "old driver")
    assert twin.name == "t" and type(twin) is TorchOpsBackend


# implementation -------------------------------------------------------------------------------

def test_implementation_maps_and_summaries():
    ops = ", ".join(OPS)
    no_wm = ", ".join(op for op in OPS if op != "watermark")
    mini = _Mini()
    assert mini.implementation == {**{op: "undeclared" for op in OPS}, "watermark": "torch ops"}
    assert mini.implementation_summary() == f"undeclared: {no_wm}; torch ops: watermark"
    be = TorchOpsBackend("t", "cpu", ())
    assert be.has_fp64 is True
    assert be.implementation == {op: "torch ops" for op in OPS}
    assert be.implementation_summary() == f"torch ops: {ops}"
    be.report_kernel_fallback("why one")
    be.report_kernel_fallback("why two")
    assert be.implementation_summary() == f"torch ops: {ops} (fallback: why one; why two)"
    be32 = TorchOpsBackend("t", "cpu", (), has_fp64=False)
    assert be32.implementation == {**{op: "torch ops" for op in OPS}, "watermark": "unsupported"}
    assert be32.implementation_summary() == f"torch ops: {no_wm}; unsupported: watermark"
    assert repr(be32) == "<TorchOpsBackend t on cpu>"


def test_base_defaults():
    mini = _Mini()
    assert (mini.has_fp64, mini.fuses_model_ops, mini.graph_adapter, mini.model_pass) == \
        (True, False, None, None)
    assert mini.compiles_ahead is False and mini.compile_ahead(["anything"]) == {}


# prepare_models -------------------------------------------------------------------------------

class _Pass:
    """A model pass that records each call and returns the next scripted answer (or raises)."""

    def __init__(self, *answers) -> None:
        self.answers, self.calls = list(answers), []

    def __call__(self, modules):
        self.calls.append(list(modules))
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a


def test_no_model_pass_does_nothing():
    m, f = torch.nn.Linear(1, 1), Fallbacks()
    assert _Mini().prepare_models([m], f) is None
    assert f.reported == [] and not hasattr(m, "_dflash2rt_prepared")


def test_model_pass_runs_once_per_module_per_backend():
    a, b, c = (torch.nn.Linear(1, 1) for _ in range(3))
    be = _Mini()
    be.model_pass = _Pass("opt A", "opt B")
    f = Fallbacks()
    assert be.prepare_models([a, b], f) == "opt A"
    assert be.model_pass.calls == [[a, b]]
    assert be.prepare_models([b, a], f) == "opt A"            # done before: not run again
    assert be.model_pass.calls == [[a, b]]
    assert be.prepare_models([a, c], f) == "opt A; opt B"     # only the new module
    assert be.model_pass.calls == [[a, b], [c]]
    assert be.prepare_models([c], f) == "opt B"
    assert f.reported == []
    other = _Mini()
    other.model_pass = _Pass("other")
    assert other.prepare_models([a], f) == "other" and other.model_pass.calls == [[a]]
    assert be.prepare_models([a], f) == "opt A"


def test_model_pass_with_nothing_to_say_gives_none():
    for answer in (None, ""):
        be, m = _Mini(), torch.nn.Linear(1, 1)
        be.model_pass = _Pass(answer)
        assert be.prepare_models([m, torch.nn.Linear(1, 1)], Fallbacks()) is None


def test_failed_model_pass_is_reported_to_every_caller_and_leaves_models_alone():
    a, b = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    weight = a.weight.detach().clone()
    be = _Mini()
    be.model_pass = _Pass(RuntimeError("bad ipex"), "fine")
    why = "model pass skipped (RuntimeError: bad ipex); the models run unmodified"
    f1, f2, f3 = Fallbacks(), Fallbacks(["standing"]), Fallbacks()
    assert be.prepare_models([a], f1) is None and f1.reported == [why]
    assert be.prepare_models([a], f2) is None and f2.reported == ["standing", why]
    assert be.prepare_models([b, a], f3) == "fine" and f3.reported == [why]
    assert be.model_pass.calls == [[a], [b]]
    assert torch.equal(a.weight, weight)


# same_device ----------------------------------------------------------------------------------

def test_same_device_by_type_then_index(monkeypatch):
    assert same_device("cpu", "cpu:0") and same_device("meta", "meta")
    assert not same_device("cpu", "meta") and not same_device("cuda:0", "cpu")
    assert same_device("cuda:3", "cuda:3") and not same_device("cuda:3", "cuda:2")
    # a type whose torch module has no current device (or no module at all): index 0
    assert same_device("hpu", "hpu:0") and not same_device("hpu", "hpu:1")
    assert same_device("mps", "mps:0") and not same_device("mps:1", "mps")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    assert same_device("cuda", "cuda:2") and not same_device("cuda", "cuda:0")
    assert same_device("cuda", "cuda")


# device guard and run context -----------------------------------------------------------------

def test_device_guard_uses_the_type_module_where_it_has_one():
    assert isinstance(_Mini("cpu").device_guard(), contextlib.nullcontext)
    assert isinstance(_Mini("mps").device_guard(), contextlib.nullcontext)
    guard = _Mini("cuda:1").device_guard()
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1


@pytest.mark.parametrize("fp64", [True, False])
@pytest.mark.parametrize("fuses", [True, False])
def test_run_context_each_switch_alone(fp64, fuses):
    be = _Mini()
    be.has_fp64, be.fuses_model_ops = fp64, fuses
    assert exact32.fp64_enabled() is True and fused.current() is fused.REFERENCE
    with be.run_context():
        assert exact32.fp64_enabled() is fp64
        assert fused.current() is (be if fuses else fused.REFERENCE)
    assert exact32.fp64_enabled() is True and fused.current() is fused.REFERENCE


# the torch ops' wiring ------------------------------------------------------------------------

def test_select_and_verify_pass_the_fp64_fact_and_check_by_default(monkeypatch):
    seen = []
    monkeypatch.setattr(verify_op, "verify", lambda *a: seen.append(("verify", a[-2:])))
    monkeypatch.setattr(selector_op, "select", lambda *a: seen.append(("select", a[-1:])))
    for fp64 in (True, False):
        be = TorchOpsBackend("t", "cpu", (), has_fp64=fp64)
        be.verify(1, 2, 3, 4, 5, 6)
        be.verify(1, 2, 3, 4, 5, 6, check=False)
        be.select(1, 2, 3, 4, 5, 6, 7, 8)
    assert seen == [("verify", (True, True)), ("verify", (False, True)), ("select", (True,)),
                    ("verify", (True, False)), ("verify", (False, False)), ("select", (False,))]
    assert backend_mod.verify is verify_op and backend_mod.selector is selector_op


def test_token_uniforms_read_the_bonus_stream_at_position_plus_lead():
    seed = torch.tensor([7, 7, 123456789], dtype=torch.int64)
    request = torch.tensor([0, 1, 5], dtype=torch.int64)
    position = torch.tensor([0, 9, 1000], dtype=torch.int64)
    be = TorchOpsBackend("t", "cpu", ())
    for lead in (0, 1, 3):
        want = uniforms(seed, request, position + lead, Stream.BONUS)
        got = be.token_uniforms(seed, request, position, lead) if lead else \
            be.token_uniforms(seed, request, position)
        assert torch.equal(got, want), lead
    assert not torch.equal(be.token_uniforms(seed, request, position, 1),
                           be.token_uniforms(seed, request, position))
