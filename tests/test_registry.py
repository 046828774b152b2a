"""Plugin discovery, isolation, selection, and the ``dflash2rt backends`` CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dflash2rt.backend import TorchOpsBackend
from dflash2rt.errors import BackendUnavailableError, UnknownBackendError
from dflash2rt.registry import ENV_VAR, Registry

from fixture_plugins import write_plugin

CLI = [sys.executable, "-m", "dflash2rt"]


def _cli_json(env_extra: dict[str, str] | None = None) -> list[dict]:
    env = dict(os.environ, **(env_extra or {}))
    out = subprocess.run(CLI + ["backends", "--json"], capture_output=True, text=True, env=env,
                         check=True)
    return json.loads(out.stdout)


def test_cli_lists_cpu_available_and_gpu_backends_with_reasons():
    rows = {r["name"]: r for r in _cli_json()}
    for key in ("name", "available", "reason", "device", "distribution", "version"):
        assert all(key in r for r in rows.values()), key
    assert rows["cpu"]["available"] is True
    assert rows["cpu"]["distribution"] == "dflash2rt"
    for gpu, dist in (("cuda", "dflash2rt-cuda"), ("rocm", "dflash2rt-rocm"),
                      ("xpu", "dflash2rt-xpu")):
        assert gpu in rows, f"{dist} plugin not discovered"
        assert rows[gpu]["distribution"] == dist
        assert rows[gpu]["version"]
        if not rows[gpu]["available"]:  # this machine has no GPU; a lent one may
            assert rows[gpu]["reason"].strip(), gpu


def test_cli_table_runs():
    out = subprocess.run(CLI + ["backends"], capture_output=True, text=True, check=True).stdout
    assert "cpu" in out and "yes" in out


@pytest.fixture
def plugin_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_broken_plugins_become_reasons_and_cpu_still_works(plugin_path):
    for kind in ("broken", "raising", "misspelled", "duplicate"):
        write_plugin(plugin_path, kind)
    reg = Registry.discover()
    rows = {r.name: r for r in reg.statuses() if r.name.startswith("fixture-")}
    assert "exploded at import" in rows["fixture-broken"].reason
    assert rows["fixture-broken"].distribution == "fixture-broken"
    assert "fixture hook failure" in rows["fixture-raising"].reason
    assert "dflash2rt_backend" in rows["fixture-misspelled"].reason
    dup = [r for r in reg.statuses() if r.name == "cpu" and not r.available]
    assert dup and "duplicate" in dup[0].reason
    assert reg.select("cpu").backend.device.type == "cpu"
    assert reg.select("auto").name == "cpu"


def test_broken_plugin_does_not_break_cli(plugin_path):
    write_plugin(plugin_path, "broken")
    env = {"PYTHONPATH": os.pathsep.join([str(plugin_path), os.environ.get("PYTHONPATH", "")])}
    rows = {r["name"]: r for r in _cli_json(env)}
    assert rows["cpu"]["available"] is True
    assert rows["fixture-broken"]["available"] is False
    assert "exploded at import" in rows["fixture-broken"]["reason"]


def test_out_of_tree_plugin_selected_by_name_and_opt_in_never_auto(plugin_path):
    write_plugin(plugin_path, "good")
    reg = Registry.discover()
    sel = reg.select("oot")
    assert isinstance(sel.backend, TorchOpsBackend) and sel.backend.name == "oot"
    assert sel.how == "explicit"
    auto = reg.select("auto")  # oot (priority 5) beats cpu (0); the opt-in one (500) is skipped
    assert auto.name == "oot"
    skipped = dict(auto.skipped)
    assert "opt-in" in skipped["oot-optin"]
    assert "lower priority" in skipped["cpu"]
    assert reg.select("oot-optin").name == "oot-optin"


def test_env_variable_selects_and_unavailable_raises_with_reason(monkeypatch):
    reg = Registry.discover()
    monkeypatch.setenv(ENV_VAR, "cpu")
    assert reg.select().how == f"env {ENV_VAR}"
    if reg.probe("rocm").available:
        pytest.skip("this machine has a usable ROCm GPU, so rocm cannot be shown unavailable")
    monkeypatch.setenv(ENV_VAR, "rocm")
    with pytest.raises(BackendUnavailableError) as err:
        reg.select()
    assert "rocm" in str(err.value) and reg.probe("rocm").reason in str(err.value)


def test_unknown_backend_is_typed_and_lists_known():
    with pytest.raises(UnknownBackendError, match="installed backends: .*cpu"):
        Registry.discover().select("tpu-v9")


def test_auto_explains_every_skipped_backend():
    sel = Registry.discover().select("auto")
    skipped = dict(sel.skipped)
    for status in Registry.discover().statuses():
        if status.name != sel.name:
            assert skipped.get(status.name), status.name


def test_public_api_uses_registry(monkeypatch):
    import dflash2rt

    monkeypatch.delenv(ENV_VAR, raising=False)
    assert dflash2rt.get_backend("cpu").name == "cpu"
    assert any(s.name == "cpu" and s.available for s in dflash2rt.list_backends())


def test_import_does_no_work():
    code = ("import sys, dflash2rt; "
            "assert 'torch' not in sys.modules and 'pluggy' not in sys.modules, sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_gpu_backend_never_runs_its_kernels_in_the_interpreter(monkeypatch):
    """With TRITON_INTERPRET=1 in the process (a test conftest once leaked it into a CUDA
    conformance run, which then ran every kernel in the host interpreter: slow and wrong), a GPU
    plugin uses the torch ops and says why, instead of silently interpreting."""
    import torch

    from dflash2rt.backend import Probe, TorchOpsBackend
    from dflash2rt.kernels.tuning import DEFAULT
    from dflash2rt.plugin_kit import gpu_backend, kernel_mode

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    probe = Probe(True, device="cpu", details={"torch_device": torch.device("cpu")})
    be = gpu_backend("fakegpu", probe, (torch.float32,), DEFAULT)
    assert type(be) is TorchOpsBackend
    assert len(be.standing_fallbacks) == 1 and "TRITON_INTERPRET=1" in be.standing_fallbacks[0]
    usable, what = kernel_mode()
    assert not usable and "TRITON_INTERPRET=1" in what
