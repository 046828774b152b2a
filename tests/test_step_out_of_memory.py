"""A step that runs out of device memory (the KV caches were checked before the run; a step's
working set, prefill's activations or a block's logits, was not) ends the run with a
ResourceError that names the run and says what to lower, keeping the device's own message;
any other failure in a step passes through unchanged, and the engine stays usable."""

from __future__ import annotations

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.errors import ResourceError

from tiny_models import tiny_pair

DEVICE_MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)"


def _reqs(n: int) -> list[Request]:
    return [Request((1 + i, 2, 3), SamplingParams(max_new_tokens=6)) for i in range(n)]


def _failing_forward(monkeypatch, pair, exc: BaseException, on_call: int) -> None:
    real = type(pair.target).forward
    calls = {"n": 0}

    def forward(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == on_call:
            raise exc
        return real(self, *a, **kw)

    monkeypatch.setattr(type(pair.target), "forward", forward)


@pytest.mark.parametrize("on_call, where", [(1, "prefill"), (2, "the first decode step")])
def test_out_of_memory_in_a_step_is_a_resource_error_saying_what_to_lower(
        monkeypatch, on_call, where):
    pair = tiny_pair()
    eng = Engine(pair, get_backend("cpu"))
    _failing_forward(monkeypatch, pair, torch.OutOfMemoryError(DEVICE_MESSAGE + "\nmore"),
                     on_call)
    with pytest.raises(ResourceError) as info:
        eng.generate(_reqs(3), block_size=4)
    msg = str(info.value)
    assert "cpu ran out of memory during a step of a run of 3 requests" in msg, where
    assert f"({DEVICE_MESSAGE})" in msg                 # its first line, not the rest
    assert "more" not in msg.replace("memory", "")
    assert "lower the number of prompts" in msg and "block_size" in msg
    assert isinstance(info.value, MemoryError)
    assert isinstance(info.value.__cause__, torch.OutOfMemoryError)


def test_other_failures_in_a_step_pass_through_and_the_engine_goes_on(monkeypatch):
    pair = tiny_pair()
    eng = Engine(pair, get_backend("cpu"))
    good, _ = eng.generate(_reqs(2), block_size=4)
    real = type(pair.target).forward
    _failing_forward(monkeypatch, pair, RuntimeError("a kernel failed"), 2)
    with pytest.raises(RuntimeError, match="^a kernel failed$") as info:
        eng.generate(_reqs(2), block_size=4)
    assert not isinstance(info.value, ResourceError)
    monkeypatch.setattr(type(pair.target), "forward", real)
    again, _ = eng.generate(_reqs(2), block_size=4)
    assert [o.token_ids for o in again] == [o.token_ids for o in good]


def test_an_out_of_memory_error_without_a_message_is_named_by_its_type(monkeypatch):
    pair = tiny_pair()
    eng = Engine(pair, get_backend("cpu"))
    _failing_forward(monkeypatch, pair, torch.OutOfMemoryError(), 1)
    with pytest.raises(ResourceError, match=r"1 requests \(OutOfMemoryError\)"):
        eng.generate(_reqs(1), block_size=4)
