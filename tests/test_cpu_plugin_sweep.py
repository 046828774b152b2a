"""The built-in CPU backend plugin (dflash2rt.cpu.plugin) where a sweep found classes the other
tests let through: the probe's fields, ``cpu:N`` (any N >= 0 names the host, a negative one is
refused with the reason), the backend built (dtypes, the oneDNN model pass) and the backends
the plugin's hook offers, in order. Expected values written out by hand."""

from __future__ import annotations

import os
import platform

import torch

from dflash2rt.cpu import packed, plugin

HOST = (f"cpu ({platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch "
        "threads)")


def test_probe_fields():
    p = plugin.probe()
    assert (p.available, p.reason, p.device, p.dtypes, p.fp64) == (
        True, "", HOST, ("float32", "float64", "bfloat16"), True)
    assert p.details == {"torch": torch.__version__, "device_count": "1"}
    assert p.graphs == "none: eager on CPU (no graph API for CPU tensors)"


def test_device_index_names_the_host_and_a_negative_one_is_refused():
    for i in (0, 1, 7):
        p = plugin.probe_device(i)
        assert p.available and p.device == f"cpu:{i} = the host {HOST}"
        assert p.dtypes == ("float32", "float64", "bfloat16")
    bad = plugin.probe_device(-1)
    assert not bad.available and bad.reason == "cpu:-1: a device index is >= 0"


def test_the_backend_built():
    b = plugin.create(plugin.probe())
    assert (b.name, b.device, b.dtypes, b.has_fp64) == (
        "cpu", torch.device("cpu"), (torch.float32, torch.float64, torch.bfloat16), True)
    assert b.model_pass is packed.pack_linears


def test_the_hook_offers_cpu_first_then_the_opt_in_lanes():
    specs = plugin.dflash2rt_backends()
    assert [s.name for s in specs] == ["cpu", "triton-interpret", "triton-interpret-nofp64",
                                       "cpu-nofp64"]
    cpu = specs[0]
    assert (cpu.priority, cpu.opt_in, cpu.probe, cpu.create, cpu.probe_device) == (
        0, False, plugin.probe, plugin.create, plugin.probe_device)
