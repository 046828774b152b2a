"""What a step stages: host values in one transfer, per-run constants copied into the graphs'
static inputs only when they change, and the verify graph reading the draft graph's outputs in
place."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dflash2rt import get_backend
from dflash2rt.bench.launches import Counter
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.mode import DRAFTED
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.graphs.runner import GraphRunner
from dflash2rt.ops.staging import pack, to_device

from fake_graphs import Rerun
from tiny_models import tiny_pair


class _Writes(TorchDispatchMode):
    """Counts the in-place copies and fills (what staging launches)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in ("copy_", "fill_"):
            self.n += 1
        return func(*args, **(kwargs or {}))


def test_host_tensors_reach_the_device_in_one_copy_with_their_values():
    host = [torch.tensor([[1, -2**62], [3, 4]]), torch.tensor([0.5, 2.0 ** -24]),
            torch.tensor([True, False, True]), torch.zeros(0, dtype=torch.int64),
            torch.tensor([7], dtype=torch.int32)]
    got, count = Counter().measure(lambda: to_device("meta", *host))
    assert [(g.shape, g.dtype, g.device.type) for g in got] == \
        [(h.shape, h.dtype, "meta") for h in host]
    assert (count.h2d, count.torch, count.d2h) == (1, 0, 0)        # one copy, no kernel
    assert to_device("cpu", *host) == host            # on the CPU: the tensors themselves
    buf, views = pack(*host)                           # the packing and views, on the host
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(views(buf), host))


def test_constants_are_staged_only_when_they_change():
    runner = GraphRunner(Rerun(), (4,), lambda n: {"c": torch.zeros(n), "v": torch.zeros(n)},
                         lambda inp: {"out": inp["c"] + inp["v"]}, {"c": 0.0, "v": 0.0},
                         constants=frozenset({"c"}))
    c = torch.tensor([1.0, 2.0, 3.0])
    runner.run({"c": c, "v": torch.ones(3)}, print)                  # capture
    counts = []
    for live in ({"c": c, "v": torch.full((3,), 2.0)},              # c: the same tensor
                 {"c": c.clone() + 1, "v": torch.full((3,), 2.0)},   # a new c
                 {"c": c[:2], "v": torch.full((2,), 2.0)}):          # fewer rows: re-padded
        writes = _Writes()
        with writes:
            out = runner.run(live, print)["out"]
        counts.append(writes.n)
        assert torch.equal(out, live["c"] + live["v"])
    assert counts == [2, 4, 4]        # v and its padding; + c and its padding; both re-padded
    assert runner.state[4].inputs["c"][2:].eq(0).all()


def test_verify_graphs_read_the_draft_graphs_outputs_in_place():
    pair = tiny_pair("dflash2", block=4, dtype=torch.float32)
    backend = get_backend("cpu")
    graphed = backend.with_standing_fallback("test: graphs")
    graphed.graph_adapter = Rerun()
    reqs = [Request((1, 2, 3), SamplingParams(max_new_tokens=12, temperature=t, seed=i))
            for i, t in enumerate((0.0, 1.0))]
    with Engine(pair, graphed) as engine:
        outs, _ = engine.generate(reqs, block_size=4)
        mode = engine.runner._graphed[("spec", 4)]
        d = mode.runners[("draft", True, ())].state[2]
        v = mode.static_inputs("verify", (), 2, drafted=True)  # what a new verify bucket takes
        for name in DRAFTED:
            assert v[name] is d.outputs[name], name
        assert mode.static_inputs("verify", (), 4, drafted=True)["draft"].eq(0).all()  # none
    ref, _ = Engine(pair, backend).generate(reqs, block_size=4)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
