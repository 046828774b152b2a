"""``Ops``: a dispatch mode that records the aten ops a call dispatches (``ops.ops``)."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class Ops(TorchDispatchMode):
    """The aten ops a call dispatches (a packed product is one ``mkldnn._linear_pointwise``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))
