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
# Initial launch parameters; to be tuned on hardware (qualification reports the latency).
# Intel GPUs run 16/32-wide sub-groups; torch's XPU wheels bring pytorch-triton-xpu, and the
# PyPI triton cannot compile for Intel here, so there are no compile targets.
TRITON = TritonFacts(backend="xpu", distribution="pytorch-triton-xpu",
                     tuning={32: Tuning(block_h=128, block_v=1024, num_warps=8)})


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
    # XPU graphs are driver-sensitive (see PORTABILITY.md): opt-in, gated by the self-test.
    graphs=plugin_kit.GraphPolicy(graph_class="XPUGraph", label="XPU graphs",
                                  opt_in_env=GRAPHS_OPT_IN),
    # Peak DRAM bandwidth (GB/s) by device-name substring, from the data sheets.
    peak_gbps={"Max 1550": 3277.0, "Arc A770": 560.0},
    fp64=has_fp64, note=lambda: ("IPEX", ipex_state()[1]), finish=finish,
)


# The registry calls these (pluggy hook implementations made for VENDOR).
dflash2rt_backends, dflash2rt_gpu_vendors = plugin_kit.vendor_hooks(VENDOR)
