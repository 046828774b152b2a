"""The Triton a machine gets (plugin_kit/triton_dist.py, triton_env.py, triton_hints.py,
scripts/setup.sh): torch's own requirement decides, PyPI triton is never installed over a
vendor's Triton distribution, a wrong or doubled one is reported with its fix, and the
missing-Triton hints name the vendor's own distribution. Vendor distributions and torch builds
are faked: dist-info directories on a temporary path, and ``torch.version`` patched."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dflash2rt.plugin_kit import triton_dist as td
from dflash2rt.plugin_kit import triton_env as te
from dflash2rt.plugin_kit import triton_hints as th
from dflash2rt.plugin_kit.triton_dist import Action, Decision
from dflash2rt.plugin_kit.triton_env import Environment, Provider, TorchBuild

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup.sh"
MODULE = ROOT / "dflash2rt" / "plugin_kit" / "triton_dist.py"
# torch's wheels name their Triton with this marker (PyTorch's binary build scripts).
MARKER = "platform_system == 'Linux' and platform_machine == 'x86_64' and python_version != '3.13t'"
LINUX = {"platform_system": "Linux", "platform_machine": "x86_64", "sys_platform": "linux"}
VENDOR_DISTS = ("pytorch-triton-rocm", "pytorch-triton-xpu", "triton-xpu", "pytorch-triton")
ROCM = TorchBuild("rocm", "2.9.0+rocm6.4", "6.4.43482")
CUDA = TorchBuild("cuda", "2.9.0+cu128", "12.8")
XPU = TorchBuild("xpu", "2.9.0+xpu", "20250101")
CPU = TorchBuild("cpu", "2.13.0+cpu")
_find_spec = importlib.util.find_spec


def fake_dist(site: Path, name: str, version: str, *, requires: tuple[str, ...] = (),
              top_level: bool = True, provides_triton: bool = True) -> Path:
    """A ``<name>-<version>.dist-info`` in ``site``, as pip leaves it: METADATA, RECORD and
    (unless ``top_level`` is False) top_level.txt; a Triton one owns ``triton/__init__.py``."""
    info = site / f"{re.sub(r'[-.]+', '_', name)}-{version}.dist-info"
    info.mkdir(parents=True)
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(meta) + "\n")
    pkg = "triton" if provides_triton else re.sub(r"[-.]+", "_", name)
    (info / "RECORD").write_text(f"{pkg}/__init__.py,,\n{pkg}/language/core.py,,\n"
                                 f"{info.name}/METADATA,,\n")
    if top_level:
        (info / "top_level.txt").write_text(pkg + "\n")
    return info


def fake_torch_module(build: TorchBuild) -> SimpleNamespace:
    attr = {"cuda": "cuda", "rocm": "hip", "xpu": "xpu"}.get(build.kind)
    version = SimpleNamespace(cuda=None, hip=None, xpu=None)
    if attr:
        setattr(version, attr, build.runtime)
    return SimpleNamespace(__version__=build.version, version=version)


def env(build: TorchBuild, *providers: tuple[str, str], torch_triton: str | None = None,
        torch_metadata: bool = True, platform: str = "linux") -> Environment:
    return Environment(build, tuple(Provider(n, v) for n, v in providers), torch_triton,
                       torch_metadata, "triton>=3.6", platform)


# -- the rule, over every combination ---------------------------------------------------------

def test_pypi_triton_is_never_installed_over_any_other_triton_distribution():
    """Every torch build × every torch requirement × every installed set holding a non-PyPI
    Triton: nothing for pip to install (an ok, or a fix by hand)."""
    requirements = (None, "triton==3.5.0", "pytorch-triton-rocm==3.5.0",
                    "pytorch-triton-xpu==3.5.0", "triton-xpu==3.6.0")
    for build, req, vendor in itertools.product((ROCM, CUDA, XPU, CPU), requirements,
                                                VENDOR_DISTS):
        for have in ([(vendor, "3.5.0")], [(vendor, "3.5.0"), ("triton", "3.5.0")]):
            d = td.decide(env(build, *have, torch_triton=req))
            assert d.pip_args == () and d.action in (Action.OK, Action.FIX), (build, req, have, d)


def test_a_decision_cannot_install_a_second_distribution():
    with pytest.raises(ValueError, match="only PyPI 'triton'"):
        Decision(Action.INSTALL, ROCM, "pytorch-triton-rocm", (), "x", ("pytorch-triton-rocm",))
    with pytest.raises(ValueError, match="refusing to install 'triton' over pytorch-triton-rocm"):
        Decision(Action.INSTALL, CPU, "triton", (Provider("pytorch-triton-rocm", "3.5.0"),), "x",
                 ("triton>=3.6",))
    with pytest.raises(ValueError, match="pip arguments"):
        Decision(Action.OK, CPU, "triton", (), "x", ("triton>=3.6",))


# -- with fake vendor distributions on disk ---------------------------------------------------

def test_rocm_torch_with_its_vendor_triton_installs_nothing(tmp_path, monkeypatch):
    """A ROCm torch (``torch.version.hip`` patched) whose metadata requires pytorch-triton-rocm,
    with a fake pytorch-triton-rocm installed: ok, nothing to install."""
    fake_dist(tmp_path, "torch", "2.9.0+rocm6.4",
              requires=("filelock", f"pytorch-triton-rocm==3.5.0; {MARKER}"), provides_triton=False)
    fake_dist(tmp_path, "pytorch-triton-rocm", "3.5.0")
    monkeypatch.setattr(torch.version, "hip", "6.4.43482", raising=False)
    monkeypatch.setattr(torch, "__version__", "2.9.0+rocm6.4")
    e = te.inspect([str(tmp_path)], marker_env=LINUX, cpu_req="triton>=3.6")
    assert e.build == TorchBuild("rocm", "2.9.0+rocm6.4", "6.4.43482")
    assert e.providers == (Provider("pytorch-triton-rocm", "3.5.0"),)
    assert e.torch_triton == "pytorch-triton-rocm==3.5.0"
    d = td.decide(e)
    assert d.action is Action.OK and d.pip_args == ()
    assert "pytorch-triton-rocm 3.5.0 is installed" in d.reason


@pytest.mark.parametrize("vendor", VENDOR_DISTS)
@pytest.mark.parametrize("build", [ROCM, XPU, CUDA, CPU], ids=lambda b: b.kind)
def test_a_fake_vendor_distribution_is_never_overwritten(tmp_path, vendor, build):
    """Whatever torch says (here: no metadata at all), a fake vendor Triton on the path, found
    through its RECORD only (no top_level.txt), is never replaced."""
    fake_dist(tmp_path, vendor, "3.5.0", top_level=False)
    e = te.inspect([str(tmp_path)], torch_module=fake_torch_module(build), marker_env=LINUX,
                   cpu_req="triton>=3.6")
    assert e.providers == (Provider(vendor, "3.5.0"),) and not e.torch_metadata
    d = td.decide(e)
    assert d.pip_args == () and d.action is Action.OK, d


def test_cpu_build_without_triton_gets_pypi_triton_as_the_extra_pins_it(tmp_path):
    fake_dist(tmp_path, "torch", "2.13.0+cpu", requires=("filelock", "sympy>=1.13.3"),
              provides_triton=False)
    fake_dist(tmp_path, "numpy", "2.1.0", provides_triton=False)
    e = te.inspect([str(tmp_path)], torch_module=fake_torch_module(CPU), marker_env=LINUX)
    assert e.providers == () and e.torch_triton is None and e.torch_metadata
    d = td.decide(e)
    assert d.action is Action.INSTALL and d.pip_args == (e.cpu_requirement,)
    # the requirement is dflash2rt's own triton extra, read from its installed metadata
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["triton"]
    assert [e.cpu_requirement] == [r.replace(" ", "") for r in extra]
    assert td.decide(env(CPU, ("triton", "3.4.0"))).pip_args == ("triton>=3.6",)   # upgraded
    assert td.decide(env(CPU, ("triton", "3.9.0"))).action is Action.OK
    assert td.decide(env(CPU, platform="darwin")).action is Action.NONE            # no wheels


def test_cuda_torch_gets_the_triton_it_pins(tmp_path):
    fake_dist(tmp_path, "torch", "2.9.0+cu128", requires=(f"triton==3.5.0; {MARKER}",),
              provides_triton=False)
    fake_dist(tmp_path, "triton", "3.5.0")
    e = te.inspect([str(tmp_path)], torch_module=fake_torch_module(CUDA), marker_env=LINUX,
                   cpu_req="triton>=3.6")
    d = td.decide(e)
    assert e.torch_triton == "triton==3.5.0" and d.action is Action.OK and d.pip_args == ()
    # the same distribution at another version is replaced by the pinned one; none: installed
    assert td.decide(env(CUDA, ("triton", "3.6.0"), torch_triton="triton==3.5.0")).pip_args \
        == ("triton==3.5.0",)
    assert td.decide(env(CUDA, torch_triton="triton==3.5.0")).pip_args == ("triton==3.5.0",)
    # torch's marker excludes this platform: nothing to install, and it says why
    e = te.inspect([str(tmp_path)], torch_module=fake_torch_module(CUDA),
                   marker_env={**LINUX, "platform_system": "Windows"}, cpu_req="triton>=3.6")
    assert e.torch_triton is None
    d = td.decide(e)
    assert d.action is Action.OK and "not checked against torch" in d.reason
    d = td.decide(env(CUDA, torch_triton=None))
    assert d.action is Action.NONE and "names no Triton for this platform" in d.reason


def test_rocm_torch_with_only_pypi_triton_is_reported_with_its_fix(tmp_path):
    """The mismatched vendor: a ROCm torch, and the triton import package from PyPI triton."""
    fake_dist(tmp_path, "torch", "2.9.0+rocm6.4",
              requires=(f"pytorch-triton-rocm==3.5.0; {MARKER}",), provides_triton=False)
    fake_dist(tmp_path, "triton", "3.5.0")
    d = td.decide(te.inspect([str(tmp_path)], torch_module=fake_torch_module(ROCM),
                             marker_env=LINUX, cpu_req="triton>=3.6"))
    assert d.action is Action.FIX and d.pip_args == ()
    assert "requires pytorch-triton-rocm==3.5.0, but triton comes from triton 3.5.0" in d.reason
    assert ("pip uninstall -y triton && pip install 'pytorch-triton-rocm==3.5.0' --index-url "
            "https://download.pytorch.org/whl/rocm6.4") in d.reason


def test_two_triton_distributions_and_a_missing_vendor_one_are_fixes():
    d = td.decide(env(ROCM, ("pytorch-triton-rocm", "3.5.0"), ("triton", "3.6.0"),
                      torch_triton="pytorch-triton-rocm==3.5.0"))
    assert d.action is Action.FIX and "2 distributions install the import package" in d.reason
    assert "pip uninstall -y pytorch-triton-rocm triton && pip install" in d.reason
    d = td.decide(env(XPU, torch_triton="pytorch-triton-xpu==3.5.0"))
    assert d.action is Action.FIX and d.pip_args == ()
    assert "--index-url https://download.pytorch.org/whl/xpu" in d.reason
    nightly = TorchBuild("rocm", "2.10.0.dev20250101+rocm6.4", "6.4")
    d = td.decide(env(nightly, ("pytorch-triton-rocm", "3.4.0"),
                      torch_triton="pytorch-triton-rocm==3.5.0+git1234abcd"))
    assert d.action is Action.FIX and "/whl/nightly/rocm6.4" in d.reason
    # a vendor torch whose metadata is missing or names none: nothing, said so
    d = td.decide(env(ROCM, torch_triton=None, torch_metadata=False))
    assert d.action is Action.NONE and "pytorch-triton-rocm" in d.reason
    assert "metadata was not found" in d.reason


# -- the hints when triton is missing ----------------------------------------------------------

@pytest.fixture
def no_torch_metadata(monkeypatch):
    monkeypatch.setattr(th, "torch_triton_requirement", lambda *a, **k: (False, None))


def test_missing_triton_hints_name_the_vendors_own_distribution(monkeypatch, no_torch_metadata):
    from dflash2rt.kernels.tuning import TritonFacts, Tuning
    from dflash2rt.plugin_kit import kernel_mode

    monkeypatch.setattr("importlib.util.find_spec",
                        lambda name, *a: None if name == "triton" else _find_spec(name, *a))
    facts = {d: TritonFacts(backend="x", distribution=d, tuning={32: Tuning()})
             for d in ("triton", "pytorch-triton-rocm", "pytorch-triton-xpu")}
    monkeypatch.setattr(torch.version, "hip", "6.4", raising=False)
    monkeypatch.setattr(torch, "__version__", "2.9.0+rocm6.4")
    usable, what = kernel_mode(facts["pytorch-triton-rocm"])
    assert not usable and "install pytorch-triton-rocm" in what
    assert "--index-url https://download.pytorch.org/whl/rocm6.4" in what
    assert "not PyPI triton or dflash2rt[triton]" in what
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.version, "xpu", "20250101", raising=False)
    monkeypatch.setattr(torch, "__version__", "2.9.0+xpu")
    what = kernel_mode(facts["pytorch-triton-xpu"])[1]
    assert "install pytorch-triton-xpu" in what and "/whl/xpu" in what
    monkeypatch.setattr(torch.version, "xpu", None, raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.8", raising=False)
    assert "pip install triton, the version torch" in kernel_mode(facts["triton"])[1]
    monkeypatch.setattr(torch.version, "cuda", None, raising=False)
    assert "pip install 'dflash2rt[triton]'" in kernel_mode()[1]     # old call: CPU / interpreter

    from dflash2rt.cpu import interpret
    assert "pip install 'dflash2rt[triton]'" in interpret.probe().reason


def test_the_hint_uses_torchs_exact_requirement(monkeypatch):
    monkeypatch.setattr(th, "torch_triton_requirement",
                        lambda *a, **k: (True, "triton-xpu==3.6.0"))
    monkeypatch.setattr(torch.version, "xpu", "20250101", raising=False)
    monkeypatch.setattr(torch, "__version__", "2.10.0+xpu")
    hint = th.install_hint("pytorch-triton-xpu")
    assert hint.startswith("pip install 'triton-xpu==3.6.0' --index-url "
                           "https://download.pytorch.org/whl/xpu")


def test_a_gpu_backend_without_triton_reports_the_vendor_hint(monkeypatch, no_torch_metadata):
    from dflash2rt.backend import Probe
    from dflash2rt.kernels.tuning import DEFAULT, TritonFacts, Tuning
    from dflash2rt.plugin_kit import gpu_backend

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr("importlib.util.find_spec",
                        lambda name, *a: None if name == "triton" else _find_spec(name, *a))
    monkeypatch.setattr(torch.version, "hip", "6.4", raising=False)
    facts = TritonFacts(backend="hip", distribution="pytorch-triton-rocm", tuning={64: Tuning()})
    be = gpu_backend("fakegpu", Probe(True, device="cpu", details={"torch_device": "cpu"}),
                     (torch.float32,), DEFAULT, triton=facts, smoke=lambda b: None)
    assert "install pytorch-triton-rocm" in be.standing_fallbacks[0]


# -- the CLI and scripts/setup.sh ---------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dflash2rt.plugin_kit.triton_dist", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.mark.slow                       # a long run (over 10 s on 2 cores)
def test_cli_with_a_fake_distribution_path(tmp_path):
    """``-m dflash2rt.plugin_kit.triton_dist --pip-args --path DIR`` (this machine's CPU torch):
    a fake vendor Triton in DIR → nothing on stdout; an empty DIR → PyPI triton."""
    vendor, empty = tmp_path / "vendor", tmp_path / "empty"
    fake_dist(vendor, "pytorch-triton-rocm", "3.5.0")
    empty.mkdir()
    r = _cli("--pip-args", "--path", str(vendor))
    assert r.returncode == 0 and r.stdout == "", r
    assert r.stderr.startswith("triton: ok:") and "pytorch-triton-rocm 3.5.0" in r.stderr
    r = _cli("--pip-args", "--path", str(empty))
    assert r.returncode == 0 and r.stdout.split() == [te.cpu_requirement()], r
    assert "triton: install:" in r.stderr
    r = _cli("--json", "--path", str(vendor))
    assert json.loads(r.stdout)["installed"] == ["pytorch-triton-rocm 3.5.0"]


# A stand-in for .venv/bin/python that setup.sh runs (tests/fixtures/setup_sh/python): it logs
# every call, "installs" what pip is asked for by writing a fake dist-info, and runs the
# decision's file against a fake torch (the code in $STUB_PRELUDE: fake_torch_cli.py beside it).
STUB_PYTHON = ROOT / "tests" / "fixtures" / "setup_sh" / "python"
STUB_PRELUDE = (STUB_PYTHON.parent / "fake_torch_cli.py").read_text()


def _run_setup(tmp_path: Path, build: TorchBuild, *dists: tuple[str, str],
               torch_requires: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, str]:
    repo, site = tmp_path / "repo", tmp_path / "site"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SETUP, repo / "scripts" / "setup.sh")
    bin_ = repo / ".venv" / "bin"
    bin_.mkdir(parents=True)
    shutil.copy(STUB_PYTHON, bin_ / "python")
    (bin_ / "dflash2rt").write_text("#!/bin/sh\nexit 0\n")
    for name in ("python", "dflash2rt"):
        (bin_ / name).chmod(stat.S_IRWXU)
    site.mkdir()
    fake_dist(site, "torch", build.version, requires=torch_requires, provides_triton=False)
    for name, version in dists:
        fake_dist(site, name, version)
    log = tmp_path / "log"
    envs = dict(os.environ, STUB_LOG=str(log), STUB_SITE=str(site), STUB_REAL_PY=sys.executable,
                STUB_PRELUDE=STUB_PRELUDE, STUB_MODULE=str(MODULE),
                STUB_BUILD=json.dumps([build.kind, build.version, build.runtime]))
    r = subprocess.run(["bash", str(repo / "scripts" / "setup.sh")], capture_output=True,
                       text=True, timeout=120, env=envs)
    return r, log.read_text() if log.exists() else ""


def test_setup_sh_asks_the_decision_and_never_installs_the_triton_extra_blindly():
    text = SETUP.read_text()
    assert "-m dflash2rt.plugin_kit.triton_dist" in text and "--pip-args" in text
    code = "\n".join(line.split("#")[0] for line in text.splitlines())
    assert not re.search(r"\[[^\]]*\btriton\b[^\]]*\]", code), "an install of a [triton] extra"
    assert not re.search(r"pip[^\n]*install[^\n]*\btriton\b", code), "a named triton install"
    assert 'pip install -e ".[dev]"' in code


def test_setup_sh_on_a_rocm_machine_keeps_the_vendor_triton(tmp_path):
    r, log = _run_setup(tmp_path, ROCM, ("pytorch-triton-rocm", "3.5.0"),
                        torch_requires=("pytorch-triton-rocm==3.5.0",))
    assert r.returncode == 0, r.stderr
    pip_calls = [line for line in log.splitlines() if line.startswith("-m pip")]
    assert len(pip_calls) == 1 and not any("triton" in c for c in pip_calls), pip_calls
    assert "triton: ok:" in r.stderr and "pytorch-triton-rocm 3.5.0 is installed" in r.stderr


def test_setup_sh_stops_on_a_rocm_machine_with_pypi_triton(tmp_path):
    r, log = _run_setup(tmp_path, ROCM, ("triton", "3.5.0"),
                        torch_requires=("pytorch-triton-rocm==3.5.0",))
    assert r.returncode == 1
    assert "triton: fix:" in r.stderr and "pip uninstall -y triton" in r.stderr
    assert "fix Triton as said above" in r.stderr
    assert not [line for line in log.splitlines() if line.startswith("-m pip") and "triton" in
                line.replace("[dev]", "")]


def test_setup_sh_on_a_cpu_machine_installs_pypi_triton_and_checks_it(tmp_path):
    r, log = _run_setup(tmp_path, CPU)
    assert r.returncode == 0, r.stderr
    assert "-m pip --disable-pip-version-check -q install triton>=3.6" in log
    assert "-m dflash2rt.plugin_kit.triton_dist --check" in log
    assert "setup.sh: pip install triton>=3.6" in r.stderr and "triton: ok:" in r.stderr


# -- the plugins' extras ------------------------------------------------------------------------

def test_only_pypi_triton_vendors_carry_a_triton_extra():
    """A plugin whose Triton is PyPI triton names it in its ``triton`` extra; ROCm and XPU carry
    none (their Triton comes with torch from the PyTorch index: PyPI's pytorch-triton-rocm is
    years old, and PyPI triton would be installed over theirs)."""
    from dflash2rt.registry import Registry

    vendors = [v for v in Registry.discover().vendors
               if (ROOT / "backends" / v.name / "pyproject.toml").is_file()]
    assert {v.name for v in vendors} >= {"cuda", "rocm", "xpu"}
    for v in vendors:
        extras = tomllib.loads((ROOT / "backends" / v.name / "pyproject.toml").read_text())[
            "project"].get("optional-dependencies", {})
        if v.triton.distribution == "triton":
            assert all(r.startswith("triton") for r in extras["triton"]), v.name
        else:
            assert "triton" not in extras, (v.name, extras)
            assert not any("triton" in r for rs in extras.values() for r in rs), (v.name, extras)
        assert v.triton.distribution == th.USUAL_DISTRIBUTION[
            {"hip": "rocm"}.get(v.triton.backend, v.triton.backend)], v.name
