"""Intel XPU backend: vendor facts, plus what only Intel needs: the optional IPEX pass, opt-in
XPU graphs (gated by plugin_kit's graph self-test, as every vendor's) and float64 support read
from the device."""

from __future__ import annotations

from importlib import metadata
from typing import Any

import torch

from dflash2rt import plugin_kit
from dflash2rt.backend import Backend
from dflash2rt.kernels.tuning import TritonFacts, Tuning

IPEX = "intel-extension-for-pytorch"
GRAPHS_OPT_IN = "DFLASH2RT_XPU_GRAPHS"
# Intel's Triton takes as its target (GPUTarget.arch) the device-property dict that
# torch.xpu.get_device_capability() returns; of it, its compiler reads the keys below (code
# generation uses the sub-group sizes and the has_subgroup_* / bfloat16 flags). The values are
# those the two devices report through torch.xpu.
MAX_1550 = {  # Data Center GPU Max 1550 (Ponte Vecchio, Xe-HPC): float64, DPAS, 2D block loads
    "name": "Intel(R) Data Center GPU Max 1550", "vendor": "Intel(R) Corporation",
    "max_work_group_size": 1024, "max_num_sub_groups": 64, "sub_group_sizes": [16, 32],
    "has_fp64": True, "has_subgroup_matrix_multiply_accumulate": True,
    "has_subgroup_matrix_multiply_accumulate_tensor_float32": True,
    "has_subgroup_2d_block_io": True, "has_bfloat16_conversions": True,
}
ARC_A770 = {  # Arc A770 (Alchemist DG2, Xe-HPG): no float64, 8-wide DPAS, no 2D block loads
    "name": "Intel(R) Arc(TM) A770 Graphics", "vendor": "Intel(R) Corporation",
    "max_work_group_size": 1024, "max_num_sub_groups": 128, "sub_group_sizes": [8, 16, 32],
    "has_fp64": False, "has_subgroup_matrix_multiply_accumulate": True,
    "has_subgroup_matrix_multiply_accumulate_tensor_float32": False,
    "has_subgroup_2d_block_io": False, "has_bfloat16_conversions": True,
}
# Initial launch parameters; to be tuned on hardware (qualification reports the latency).
# Intel GPUs run 8/16/32-wide sub-groups; launches without threads_per_warp use 32, the "warp"
# here. torch's XPU wheels bring pytorch-triton-xpu; the PyPI triton has no Intel backend, so
# the compile targets (SPIR-V, without a device) need Intel's Triton: compile_env.sh.
TRITON = TritonFacts(backend="xpu", distribution="pytorch-triton-xpu",
                     tuning={32: Tuning(block_h=128, block_v=1024, num_warps=8)},
                     compile_targets={"pvc": (MAX_1550, 32), "dg2": (ARC_A770, 32)})


def ipex_state() -> tuple[bool | None, str]:
    """IPEX is optional: (usable — None when not installed —, what to report). It must match
    torch's major.minor, as IPEX releases are built against one torch release."""
    try:
        version = metadata.version(IPEX)
    except metadata.PackageNotFoundError:
        return None, "not installed (optional; upstream torch.xpu is used)"
    want = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    have = ".".join(version.split("+")[0].split(".")[:2])
    if have != want:
        return False, (f"{version} installed but not used: it needs torch {have}.x, this is "
                       f"torch {want}")
    return True, f"{version} (compatible): ipex.optimize runs on the target and draft"


def ipex_pass(modules: list[torch.nn.Module]) -> str:
    """``ipex.optimize`` each model in place, in its own dtype (eval mode)."""
    import intel_extension_for_pytorch as ipex

    for m in modules:
        dtype = next(m.parameters()).dtype
        ipex.optimize(m.eval(), dtype=dtype, inplace=True)
    return f"ipex {metadata.version(IPEX)}: ipex.optimize on {len(modules)} model(s)"


def finish(backend: Backend) -> None:
    """Use IPEX where it matches torch; report it where it is installed but does not."""
    usable, ipex = ipex_state()
    if usable:
        backend.model_pass = ipex_pass
    elif usable is False:
        backend.report_fallback(f"IPEX {ipex}")


def has_fp64(props: Any) -> bool:
    """Some Intel GPUs (Arc) have no float64 units: torch.xpu reports it per device."""
    return bool(getattr(props, "has_fp64", True))


VENDOR = plugin_kit.GpuVendor(
    name="xpu", priority=80, summary="Intel GPUs through torch.xpu (IPEX optional)",
    vendor="Intel", pci_vendor=0x8086, device_nodes=("/dev/dri/renderD*",),
    # oneAPI selects devices with ONEAPI_DEVICE_SELECTOR; Level Zero masks them with
    # ZE_AFFINITY_MASK.
    visible_env=("ONEAPI_DEVICE_SELECTOR", "ZE_AFFINITY_MASK"),
    torch_device="xpu", build="xpu", build_label="XPU",
    driver_hint="no Intel GPU or Level Zero driver visible",
    describe="{p.name} ({gib:.0f} GiB)", dtypes=("float32", "float16", "bfloat16"),
    triton=TRITON,
    # XPU graphs are driver-sensitive (docs/portability.md): opt-in, gated by the self-test.
    graphs=plugin_kit.GraphPolicy(graph_class="XPUGraph", label="XPU graphs",
                                  opt_in_env=GRAPHS_OPT_IN),
    # Peak DRAM bandwidth (GB/s) by device-name substring, from the data sheets.
    peak_gbps={"Max 1550": 3277.0, "Arc A770": 560.0},
    fp64=has_fp64, note=lambda: ("IPEX", ipex_state()[1]), finish=finish,
)


# The registry calls these (pluggy hook implementations made for VENDOR).
dflash2rt_backends, dflash2rt_gpu_vendors = plugin_kit.vendor_hooks(VENDOR)
