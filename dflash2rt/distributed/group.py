"""Process groups of a tensor-parallel run: which torch.distributed backend a device type uses,
joining the group (from torchrun's environment or from ``launch.spawn``'s), and the run's
``TPGroup`` (rank, world size, the device group the model's collectives use, and a gloo group
on the host for the decisions and checks the ranks exchange).

Every group is made with a timeout: a collective that waits longer (a rank that died or hangs)
raises on the ranks still alive instead of hanging them (gloo enforces it in every collective;
NCCL / XCCL through torch's watchdog, see docs/tensor-parallel.md).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import DistributedError

# torch.distributed backend per device type. ROCm builds of torch report "cuda" devices and
# serve "nccl" with RCCL; Intel XPU uses oneCCL through "xccl" (torch >= 2.8).
PG_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "xpu": "xccl"}
DEFAULT_TIMEOUT_S = 300.0
TIMEOUT_ENV = "DFLASH2RT_TP_TIMEOUT"      # seconds; the timeout of every collective


def pg_backend(device_type: str) -> str:
    """The torch.distributed backend of a device type (typed error for one with none)."""
    if device_type not in PG_BACKENDS:
        raise DistributedError(f"no torch.distributed backend for device type {device_type!r} "
                               f"(tensor parallelism runs on {', '.join(PG_BACKENDS)})")
    return PG_BACKENDS[device_type]


def default_timeout() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    try:
        return DEFAULT_TIMEOUT_S if raw is None else float(raw)
    except ValueError:
        raise DistributedError(f"${TIMEOUT_ENV} must be a number of seconds, got {raw!r}")


@dataclass(frozen=True)
class TPGroup:
    """One rank's view of a tensor-parallel run."""

    rank: int
    world: int
    group: object           # the device group: the model's all-reduces and all-gathers
    host_group: object      # gloo on the host: schedule choices, the step hash check
    backend: str            # the device group's torch.distributed backend
    timeout_s: float
    check: bool = False     # all-reduce a hash of each step's committed tokens (debug mode)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_world() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) from torchrun's environment, or None outside one."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return None
    try:
        return (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
    except ValueError:
        raise DistributedError("RANK, WORLD_SIZE and LOCAL_RANK must be integers "
                               f"(got {os.environ.get('RANK')!r}, "
                               f"{os.environ.get('WORLD_SIZE')!r}, "
                               f"{os.environ.get('LOCAL_RANK')!r})")


def join(device: torch.device, tp: int, timeout_s: float | None = None, check: bool = False
         ) -> TPGroup:
    """This process's TPGroup: the default process group if one is up (it must have ``tp``
    ranks), else one initialised from the environment (``env://``: RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT, as torchrun and ``launch.spawn`` set them) with the backend of
    ``device``'s type and a timeout on every collective."""
    timeout_s = default_timeout() if timeout_s is None else float(timeout_s)
    backend = pg_backend(torch.device(device).type)
    timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        world = env_world()
        if world is None:
            raise DistributedError(f"tp={tp} needs a process group: run under torchrun, or let "
                                   "dflash2rt.run(tp=N) spawn the ranks")
        rank, size, _ = world
        if size != tp:
            raise DistributedError(f"tp={tp} but WORLD_SIZE={size}: launch as many ranks as tp")
        kw = {"device_id": torch.device(device)} if backend != "gloo" else {}
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=size,
                                timeout=timeout, **kw)
    if dist.get_world_size() != tp:
        raise DistributedError(f"tp={tp} but the process group has {dist.get_world_size()} ranks")
    group = dist.group.WORLD
    used = dist.get_backend(group)
    host = group if used == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    return TPGroup(dist.get_rank(), tp, group, host, used, timeout_s, check)
