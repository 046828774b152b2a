"""AMD ROCm backend: probe, dtypes, kernels and graph mode (vendor facts only)."""

from __future__ import annotations

import torch

from dflash2rt import plugin_kit as kit
from dflash2rt.backend import Backend, BackendSpec, Probe
from dflash2rt.hookspecs import hookimpl
from dflash2rt.kernels.tuning import Tuning

NAME = "rocm"
PRIORITY = 90
PCI_VENDOR = 0x1002
# Initial launch parameters; to be tuned on hardware (qualification reports the latency).
TUNING = Tuning(block_h=256, block_v=2048, num_warps=4)   # 64-lane wavefronts
NODES = ("/dev/kfd",)


# ROCm masks devices at two levels: the runtime (ROCR_) and HIP (HIP_, and CUDA_ as an alias).
VISIBLE = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def probe() -> Probe:
    hw = kit.hardware_summary("AMD", PCI_VENDOR, *NODES)
    build = kit.torch_build()
    if not getattr(torch.version, "hip", None):
        return Probe(False, f"{build} has no ROCm/HIP support: install a ROCm build of torch; {hw}")
    if not torch.cuda.is_available():  # ROCm builds expose the 'cuda' device type
        return Probe(False, f"{build}, but torch.cuda.is_available() is False (no AMD GPU or "
                     f"amdgpu driver visible){kit.visible_devices_note(*VISIBLE)}; {hw}")
    error = kit.try_allocate("cuda:0")
    if error:
        return Probe(False, f"{build}: {error}; {hw}")
    props = torch.cuda.get_device_properties(0)
    arch = getattr(props, "gcnArchName", "?")
    return Probe(
        available=True,
        device=f"cuda:0 {props.name} ({arch}, {props.total_memory / 2**30:.0f} GiB)",
        kernels=kit.kernel_mode()[1], dtypes=("float32", "float16", "bfloat16"),
        graphs=kit.cuda_graph_mode("HIP"),
        details={"torch": torch.__version__, "hip": torch.version.hip or "",
                 "torch_device": "cuda:0"},
    )


def create(p: Probe) -> Backend:
    from dflash2rt.graphs.adapter import CudaGraphAdapter

    return kit.gpu_backend(NAME, p, tuple(getattr(torch, d) for d in p.dtypes), TUNING,
                           CudaGraphAdapter(torch.device(p.details["torch_device"])))


@hookimpl
def dflash2rt_backends() -> list[BackendSpec]:
    return [BackendSpec(name=NAME, priority=PRIORITY, probe=probe, create=create,
                        summary="AMD GPUs through ROCm/HIP")]
