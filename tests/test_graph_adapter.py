"""The one graph adapter (graphs.adapter.TorchGraphAdapter) over a recording stand-in for
torch.cuda / torch.xpu: one capture stream per adapter, warm-up on it, one shared pool."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dflash2rt.graphs.adapter import GraphCaptureError, TorchGraphAdapter, warm_up_on


class FakeStream:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits {other.name}")


class FakeModule:
    """Records what a TorchGraphAdapter asks of torch.cuda / torch.xpu."""

    def __init__(self):
        self.log, self.current = [], None
        self.default = FakeStream(self.log, "default")
        self.FakeGraph = lambda: SimpleNamespace(replay=lambda: None)

    def Stream(self, device):  # noqa: N802 - torch's spelling
        self.log.append("new stream")
        return FakeStream(self.log, f"side{self.log.count('new stream')}")

    def current_stream(self, device=None):
        return self.current or self.default

    def graph_pool_handle(self):
        self.log.append("new pool")
        return "pool"

    def stream(self, s):
        module = self

        class Ctx:
            def __enter__(self):
                self.saved, module.current = module.current, s

            def __exit__(self, *exc):
                module.current = self.saved
        return Ctx()

    def graph(self, g, pool, stream):
        self.log.append(f"capture on {stream.name} into {pool} (current {self.current.name})")
        return self.stream(stream)


def test_one_capture_stream_per_adapter_for_warm_up_and_every_capture():
    mod = FakeModule()
    adapter = TorchGraphAdapter(mod, "cpu", "FakeGraph", "fake-graph")
    assert mod.log == []                                # constructing touches no device
    pool = adapter.new_pool()
    for _ in range(2):                                  # two buckets
        with warm_up_on(adapter):
            mod.log.append(f"warm-up on {mod.current_stream().name}")
        adapter.capture(lambda: mod.log.append("body"), pool)
    assert mod.log.count("new stream") == 1 and mod.log.count("new pool") == 1
    assert "warm-up on side1" in mod.log and "capture on side1 into pool (current side1)" in mod.log
    assert mod.log[-1] == "default waits side1" and mod.current is None
    with warm_up_on(SimpleNamespace(name="no-stream")):  # adapters without one: a no-op
        pass
    with pytest.raises(GraphCaptureError, match="NoGraph"):
        TorchGraphAdapter(mod, "cpu", "NoGraph", "x")

    def refuse(*a, **k):
        raise RuntimeError("operation not permitted when stream is capturing")
    mod.graph = refuse
    with pytest.raises(GraphCaptureError, match="fake-graph capture failed: RuntimeError"):
        adapter.capture(lambda: None, pool)
