"""Free memory of a device, and the check every large allocation (weights, KV caches) makes first."""

from __future__ import annotations

import torch

from ..errors import ResourceError

GB = 1e9


# Why a device's free memory was estimated or not checked, per device (each said once): the
# engine reports these as standing fallbacks of its runs.
NOTES: dict[str, str] = {}
SYSMAN_HINT = ("on Intel GPUs the free-memory query needs Level Zero Sysman: set "
               "ZES_ENABLE_SYSMAN=1 before starting Python")


def available_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` in bytes, or None where it cannot be read. An accelerator whose
    free-memory query raises (some XPU drivers without Sysman) is estimated as its total memory
    less what torch has reserved, and ``NOTES`` says so; a device with neither query is not
    checked (None), and ``NOTES`` says that."""
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
        NOTES[str(device)] = (f"free memory of {device} not checked: torch.{device.type} has no "
                              "mem_get_info")
        return None
    try:
        free, _ = module.mem_get_info(device)
    except Exception as exc:  # noqa: BLE001 - the driver's refusal becomes an estimate
        return _estimate(module, device, f"{type(exc).__name__}: {exc}")
    if hasattr(module, "memory_reserved") and hasattr(module, "memory_allocated"):
        # blocks torch's caching allocator holds but no tensor uses are free for us too
        free += module.memory_reserved(device) - module.memory_allocated(device)
    return int(free)


def _estimate(module, device: torch.device, why: str) -> int | None:
    """total − reserved (other processes' use unseen), or None where even that is unreadable."""
    hint = f"; {SYSMAN_HINT}" if device.type == "xpu" else ""
    try:
        total = int(module.get_device_properties(device).total_memory)
        reserved = int(module.memory_reserved(device)) if hasattr(module, "memory_reserved") \
            else 0
    except Exception as exc:  # noqa: BLE001 - nothing to estimate from
        NOTES[str(device)] = (f"free memory of {device} not checked: torch.{device.type}."
                              f"mem_get_info raised {why}, and the total could not be read "
                              f"({type(exc).__name__}: {exc}){hint}")
        return None
    NOTES[str(device)] = (f"free memory of {device} estimated as total - reserved "
                          f"({(total - reserved) / GB:.2f} GB; other processes' use not seen): "
                          f"torch.{device.type}.mem_get_info raised {why}{hint}")
    return total - reserved


def memory_note(device: torch.device | str) -> str | None:
    """Why ``device``'s free memory was estimated or not checked (None: it was read)."""
    return NOTES.get(str(torch.device(device)))


def check_fits(needed: int, device: torch.device | str, what: str, lower: str | None) -> None:
    """Raise ResourceError if ``needed`` bytes exceed the memory ``device`` has free; the
    message says to lower ``lower``, or (None) that only a device with more memory helps."""
    free = available_bytes(torch.device(device))
    if free is not None and needed > free:
        note = memory_note(device)
        raise ResourceError(f"{what} needs {needed / GB:.2f} GB but only {free / GB:.2f} GB are "
                            f"available on {device}" + (f" ({note})" if note else "") + "; "
                            + (f"lower {lower}" if lower else "use a device with more memory"))
