"""Host values onto a device in one transfer: several host tensors' bytes in one copy."""

from __future__ import annotations

from typing import Callable

import torch

ALIGN = 16          # each tensor's bytes start at a multiple of this in the packed buffer


def pack(*host: torch.Tensor) -> tuple[torch.Tensor, Callable[[torch.Tensor], list]]:
    """Host tensors → (one uint8 host buffer holding their bytes, each ALIGN-aligned; a function
    that views a copy of that buffer back as the tensors, with their dtypes and shapes)."""
    sizes = [t.numel() * t.element_size() for t in host]
    starts, end = [], 0
    for n in sizes:
        starts.append(end)
        end += -(-n // ALIGN) * ALIGN
    buf = torch.empty(max(end, ALIGN), dtype=torch.uint8)                # [bytes]
    for t, at, n in zip(host, starts, sizes):
        if n:
            buf[at:at + n].view(t.dtype).copy_(t.reshape(-1))

    def views(on: torch.Tensor) -> list[torch.Tensor]:
        return [on[at:at + n].view(t.dtype).view(t.shape)
                for t, at, n in zip(host, starts, sizes)]
    return buf, views


def to_device(device: torch.device | str, *host: torch.Tensor) -> list[torch.Tensor]:
    """Host tensors → the same values on ``device``, new tensors, through ONE host→device copy
    (each copy from pageable memory waits for the device): ``pack``, copy, view back. On the
    CPU: the host tensors themselves (no transfer)."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return list(host)
    buf, views = pack(*host)
    return views(buf.to(dev))                                          # the one transfer
