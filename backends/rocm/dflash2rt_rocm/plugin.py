"""AMD ROCm backend: vendor facts only (the generic probe and create are plugin_kit's)."""

from __future__ import annotations

from dflash2rt import plugin_kit
from dflash2rt.kernels.tuning import TritonFacts, Tuning

VENDOR = plugin_kit.GpuVendor(
    name="rocm", priority=90, summary="AMD GPUs through ROCm/HIP",
    vendor="AMD", pci_vendor=0x1002, device_nodes=("/dev/kfd",),
    # ROCm masks devices at two levels: the runtime (ROCR_) and HIP (HIP_, CUDA_ as an alias).
    visible_env=("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
    torch_device="cuda", build="hip", build_label="ROCm/HIP", other_builds=(),
    driver_hint="no AMD GPU or amdgpu driver visible",
    describe="{p.name} ({p.gcnArchName}, {gib:.0f} GiB)",
    dtypes=("float32", "float16", "bfloat16"), bf16_if_supported=False,
    # Initial launch parameters by warp size; to be tuned on hardware (qualification reports
    # the latency). CDNA runs 64-lane wavefronts, RDNA wave32 (props.warp_size says which).
    triton=TritonFacts(backend="hip", distribution="pytorch-triton-rocm",
                       tuning={64: Tuning(block_h=256, block_v=2048, num_warps=4),
                               32: Tuning(block_h=256, block_v=2048, num_warps=8)},
                       compile_targets={"gfx942": ("gfx942", 64), "gfx90a": ("gfx90a", 64),
                                        "gfx1100": ("gfx1100", 32)}),
    graphs=plugin_kit.GraphPolicy(graph_class="CUDAGraph", label="HIP graphs"),
    # Peak DRAM bandwidth (GB/s) by device-name substring, from the data sheets.
    peak_gbps={"MI300X": 5300.0, "MI250X": 3277.0},
)


# The registry calls these (pluggy hook implementations made for VENDOR).
dflash2rt_backends, dflash2rt_gpu_vendors = plugin_kit.vendor_hooks(VENDOR)
