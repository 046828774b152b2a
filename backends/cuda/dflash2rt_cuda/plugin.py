"""NVIDIA CUDA backend: probe, dtypes, kernels and graph mode (vendor facts only)."""

from __future__ import annotations

import torch

from dflash2rt import plugin_kit as kit
from dflash2rt.backend import Backend, BackendSpec, Probe
from dflash2rt.hookspecs import hookimpl
from dflash2rt.kernels.tuning import Tuning

NAME = "cuda"
PRIORITY = 100
PCI_VENDOR = 0x10DE
# Initial launch parameters; to be tuned on hardware (qualification reports the latency).
TUNING = Tuning(block_h=128, block_v=2048, num_warps=4)   # 32-lane warps
NODES = ("/dev/nvidia[0-9]*",)


def probe() -> Probe:
    hw = kit.hardware_summary("NVIDIA", PCI_VENDOR, *NODES)
    build = kit.torch_build()
    if getattr(torch.version, "hip", None):
        return Probe(False, f"{build} is a ROCm build: use the 'rocm' backend; {hw}")
    if not torch.version.cuda:
        return Probe(False, f"{build} has no CUDA support: install a CUDA build of torch; {hw}")
    if not torch.cuda.is_available():
        return Probe(False, f"{build}, but torch.cuda.is_available() is False (no NVIDIA GPU "
                     f"or driver visible){kit.visible_devices_note('CUDA_VISIBLE_DEVICES')}; {hw}")
    error = kit.try_allocate("cuda:0")
    if error:
        return Probe(False, f"{build}: {error}; {hw}")
    props = torch.cuda.get_device_properties(0)
    dtypes = ("float32", "float16") + (("bfloat16",) if torch.cuda.is_bf16_supported() else ())
    return Probe(
        available=True,
        device=f"cuda:0 {props.name} (sm_{props.major}{props.minor}, "
               f"{props.total_memory / 2**30:.0f} GiB)",
        kernels=kit.kernel_mode()[1], dtypes=dtypes, graphs=kit.cuda_graph_mode("CUDA"),
        details={"torch": torch.__version__, "cuda": torch.version.cuda or "",
                 "torch_device": "cuda:0"},
    )


def create(p: Probe) -> Backend:
    from dflash2rt.graphs.adapter import CudaGraphAdapter

    return kit.gpu_backend(NAME, p, tuple(getattr(torch, d) for d in p.dtypes), TUNING,
                           CudaGraphAdapter(torch.device(p.details["torch_device"])))


@hookimpl
def dflash2rt_backends() -> list[BackendSpec]:
    return [BackendSpec(name=NAME, priority=PRIORITY, probe=probe, create=create,
                        summary="NVIDIA GPUs through CUDA")]
