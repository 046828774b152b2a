"""The compile-ahead plan's pieces against their docstrings written anew: meta copies tensor by
tensor, signatures as hand values, forwards traced once per signature, the sampling modes per
backend fact, the prefill lengths, and ``CompileAhead.run`` with a scripted plan and clock."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from dflash2rt.backend import TORCH_OPS, TRITON_KERNEL, UNSUPPORTED
from dflash2rt.engine import precompile as P
from dflash2rt.engine.extensions import Watermark


def _same_layout(m: torch.Tensor, t: torch.Tensor) -> bool:
    return (m.device.type == "meta" and m.shape == t.shape and m.stride() == t.stride()
            and m.dtype == t.dtype)


class Holder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3, 4))
        self.frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
        self.register_buffer("buf", torch.arange(6, dtype=torch.int32))
        self.plain = torch.ones(4, 5).t()                        # a strided tensor attribute
        self.by_name = {"a": torch.zeros(2, dtype=torch.float16), "n": 3}
        self.in_list = [torch.zeros(7), "x"]
        self.in_tuple = (torch.zeros(1, 2, dtype=torch.bfloat16),)
        self.shared = self.plain                                 # the same tensor twice


def test_meta_copy_makes_every_tensor_meta_with_its_layout_and_leaves_the_original():
    m = Holder()
    m.child = Holder()
    c = P.meta_copy(m)
    for mod, orig in ((c, m), (c.child, m.child)):
        assert isinstance(mod.w, torch.nn.Parameter) and mod.w.requires_grad
        assert isinstance(mod.frozen, torch.nn.Parameter) and not mod.frozen.requires_grad
        for name in ("w", "frozen", "buf", "plain"):
            assert _same_layout(getattr(mod, name), getattr(orig, name)), name
        assert mod.plain.stride() == (1, 5)
        assert _same_layout(mod.by_name["a"], orig.by_name["a"]) and mod.by_name["n"] == 3
        assert _same_layout(mod.in_list[0], orig.in_list[0]) and mod.in_list[1] == "x"
        assert _same_layout(mod.in_tuple[0], orig.in_tuple[0])
        assert mod.shared is mod.plain                           # one meta tensor for one tensor
        assert mod.w is not orig.w and mod.w is not mod.frozen
    assert m.w.device.type == "cpu" and m.plain.device.type == "cpu"
    assert m.by_name["a"].device.type == "cpu" and m.in_list[0].device.type == "cpu"
    assert torch.equal(m.buf, torch.arange(6, dtype=torch.int32))


def test_sig_of_each_kind_of_value():
    t = torch.zeros(4, 6, dtype=torch.float16)[1:, ::2]
    assert P._sig(t) == ("T", (3, 3), (6, 2), torch.float16, 6)
    assert P._sig(torch.zeros(2)) == ("T", (2,), (1,), torch.float32, 0)
    for v in (None, True, False, 0, 3, -2, 1.5, "s", ""):
        assert P._sig(v) == v and type(P._sig(v)) is type(v)
    assert P._sig([1, (2, None)]) == (1, (2, None))
    assert P._sig({"b": 1, "a": [2]}) == (("a", (2,)), ("b", 1))
    obj = Holder()
    assert P._sig(obj.forward) == ("M", id(obj), Holder.forward)

    def attend(x):
        return x
    assert P._sig(attend) == "F" and P._sig(lambda: 0) == "F"
    other = object()
    assert P._sig(other) == ("O", id(other))
    assert P._sig(torch.float32) == ("O", id(torch.float32))
    lin = torch.nn.Linear(1, 1)                                # callable, no __code__
    assert P._sig(lin) == ("O", id(lin)) and P._sig(Holder) == ("O", id(Holder))
    push = [].append                                           # bound, but no __func__
    assert P._sig(push) == ("O", id(push))
    assert P._sig(([t], {"k": obj.forward})) == ((P._sig(t),), (("k", P._sig(obj.forward)),))


def test_params_sig_is_each_parameter_by_name_and_layout():
    lin = torch.nn.Linear(3, 2)
    assert P._params_sig(lin) == (("weight", ("T", (2, 3), (3, 1), torch.float32, 0)),
                                  ("bias", ("T", (2,), (1,), torch.float32, 0)))


class Counted(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(n))
        self.calls = 0

    def forward(self, x, scale=1):
        self.calls += 1
        return ("out", self.calls, x.shape, scale)


class Stack(Counted):
    def __init__(self, sizes) -> None:
        super().__init__(1)
        self.layers = torch.nn.ModuleList(Counted(n) for n in sizes)


@contextlib.contextmanager
def _tracing():
    P._TRACE.seen = {}
    try:
        yield
    finally:
        P._TRACE.seen = None


def test_memo_forward_runs_once_per_key_and_signature_only_within_a_trace():
    m = Counted(2)
    P._memo_forward(m, "k")
    x = torch.zeros(2, 3)
    assert m(x)[1] == 1 and m(x)[1] == 2                       # no trace: every call runs
    with _tracing():
        first = m(x)
        assert m(torch.ones(2, 3)) is first and m.calls == 3   # same signature: its result
        assert m(x, scale=2)[1] == 4                             # another keyword value
        assert m(torch.zeros(3, 3))[1] == 5                      # another shape
        assert m(x.t())[1] == 6                                  # other strides
        assert m(x, scale=2)[1] == 4 and m.calls == 6
    assert m(x)[1] == 7                                          # the trace is over


def test_memo_calls_share_layers_of_equal_parameter_shapes_not_the_models():
    s = Stack([2, 2, 3])
    P._memo_calls(s)
    x = torch.zeros(1)
    with _tracing():
        outs = [layer(x) for layer in s.layers]
        assert [layer.calls for layer in s.layers] == [1, 0, 1]
        assert outs[1] is outs[0] and outs[2] is not outs[0]
        s(x)
        s(x)
        assert s.calls == 1
        t = Stack([2])
        P._memo_calls(t)
        t(x)
        assert t.calls == 1                                      # another model: its own key
        t.layers[0](x)
        assert t.layers[0].calls == 0                            # a layer like s's: s's result


def test_meta_pair_is_made_once_per_target_and_draft(monkeypatch):
    monkeypatch.setattr(P, "_META_PAIRS", P.weakref.WeakKeyDictionary())
    monkeypatch.setattr(P, "ModelPair", lambda t, d: types.SimpleNamespace(target=t, draft=d))
    target, draft, draft2 = Counted(2), Counted(3), Counted(4)
    pair = types.SimpleNamespace(target=target, draft=draft)
    mp = P.meta_pair(pair)
    assert mp.target.w.device.type == "meta" and mp.draft.w.device.type == "meta"
    assert mp.draft.w.shape == (3,) and target.w.device.type == "cpu"
    assert P.meta_pair(types.SimpleNamespace(target=target, draft=draft)) is mp
    other = P.meta_pair(types.SimpleNamespace(target=target, draft=draft2))
    assert other is not mp and other.draft.w.shape == (4,)
    alone = P.meta_pair(types.SimpleNamespace(target=target, draft=None))
    assert alone.draft is None and alone is not other
    assert P.meta_pair(types.SimpleNamespace(target=target, draft=None)) is alone
    x = torch.zeros(1)
    with _tracing():                                           # the copies' forwards memoized
        alone.target(x)
        alone.target(x)
        assert alone.target.calls == 1


def _backend(fp64=True, impl=TRITON_KERNEL, has_key=True):
    return types.SimpleNamespace(has_fp64=fp64,
                                 implementation={"watermark": impl} if has_key else {})


def test_sampling_modes_add_the_watermark_only_where_the_backends_kernels_draw():
    plain = [(False, ()), (True, ())]
    keyed = plain + [(True, ((Watermark, (4, 256)),))]
    assert P.sampling_modes(_backend()) == keyed
    assert P.sampling_modes(_backend(fp64=False)) == plain
    assert P.sampling_modes(_backend(impl=TORCH_OPS)) == plain
    assert P.sampling_modes(_backend(impl=UNSUPPORTED)) == plain
    assert P.sampling_modes(_backend(fp64=False, impl=TORCH_OPS)) == plain
    assert P.sampling_modes(_backend(impl="triton interpreter")) == keyed


class Other(torch.nn.Module):
    pass


def test_untraceable_names_each_hooked_module_type_once_sorted():
    plain = types.SimpleNamespace(target=Holder(), draft=None)
    assert P.untraceable(plain) == ""
    t, d = Holder(), Holder()
    t.extra = Other()
    assert P.untraceable(types.SimpleNamespace(target=t, draft=d)) == ""
    d.register_forward_pre_hook(lambda *a: None)
    assert P.untraceable(types.SimpleNamespace(target=t, draft=d)) == \
        "the models have forward hooks (Holder)"
    t.extra.register_forward_hook(lambda *a: None)
    t.register_forward_hook(lambda *a: None)
    assert P.untraceable(types.SimpleNamespace(target=t, draft=d)) == \
        "the models have forward hooks (Holder, Other)"
    assert P.untraceable(types.SimpleNamespace(target=t, draft=None)) == \
        "the models have forward hooks (Holder, Other)"
    lone = Holder()
    lone.extra = Other()
    lone.extra.register_forward_hook(lambda *a: None)
    assert P.untraceable(types.SimpleNamespace(target=lone, draft=None)) == \
        "the models have forward hooks (Other)"


@pytest.mark.parametrize("ready, world, want", [
    ((True, True), 1, ""), ((True, True), 2, "collectives"), ((True, True), 8, "collectives"),
    ((True, False), 2, ""), ((False, True), 2, ""), ((False, False), 2, "")])
def test_untraceable_in_a_process_group_of_more_than_one_rank(monkeypatch, ready, world, want):
    dist = torch.distributed
    monkeypatch.setattr(dist, "is_available", lambda: ready[0])
    monkeypatch.setattr(dist, "is_initialized", lambda: ready[1])
    monkeypatch.setattr(dist, "get_world_size", lambda *a: world)
    why = P.untraceable(types.SimpleNamespace(target=Holder(), draft=None))
    assert why == ("a tensor-parallel run's collectives do not run on meta tensors"
                   if want else "")


class PrefillTarget:
    """Records each traced prompt length; a new compile key at the lengths in ``new``."""

    def __init__(self, got, new) -> None:
        self.got, self.new, self.lengths = got, set(new), []

    def __call__(self, ids, pos, cache, lens, *, ctx_len, logits_at, attn):
        t = ids.shape[1]
        assert ids.shape == (P.ROWS, t) and pos.shape == (P.ROWS, t) and ctx_len == 0
        assert lens.shape == (P.ROWS,) and logits_at.shape == (P.ROWS,)
        assert cache == "target cache" and attn == "attention"
        self.lengths.append(t)
        if t in self.new:
            self.got.by_key[("k", t)] = t


@pytest.mark.parametrize("new, want", [
    ((), [1, 2, 4, 8, 16]),                                     # below 16: no key needed
    ((1, 2, 4, 8), [1, 2, 4, 8, 16]),
    ((16,), [1, 2, 4, 8, 16, 32]),
    ((16, 32), [1, 2, 4, 8, 16, 32, 64]),
    ((8, 32), [1, 2, 4, 8, 16]),                                 # 16 added none: stop there
    ((16, 32, 64, 128, 256), [1, 2, 4, 8, 16, 32, 64, 128, 256]),   # below the 512 rows
])
def test_prefill_lengths_double_past_16_while_a_length_adds_a_key(new, want):
    got = types.SimpleNamespace(by_key={})
    target = PrefillTarget(got, new)
    mp = types.SimpleNamespace(target=target)
    P._trace_prefill(mp, types.SimpleNamespace(attention="attention"),
                     ("target cache", None), got)
    assert target.lengths == want


class FakeMode:
    made: list = []

    def __init__(self, bodies, runner) -> None:
        assert runner is None
        self.bodies, self.calls = bodies, []
        FakeMode.made.append(self)

    def graph_body(self, kind, sampled, exts):
        return lambda inputs: self.calls.append((kind, sampled, exts, inputs))

    def static_inputs(self, kind, exts, rows):
        return ("inputs", kind, exts, rows)


@pytest.mark.parametrize("block, draft, spec", [(1, "d", False), (2, "d", True),
                                                (5, "d", True), (4, None, False)])
def test_trace_block_runs_each_kind_in_each_sampling_mode(monkeypatch, block, draft, spec):
    FakeMode.made = []
    monkeypatch.setattr(P, "Mode", FakeMode)
    monkeypatch.setattr(P, "StepBodies", lambda *a: a)
    modes = [(False, ()), (True, ()), (True, ("w",))]
    monkeypatch.setattr(P, "sampling_modes", lambda b: modes)
    mp = types.SimpleNamespace(draft=draft)
    P._trace_block(mp, "be", ("tc", "dc"), block)
    (mode,) = FakeMode.made
    assert mode.bodies == (mp, "be", "tc", "dc", block if spec else None)
    kinds = ("draft", "verify") if spec else ("target-only",)
    assert mode.calls == [(k, s, e, ("inputs", k, e, P.ROWS)) for s, e in modes for k in kinds]


def test_caches_are_meta_caches_of_the_traced_shape(monkeypatch):
    made = []
    monkeypatch.setattr(P.KVCache, "empty", staticmethod(lambda *a: made.append(a) or "tc"))
    cfg = types.SimpleNamespace(num_hidden_layers=3, num_key_value_heads=2, head_dim=8)
    draft = types.SimpleNamespace(empty_cache=lambda *a: ("dc",) + a)
    mp = types.SimpleNamespace(target=types.SimpleNamespace(cfg=cfg), draft=draft,
                               dtype=torch.float16)
    assert P._caches(mp) == ("tc", ("dc", 2, 512, torch.float16, P.META))
    assert made == [(3, 2, 512, 2, 8, torch.float16, P.META)]
    mp.draft = None
    assert P._caches(mp) == ("tc", None)


class PlanBackend:
    def __init__(self) -> None:
        self.entered = 0

    @contextlib.contextmanager
    def run_context(self):
        self.entered += 1
        yield


@pytest.mark.parametrize("prefill", [True, False])
def test_kernel_plan_traces_each_block_once_in_order_then_prefill(monkeypatch, prefill):
    did = []
    monkeypatch.setattr(P, "meta_pair", lambda pair: ("meta", pair))
    monkeypatch.setattr(P, "_caches", lambda mp: ("caches", mp))

    def block(mp, backend, caches, b):
        assert torch.is_inference_mode_enabled() and P._TRACE.seen == {}
        assert mp == ("meta", "pair") and caches == ("caches", mp)
        did.append(b)

    def pre(mp, backend, caches, got):
        did.append("prefill")
        got.by_key.update({"k1": "L1", "k2": "L2"})
    monkeypatch.setattr(P, "_trace_block", block)
    monkeypatch.setattr(P, "_trace_prefill", pre)
    be = PlanBackend()
    out = (P.kernel_plan("pair", be, [4, 1, 4, 3], prefill=False) if not prefill else
           P.kernel_plan("pair", be, [4, 1, 4, 3]))              # prefill by default
    assert did == [1, 3, 4] + (["prefill"] if prefill else [])
    assert out == (["L1", "L2"] if prefill else []) and be.entered == 1
    assert P._TRACE.seen is None


def test_kernel_plan_ends_its_trace_when_a_trace_raises(monkeypatch):
    monkeypatch.setattr(P, "meta_pair", lambda pair: pair)
    monkeypatch.setattr(P, "_caches", lambda mp: None)

    def broken(*a):
        raise RuntimeError("broke")
    monkeypatch.setattr(P, "_trace_block", broken)
    with pytest.raises(RuntimeError, match="broke"):
        P.kernel_plan("pair", PlanBackend(), [2])
    assert P._TRACE.seen is None


class Variant:
    def __init__(self, name, n) -> None:
        self.name, self.key, self.n = name, (name, n), n

    def constexprs(self):
        return {"BLOCK": self.n}


class AheadBackend:
    def __init__(self, device="dev0", compiles=True, fail=()) -> None:
        self.device, self.compiles_ahead, self.fail = device, compiles, set(fail)
        self.given: list = []

    def compile_ahead(self, launches):
        self.given.append([x.key for x in launches])
        return {x.key: "no such tile" for x in launches if x.key in self.fail}


class Clock:
    """``time.perf_counter`` that steps by 0.25 s a reading."""

    def __init__(self) -> None:
        self.now = 10.0

    def perf_counter(self):
        self.now += 0.25
        return self.now


@pytest.fixture
def scripted(monkeypatch):
    """``kernel_plan`` answering from a table by block (recording each call), a fresh
    compiled set, a stepping clock, no hooks."""
    calls: list = []
    plans = {1: [Variant("a", 1), Variant("b", 1)], 2: [Variant("a", 2), Variant("b", 1)],
             3: [Variant("a", 3)], 9: "raise"}

    def plan(pair, backend, blocks, prefill=True):
        calls.append((list(blocks), prefill))
        out: dict = {}
        for b in blocks:
            if plans[b] == "raise":
                raise ValueError("shape broke")
            out.update({x.key: x for x in plans[b]})
        return list(out.values())
    monkeypatch.setattr(P, "kernel_plan", plan)
    monkeypatch.setattr(P, "_COMPILED", set())
    monkeypatch.setattr(P, "time", Clock())
    monkeypatch.setattr(P, "untraceable", lambda pair: "")
    return calls


def test_compile_ahead_plans_each_block_once_and_compiles_each_key_once(scripted):
    be, said = AheadBackend(fail=[("b", 1)]), []
    ahead = P.CompileAhead("pair", be)
    assert ahead.run([2], said.append) == (0.25, {"a": 2})
    assert scripted == [([1, 2], True)] and be.given == [[("a", 1), ("b", 1), ("a", 2)]]
    assert said == ["compile-ahead of b {'BLOCK': 1} failed: no such tile; that variant "
                    "compiles at its first launch"]
    assert ahead.planned == {1, 2} and ahead.prefilled
    assert ahead.run([1, 2], said.append) == (0.0, {})          # nothing new: no trace
    assert ahead.run([], said.append) == (0.0, {})
    assert len(scripted) == 1 and len(said) == 1
    assert ahead.run([3, 2, 3], said.append) == (0.25, {"a": 1})
    assert scripted[1] == ([3], False) and be.given[1] == [("a", 3)]
    other = P.CompileAhead("pair", be)                            # another engine, same device
    assert other.run([2], said.append) == (0.25, {})
    assert scripted[2] == ([1, 2], True) and be.given[2] == [] and len(said) == 1
    elsewhere = AheadBackend(device="dev1")                       # another device: compiled
    assert P.CompileAhead("pair", elsewhere).run([1], said.append) == (0.25, {"a": 1, "b": 1})
    assert elsewhere.given == [[("a", 1), ("b", 1)]]


def test_compile_ahead_counts_variants_per_kernel_sorted(scripted):
    be = AheadBackend()
    assert P.CompileAhead("pair", be).run([3, 2], print) == (0.25, {"a": 3, "b": 1})
    assert list(P.CompileAhead("p", AheadBackend("d2")).run([3], print)[1]) == ["a", "b"]


def test_compile_ahead_does_nothing_where_kernels_do_not_compile(scripted):
    be, said = AheadBackend(compiles=False), []
    ahead = P.CompileAhead("pair", be)
    assert ahead.run([2, 3], said.append) == (0.0, {})
    assert scripted == [] and be.given == [] and said == [] and ahead.planned == set()


def test_a_failed_trace_is_reported_and_the_next_call_still_plans_prefill(scripted):
    be, said = AheadBackend(), []
    ahead = P.CompileAhead("pair", be)
    assert ahead.run([9], said.append) == (0.25, {})
    assert said == ["compile-ahead skipped: the shape-only trace of blocks [1, 9] raised "
                    "ValueError: shape broke; kernels compile at their first launch"]
    assert be.given == [] and ahead.planned == {1, 9} and not ahead.prefilled
    assert ahead.run([2], said.append) == (0.25, {"a": 1, "b": 1})
    assert scripted[1] == ([2], True) and len(said) == 1


def test_an_untraceable_pair_is_reported_and_its_blocks_not_tried_again(scripted, monkeypatch):
    monkeypatch.setattr(P, "untraceable", lambda pair: "hooks")
    be, said = AheadBackend(), []
    ahead = P.CompileAhead("pair", be)
    assert ahead.run([4], said.append) == (0.0, {})
    assert said == ["compile-ahead skipped: hooks; kernels compile at their first launch"]
    assert ahead.planned == {1, 4} and scripted == [] and be.given == []
    assert ahead.run([4], said.append) == (0.0, {}) and len(said) == 1
