"""The plugin contract: the hooks a dflash2rt backend plugin implements.

A plugin is a module (or object) exposed through the entry-point group ``dflash2rt.backends``
whose functions are marked with ``dflash2rt.hookspecs.hookimpl``. Hooks are called with keyword
arguments only; specs carry no default values (pluggy does not pass defaults).

Example (a plugin with its own probe and create)::

    from dflash2rt.hookspecs import hookimpl
    from dflash2rt.backend import BackendSpec

    @hookimpl
    def dflash2rt_backends():
        return [BackendSpec(name="mydev", priority=50, probe=probe, create=create)]

A GPU plugin declares its vendor as data instead (``backends/cuda/dflash2rt_cuda/plugin.py`` is a
complete one): ``VENDOR = plugin_kit.GpuVendor(...)``, ``dflash2rt_backends`` returning
``[plugin_kit.backend_spec(VENDOR)]`` and ``dflash2rt_gpu_vendors`` returning ``[VENDOR]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import pluggy

if TYPE_CHECKING:
    from .backend import BackendSpec
    from .vendor import GpuVendor

PROJECT = "dflash2rt"
ENTRY_POINT_GROUP = "dflash2rt.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def dflash2rt_backends() -> "Sequence[BackendSpec]":
    """Return the backends this plugin provides.

    Called once per registry, at load time, never on the hot path. Must be cheap and must not
    touch a device: hardware is probed later, through each ``BackendSpec.probe``, so that listing
    backends never initialises a GPU runtime that is not wanted.

    :return: a sequence of :class:`dflash2rt.backend.BackendSpec` with names unique across all
        plugins (a duplicate name is refused and reported, the first registration stays).
    """


@hookspec
def dflash2rt_gpu_vendors() -> "Sequence[GpuVendor]":
    """Return the GPU vendor facts behind this plugin's backends (optional hook).

    Core asks these instead of naming a plugin: ``kernels.compile_check`` reads each vendor's
    Triton compile targets and tuning, ``qualify.microbench`` its peak bandwidth table. Data only:
    must not touch a device.

    :return: a sequence of :class:`dflash2rt.vendor.GpuVendor` (``plugin_kit.GpuVendor``).
    """
