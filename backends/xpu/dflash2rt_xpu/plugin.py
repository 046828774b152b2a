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


GRAPHS_OPT_IN = "DFLASH2RT_XPU_GRAPHS"


def graph_self_test(device: str) -> str | None:
    """Capture and replay a small step; None when replay == eager, else why not."""
    import os

    if os.environ.get(GRAPHS_OPT_IN) != "1":
        return f"off by default: set {GRAPHS_OPT_IN}=1 to opt in (gated by replay == eager)"
    if not kit.graphs_wanted():
        return f"off ({kit.GRAPHS_ENV}=0)"
    from dflash2rt.graphs.adapter import GraphCaptureError, XpuGraphAdapter

    try:
        adapter = XpuGraphAdapter(torch.device(device))
        x = torch.arange(64, dtype=torch.float32, device=device)
        out = {}

        def step() -> None:
            out["y"] = torch.cumsum(x * 2 + 1, 0)

        step()
        graph = adapter.capture(step, adapter.new_pool())
        x.add_(1)
        graph.replay()
        torch.xpu.current_stream().synchronize()   # stream-level sync (device sync has crashed)
        if not torch.equal(out["y"].cpu(), torch.cumsum((x * 2 + 1).cpu(), 0)):
            return "self-test failed: XPU graph replay != eager"
    except GraphCaptureError as exc:
        return f"self-test failed: {exc}"
    except Exception as exc:  # noqa: BLE001 - the reason is the result
        return f"self-test failed: {type(exc).__name__}: {exc}"
    return None


# oneAPI selects devices with ONEAPI_DEVICE_SELECTOR; Level Zero masks them with ZE_AFFINITY_MASK.
VISIBLE = ("ONEAPI_DEVICE_SELECTOR", "ZE_AFFINITY_MASK")


def probe() -> Probe:
    hw = kit.hardware_summary("Intel", PCI_VENDOR, *NODES)
    build = kit.torch_build()
    ipex = ipex_state()[1]
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not getattr(torch.version, "xpu", None):
        return Probe(False, f"{build} has no XPU support: install an XPU build of torch; "
                     f"IPEX {ipex}; {hw}")
    if not xpu.is_available():
        return Probe(False, f"{build}, but torch.xpu.is_available() is False (no Intel GPU or "
                     f"Level Zero driver visible){kit.visible_devices_note(*VISIBLE)}; "
                     f"IPEX {ipex}; {hw}")
    error = kit.try_allocate("xpu:0")
    if error:
        return Probe(False, f"{build}: {error}; {hw}")
    props = xpu.get_device_properties(0)
    dtypes = ("float32", "float16", "bfloat16")
    return Probe(
        available=True,
        device=f"xpu:0 {props.name} ({props.total_memory / 2**30:.0f} GiB)",
        kernels=f"{kit.kernel_mode()[1]}; IPEX {ipex}", dtypes=dtypes,
        graphs=graph_self_test("xpu:0") or "XPU graphs (torch.xpu.XPUGraph), self-test passed",
        details={"torch": torch.__version__, "xpu": getattr(torch.version, "xpu", "") or "",
                 "ipex": ipex, "torch_device": "xpu:0"},
    )


def create(p: Probe) -> Backend:
    adapter = None
    if p.graphs.startswith("XPU graphs"):
        from dflash2rt.graphs.adapter import XpuGraphAdapter

        adapter = XpuGraphAdapter(torch.device(p.details["torch_device"]))
    backend = kit.gpu_backend(NAME, p, tuple(getattr(torch, d) for d in p.dtypes), TUNING,
                              adapter)
    if adapter is None:
        backend.report_fallback(f"XPU graphs not used: {p.graphs}")
    usable, ipex = ipex_state()
    if usable:
        backend.model_pass = ipex_pass
    elif usable is False:
        backend.report_fallback(f"IPEX {ipex}")
    return backend


@hookimpl
def dflash2rt_backends() -> list[BackendSpec]:
    return [BackendSpec(name=NAME, priority=PRIORITY, probe=probe, create=create,
                        summary="Intel GPUs through torch.xpu (IPEX optional)")]
