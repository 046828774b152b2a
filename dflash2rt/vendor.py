"""A GPU vendor, declared as data: everything the generic probe and create need to know.

A leaf of the plugin contract: ``hookspecs`` (the ``dflash2rt_gpu_vendors`` hook returns these)
and ``plugin_kit`` (the machinery they drive) both import it, and it imports neither. Plugins
use it as ``plugin_kit.GpuVendor`` / ``plugin_kit.GraphPolicy``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from .kernels.tuning import TritonFacts

if TYPE_CHECKING:
    from .backend import Backend
    from .graphs.adapter import TorchGraphAdapter


@dataclass(frozen=True)
class GraphPolicy:
    """How a vendor captures graphs. ``graph_class``: the graph class of the vendor's torch
    device module (``"CUDAGraph"`` of ``torch.cuda`` on CUDA and ROCm, ``"XPUGraph"`` of
    ``torch.xpu``); ``label``: what reports call them; ``opt_in_env``: when set, capture stays
    off unless that variable is ``"1"``. At probe time every vendor runs the graph self-test
    (``plugin_kit.selftest``) on its adapter with the backend's ops; it returns None when replay
    == eager on fresh inputs, else why not (capture is then off and reported). ``self_test``
    replaces it (tests)."""

    graph_class: str
    label: str
    opt_in_env: str = ""
    self_test: Callable[["TorchGraphAdapter", "Backend"], str | None] | None = None


@dataclass(frozen=True)
class GpuVendor:
    """One GPU backend's vendor facts.

    ``name``, ``priority``, ``summary``: the backend row. ``vendor``, ``pci_vendor``,
    ``device_nodes``: what the hardware line looks for. ``visible_env``: the device-visibility
    variables quoted when no device shows. ``torch_device``: the torch device type ("cuda" on
    CUDA and ROCm builds, "xpu"); ``build``: the ``torch.version`` attribute a suitable build
    sets ("cuda", "hip", "xpu"), called ``build_label`` in messages; ``other_builds``: (attribute,
    backend to use instead) for builds that expose the same device type for another vendor;
    ``driver_hint``: what is missing when the device type is unavailable. ``describe``: the device
    line, formatted with ``p`` (the device properties) and ``gib``. ``dtypes``: the dtypes it
    runs, bfloat16 kept only where ``torch.<device>.is_bf16_supported()`` when
    ``bf16_if_supported``. ``triton``: its Triton backend, distribution, tuning by warp size and
    compile targets. ``graphs``: its graph policy. ``peak_gbps``: peak DRAM bandwidth by
    device-name substring (vendor data sheets). Vendor code, where there is some: ``fp64`` reads
    float64 support from the device properties (None: supported), ``note`` gives a (label,
    text) added to probe reasons and the kernels line, ``finish`` runs on the created backend.
    """

    name: str
    priority: int
    summary: str
    vendor: str
    pci_vendor: int
    device_nodes: tuple[str, ...]
    visible_env: tuple[str, ...]
    torch_device: str
    build: str
    build_label: str
    driver_hint: str
    triton: TritonFacts
    graphs: GraphPolicy
    describe: str = "{p.name} ({gib:.0f} GiB)"
    dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16")
    bf16_if_supported: bool = False
    other_builds: tuple[tuple[str, str], ...] = ()
    peak_gbps: Mapping[str, float] = field(default_factory=dict)
    fp64: Callable[[Any], bool] | None = None
    note: Callable[[], tuple[str, str]] | None = None
    finish: Callable[["Backend"], None] | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.dtypes or not self.device_nodes:
            raise ValueError(f"GpuVendor {self.name!r} needs a name, dtypes and device nodes")

    def peak_bandwidth(self, device_name: str) -> float | None:
        """Peak GB/s of the device called ``device_name``, when this vendor lists it."""
        return next((v for k, v in self.peak_gbps.items() if k in device_name), None)
