"""Intel XPU backend: probe, dtypes, kernels, graph mode and optional IPEX (vendor facts only)."""

from __future__ import annotations

from importlib import metadata

import torch

from dflash2rt import plugin_kit as kit
from dflash2rt.backend import Backend, BackendSpec, Probe
from dflash2rt.hookspecs import hookimpl
from dflash2rt.kernels.tuning import Tuning

NAME = "xpu"
PRIORITY = 80
PCI_VENDOR = 0x8086
# Initial launch parameters; to be tuned on hardware (qualification reports the latency).
TUNING = Tuning(block_h=128, block_v=1024, num_warps=8)    # 16/32-wide sub-groups
NODES = ("/dev/dri/renderD*",)
IPEX = "intel-extension-for-pytorch"


def ipex_status() -> str:
    """IPEX is optional: say whether it is installed and matches torch (it needs the same x.y)."""
    try:
        version = metadata.version(IPEX)
    except metadata.PackageNotFoundError:
        return "not installed (optional; upstream torch.xpu is used)"
    want = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    have = ".".join(version.split("+")[0].split(".")[:2])
    if have != want:
        return f"{version} installed but unusable: it needs torch {have}.x, this is torch {want}"
    return f"{version} (compatible)"


def probe() -> Probe:
    hw = kit.hardware_summary("Intel", PCI_VENDOR, *NODES)
    build = kit.torch_build()
    ipex = ipex_status()
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not getattr(torch.version, "xpu", None):
        return Probe(False, f"{build} has no XPU support: install an XPU build of torch; "
                     f"IPEX {ipex}; {hw}")
    if not xpu.is_available():
        return Probe(False, f"{build}, but torch.xpu.is_available() is False (no Intel GPU or "
                     f"Level Zero driver visible){kit.visible_devices_note('ZE_AFFINITY_MASK')}; "
                     f"IPEX {ipex}; {hw}")
    error = kit.try_allocate("xpu:0")
    if error:
        return Probe(False, f"{build}: {error}; {hw}")
    props = xpu.get_device_properties(0)
    dtypes = ("float32", "float16", "bfloat16")
    return Probe(
        available=True,
        device=f"xpu:0 {props.name} ({props.total_memory / 2**30:.0f} GiB)",
        kernels=kit.kernel_mode()[1], dtypes=dtypes,
        graphs=kit.EAGER_GRAPHS + " (XPU graphs will be opt-in, gated by replay == eager)",
        details={"torch": torch.__version__, "xpu": getattr(torch.version, "xpu", "") or "",
                 "ipex": ipex, "torch_device": "xpu:0"},
    )


def create(p: Probe) -> Backend:
    return kit.gpu_backend(NAME, p, tuple(getattr(torch, d) for d in p.dtypes), TUNING)


@hookimpl
def dflash2rt_backends() -> list[BackendSpec]:
    return [BackendSpec(name=NAME, priority=PRIORITY, probe=probe, create=create,
                        summary="Intel GPUs through torch.xpu (IPEX optional)")]
