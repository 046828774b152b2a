"""NVIDIA CUDA backend: vendor facts only (the generic probe and create are plugin_kit's)."""

from __future__ import annotations

from dflash2rt import plugin_kit
from dflash2rt.kernels.tuning import TritonFacts, Tuning

VENDOR = plugin_kit.GpuVendor(
    name="cuda", priority=100, summary="NVIDIA GPUs through CUDA",
    vendor="NVIDIA", pci_vendor=0x10DE, device_nodes=("/dev/nvidia[0-9]*",),
    visible_env=("CUDA_VISIBLE_DEVICES",),
    torch_device="cuda", build="cuda", build_label="CUDA", other_builds=(("hip", "rocm"),),
    driver_hint="no NVIDIA GPU or driver visible",
    describe="{p.name} (sm_{p.major}{p.minor}, {gib:.0f} GiB)",
    dtypes=("float32", "float16", "bfloat16"), bf16_if_supported=True,
    # Initial launch parameters by warp size; to be tuned on hardware (qualification reports
    # the latency). NVIDIA warps are 32 lanes.
    triton=TritonFacts(backend="cuda", distribution="triton",
                       tuning={32: Tuning(block_h=128, block_v=2048, num_warps=4)},
                       compile_targets={"sm90": (90, 32), "sm80": (80, 32)}),
    graphs=plugin_kit.GraphPolicy(graph_class="CUDAGraph", label="CUDA graphs"),
    # Peak DRAM bandwidth (GB/s) by device-name substring, from the data sheets.
    peak_gbps={"H200": 4800.0, "H100": 3350.0, "A100": 2039.0, "L40S": 864.0},
)


# The registry calls these (pluggy hook implementations made for VENDOR).
dflash2rt_backends, dflash2rt_gpu_vendors = plugin_kit.vendor_hooks(VENDOR)
