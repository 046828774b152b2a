"""What the vendor plugins share: a vendor declared as data (``GpuVendor``), and the generic
machinery it drives.

Words, as every report uses them: a backend runs each op as a *triton kernel*, as *torch ops* or
in the *triton interpreter* (``Backend.implementation``). When a GPU backend's triton kernels
cannot run (wrong Triton target, a failed smoke launch, no triton, ``TRITON_INTERPRET=1``), it runs
torch ops and reports a *kernel fallback*; reports made at creation are *standing* fallbacks,
shown by ``dflash2rt backends`` and in every run's stats. A *probe* looks at the machine and
never builds a backend; *create* builds it from a probe.

- ``GpuVendor`` and ``GraphPolicy`` (the data a plugin declares): defined in ``dflash2rt.vendor``,
  a leaf that ``hookspecs`` imports too, re-exported here.
- ``generic``: ``probe(v)``, ``create(v, p)``, ``backend_spec(v)``, ``vendor_hooks(v)``,
  ``graph_mode``.
- ``build``: ``gpu_backend`` (triton kernels or a kernel fallback), ``kernel_mode``.
- ``hardware``: PCI devices, device nodes, the torch build, a test allocation.
"""

from __future__ import annotations

from ..kernels.tuning import INTERPRET_REASON, TritonFacts, Tuning, interpreting
from .build import GRAPHS_ENV, gpu_backend, graphs_wanted, kernel_mode
from .generic import backend_spec, create, graph_mode, probe, vendor_hooks
from .selftest import graph_self_test
from .hardware import (device_nodes, hardware_summary, pci_devices, torch_build, try_allocate,
                       visible_devices_note)
from ..vendor import GpuVendor, GraphPolicy

__all__ = ["GRAPHS_ENV", "INTERPRET_REASON", "GpuVendor", "GraphPolicy", "TritonFacts", "Tuning",
           "backend_spec", "create", "device_nodes", "gpu_backend", "graph_mode",
           "graph_self_test",
           "graphs_wanted", "hardware_summary", "interpreting", "kernel_mode", "pci_devices",
           "probe", "torch_build", "try_allocate", "vendor_hooks", "visible_devices_note"]
