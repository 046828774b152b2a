"""The system section of a qualification report (``qualify.system``) with git, the registry,
the package versions and the platform stood in for: the commit read from a checkout (its
root, the two git commands and their options, ``+dirty``, a failing or missing git, no
checkout at all) and every field ``describe`` writes, the probe's values taking precedence
over the backend's declared ones. Expected values are written out by hand."""

from __future__ import annotations

import subprocess
import types

import torch

from dflash2rt.backend import Probe
from dflash2rt.qualify import system
from dflash2rt.registry import BackendStatus

NS = types.SimpleNamespace
OPTS = {"capture_output": True, "text": True, "timeout": 10}


class Git:
    """``subprocess.run`` for git: records each call, answers rev-parse and status."""

    def __init__(self, sha: str = "abc123\n", rc: int = 0, porcelain: str = "",
                 raises: Exception | None = None):
        self.sha, self.rc, self.porcelain, self.raises = sha, rc, porcelain, raises
        self.calls: list[tuple[list[str], dict]] = []

    def __call__(self, args, **kw):
        self.calls.append((list(args), kw))
        if self.raises is not None:
            raise self.raises
        if "rev-parse" in args:
            return NS(returncode=self.rc, stdout=self.sha)
        return NS(returncode=0, stdout=self.porcelain)


def _checkout(tmp_path, monkeypatch, git: Git, dot_git: bool = True):
    """The module placed at ``<root>/dflash2rt/qualify/system.py`` with ``root`` = tmp_path."""
    (tmp_path / "dflash2rt" / "qualify").mkdir(parents=True)
    if dot_git:
        (tmp_path / ".git").mkdir()
    monkeypatch.setattr(system, "__file__", str(tmp_path / "dflash2rt/qualify/system.py"))
    monkeypatch.setattr(system.subprocess, "run", git)
    return tmp_path.resolve()


def test_commit_of_a_clean_checkout_runs_git_in_its_root(tmp_path, monkeypatch):
    git = Git()
    root = _checkout(tmp_path, monkeypatch, git)
    assert system.git_commit() == "abc123"
    assert git.calls == [(["git", "-C", str(root), "rev-parse", "HEAD"], OPTS),
                         (["git", "-C", str(root), "status", "--porcelain", "-uno"], OPTS)]


def test_commit_of_a_checkout_with_changes_is_marked_dirty(tmp_path, monkeypatch):
    _checkout(tmp_path, monkeypatch, Git(porcelain=" M notes.txt\n"))
    assert system.git_commit() == "abc123+dirty"


def test_no_commit_without_a_git_directory_at_the_root(tmp_path, monkeypatch):
    git = Git()
    _checkout(tmp_path, monkeypatch, git, dot_git=False)
    (tmp_path / "dflash2rt" / ".git").mkdir()          # one level too deep: not the root
    assert system.git_commit() is None
    assert git.calls == []


def test_no_commit_when_git_fails_or_cannot_run(tmp_path, monkeypatch):
    git = Git(rc=128, sha="")
    _checkout(tmp_path, monkeypatch, git)
    assert system.git_commit() is None
    git.rc, git.raises = 0, FileNotFoundError("git")
    assert system.git_commit() is None
    git.raises = subprocess.TimeoutExpired(["git"], 10)
    assert system.git_commit() is None


def test_version_of_a_missing_distribution_is_none():
    assert system._version("no-such-distribution-dflash2rt-test") is None


def _registry(probe: Probe):
    statuses = [
        BackendStatus("cpu", True, "", "host cpu", "dflash2rt", "1.0", kernels="torch",
                      dtypes=("float32",), graphs="none"),
        BackendStatus("cuda", False, "no driver", "declared gpu", "dflash2rt-cuda", "2.5",
                      kernels="declared kernels", dtypes=("bfloat16", "float16"),
                      graphs="declared graphs"),
    ]
    probes: list[str] = []

    def probe_(name):
        probes.append(name)
        return probe

    return NS(statuses=lambda: statuses, probe=probe_, probes=probes)


def _stand_ins(monkeypatch, versions: dict[str, str], processor: str = "x86 cpu"):
    monkeypatch.setattr(system, "_version", lambda d: versions.get(d))
    monkeypatch.setattr(system, "platform", NS(
        python_version=lambda: "3.99.1", platform=lambda: "Linux-test",
        processor=lambda: processor, machine=lambda: "x86_64"))
    monkeypatch.setattr(system.os, "cpu_count", lambda: 7)
    monkeypatch.setattr(system, "git_commit", lambda: "abc123")


def test_describe_takes_the_probed_values_over_the_declared_ones(monkeypatch):
    _stand_ins(monkeypatch, {"triton": "3.1", "pytorch-triton-xpu": "9.9", "numpy": "2.0",
                             "dflash2rt": "0.5", "dflash2rt-conformance": "0.2"})
    reg = _registry(Probe(True, device="probed gpu", kernels="triton", dtypes=("float32",),
                          graphs="cuda graphs",
                          details={"torch_device": "cuda:1", "driver": "550"}))
    d = system.describe(reg, "cuda:1")
    assert reg.probes == ["cuda:1"]
    assert d == {
        "backend": "cuda:1", "device": "probed gpu", "kernels": "triton",
        "graphs": "cuda graphs", "dtypes": ["float32"],
        "plugin_distribution": "dflash2rt-cuda", "plugin_version": "2.5",
        "runtime": {"driver": "550"},
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None), "xpu": getattr(torch.version, "xpu", None),
        "triton": "3.1", "numpy": "2.0", "dflash2rt": "0.5", "conformance": "0.2",
        "python": "3.99.1", "platform": "Linux-test", "cpu": "x86 cpu", "cpu_count": 7,
        "commit": "abc123",
        "all_backends": [{"name": "cpu", "available": True, "reason": ""},
                         {"name": "cuda", "available": False, "reason": "no driver"}],
    }


def test_describe_falls_back_to_the_declared_values_and_other_names(monkeypatch):
    _stand_ins(monkeypatch, {"pytorch-triton-xpu": "3.0"}, processor="")
    reg = _registry(Probe(False, "not here"))
    d = system.describe(reg, "cuda")
    assert (d["backend"], d["device"], d["kernels"], d["graphs"], d["dtypes"]) == (
        "cuda", "declared gpu", "declared kernels", "declared graphs", ["bfloat16", "float16"])
    assert (d["plugin_distribution"], d["plugin_version"], d["runtime"]) == (
        "dflash2rt-cuda", "2.5", {})
    assert (d["triton"], d["numpy"], d["dflash2rt"], d["conformance"]) == (
        "3.0", None, None, None)
    assert d["cpu"] == "x86_64"
