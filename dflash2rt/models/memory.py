"""Free memory of a device, and the check every large allocation (weights, KV caches) makes first."""

from __future__ import annotations

import torch

from ..errors import ResourceError

GB = 1e9


def available_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` in bytes, or None where it cannot be read."""
    if device.type == "cpu":
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024          # the value is in kB
        except (OSError, ValueError, IndexError):
            pass
        return None   # no /proc/meminfo (not Linux): skip the check rather than guess
    module = getattr(torch, device.type, None)
    if module is None or not hasattr(module, "mem_get_info"):
        return None   # an accelerator module without a free-memory query: cannot check
    free, _ = module.mem_get_info(device)
    if hasattr(module, "memory_reserved") and hasattr(module, "memory_allocated"):
        # blocks torch's caching allocator holds but no tensor uses are free for us too
        free += module.memory_reserved(device) - module.memory_allocated(device)
    return int(free)


def check_fits(needed: int, device: torch.device | str, what: str, lower: str | None) -> None:
    """Raise ResourceError if ``needed`` bytes exceed the memory ``device`` has free; the
    message says to lower ``lower``, or (None) that only a device with more memory helps."""
    free = available_bytes(torch.device(device))
    if free is not None and needed > free:
        raise ResourceError(f"{what} needs {needed / GB:.2f} GB but only {free / GB:.2f} GB are "
                            f"available on {device}; " + (f"lower {lower}" if lower else
                                                          "use a device with more memory"))
