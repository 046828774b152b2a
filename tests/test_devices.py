"""One device of several: "name:index" selects it, the engine refuses models on another device
of the same type, and the same-device test reads indices (none: the current device)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dflash2rt.backend import BackendSpec, Probe, TorchOpsBackend, same_device
from dflash2rt.engine.engine import Engine
from dflash2rt.errors import BackendUnavailableError, InvalidInputError
from dflash2rt.hookspecs import hookimpl
from dflash2rt.registry import Registry, split_device


def test_same_device_compares_indices(monkeypatch):
    assert same_device("cpu", "cpu") and same_device("cpu", torch.device("cpu"))
    assert not same_device("cuda:0", "cuda:1") and not same_device("cuda:0", "xpu:0")
    assert same_device("cuda:1", torch.device("cuda", 1))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert same_device("cuda", "cuda:1") and not same_device("cuda", "cuda:0")


def test_split_device():
    assert split_device("cuda:1") == ("cuda", 1) and split_device("cuda") == ("cuda", None)
    assert split_device("triton-interpret") == ("triton-interpret", None)
    assert split_device("weird:x") == ("weird:x", None)


class _Plugin:
    """Two devices behind one backend name; probe() is device 0, the current one."""

    def __init__(self) -> None:
        self.probed: list[int] = []

    def _probe(self, index: int) -> Probe:
        self.probed.append(index)
        if index > 1:
            return Probe(False, f"there is no fx:{index}")
        return Probe(True, device=f"fx device {index}", dtypes=("float32",),
                     details={"torch_device": f"cuda:{index}"})

    @hookimpl
    def dflash2rt_backends(self):
        return [BackendSpec("fx", 5, lambda: self._probe(0),
                            lambda p: TorchOpsBackend("fx", p.details["torch_device"],
                                                      (torch.float32,)),
                            probe_device=self._probe),
                BackendSpec("single", 4, lambda: Probe(True, device="one"),
                            lambda p: TorchOpsBackend("single", "cpu", (torch.float32,)))]


def test_name_index_selects_and_probes_that_device():
    reg, plugin = Registry(), _Plugin()
    reg.register(plugin, "fx-plugin")
    sel = reg.select("fx:1")
    assert sel.name == "fx:1" and sel.backend.device == torch.device("cuda:1")
    assert plugin.probed == [1]
    assert reg.select("fx").backend.device == torch.device("cuda:0")
    with pytest.raises(BackendUnavailableError, match="there is no fx:2"):
        reg.select("fx:2")
    with pytest.raises(BackendUnavailableError, match="has no devices to choose from"):
        reg.select("single:1")


def test_engine_refuses_models_on_another_device_of_the_type():
    """A pair on cuda:0 and a backend on cuda:1 (checked before anything runs: no GPU needed)."""
    backend = TorchOpsBackend("fx", "cuda:1", (torch.float32,))
    module = torch.nn.Linear(1, 1)
    pair = SimpleNamespace(dtype=torch.float32, device=torch.device("cuda:0"), target=module,
                           draft=None)
    with pytest.raises(InvalidInputError, match="models are on cuda:0 but backend 'fx' runs on "
                                                "cuda:1"):
        Engine(pair, backend)
    pair.device = torch.device("cuda:1")
    assert Engine(pair, backend).backend is backend
