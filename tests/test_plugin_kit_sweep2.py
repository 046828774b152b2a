"""plugin_kit's graph self-test and hardware line, checked against hand-written expectations.
The self-test with stand-in adapters: the exact order of its pool, warm-up, capture and replay
calls; the exact verdict for graphs that baked the KV commit's positions or counts, aliased the
K and V buffers, or lost the commit in the second bucket only; verify run without its
host-syncing input check; every commit inside KVCache's contract. The hardware line on a fake
sysfs PCI tree and device nodes in a temporary folder, the torch build line for each
``torch.version``, and the test allocation's three outcomes."""

from __future__ import annotations

import contextlib

import pytest
import torch

from dflash2rt.backend import TorchOpsBackend
from dflash2rt.models.kv_cache import KVCache
from dflash2rt.plugin_kit import graph_self_test, hardware

COMMIT_DIFFERS = "graph replay != eager on fresh inputs: the KV commit (bucket {})"


class Recording:
    """A correct stand-in graph adapter (replay re-runs the captured step) that records its
    calls; ``on_replay(k, fn)`` replaces the replay of the k-th capture (from 1)."""

    def __init__(self, on_replay=None) -> None:
        self.device, self.calls, self.on_replay = torch.device("cpu"), [], on_replay

    def new_pool(self):
        self.calls.append("new_pool")
        return "pool"

    @contextlib.contextmanager
    def capture_stream(self):
        self.calls.append("warm-up")
        yield

    def capture(self, fn, pool):
        k = sum(c.startswith("capture") for c in self.calls) + 1
        self.calls.append(f"capture {k} in {pool}")
        fn()
        state = self.start(k, fn)

        def replay():
            self.calls.append(f"replay {k}")
            (self.on_replay or (lambda k, fn, state: fn()))(k, fn, state)
        return type("G", (), {"replay": staticmethod(replay)})()

    def start(self, k, fn):
        """What a replay needs from the capture: the static inputs as they were then."""
        inp = fn.__defaults__[0]
        return {name: inp[name].clone() for name in ("kv_lens", "kv_counts")}


class CheckedOps(TorchOpsBackend):
    """Torch ops that record the ``check`` each verify is called with."""

    def __init__(self) -> None:
        super().__init__("self-test", "cpu", (torch.float32,))
        self.checks = []

    def verify(self, *args, check=True):
        self.checks.append(check)
        return super().verify(*args, check=check)


@pytest.fixture(scope="module")
def ops():
    return TorchOpsBackend("self-test", "cpu", (torch.float32,))


def _baked(name):
    """A replay whose graph baked the captured value of input ``name`` in."""
    def replay(k, fn, state):
        static = fn.__defaults__[0][name]
        fresh = static.clone()
        static.copy_(state[name])
        fn()
        static.copy_(fresh)
    return replay


def test_two_captures_in_one_pool_then_three_replays_in_order():
    a, be = Recording(), CheckedOps()
    assert graph_self_test(a, be) is None
    assert a.calls == ["new_pool", "warm-up", "capture 1 in pool", "warm-up",
                       "capture 2 in pool", "replay 1", "replay 2", "replay 1"]
    # warm-ups 2, captures 2, replays 3, eager runs 3; never the input check (a host sync)
    assert be.checks == [False] * 10


def test_every_commit_keeps_the_kv_cache_contract(monkeypatch, ops):
    seen, real = [], KVCache.commit

    def commit(self, new_kv, lens, counts):
        seen.append((lens.tolist(), counts.tolist(), new_kv[0][0].shape[1], self.max_len))
        return real(self, new_kv, lens, counts)
    monkeypatch.setattr(KVCache, "commit", commit)
    assert graph_self_test(Recording(), ops) is None
    assert len(seen) == 10
    for lens, counts, rows, max_len in seen:
        assert all(0 <= n and 0 <= c <= rows and n + c <= max_len
                   for n, c in zip(lens, counts)), (lens, counts, rows, max_len)


def test_a_graph_that_baked_the_commit_positions_fails_in_bucket_1(ops):
    assert graph_self_test(Recording(_baked("kv_lens")), ops) == COMMIT_DIFFERS.format(1)


def test_a_graph_that_baked_the_commit_counts_fails_in_bucket_1(ops):
    assert graph_self_test(Recording(_baked("kv_counts")), ops) == COMMIT_DIFFERS.format(1)


def test_a_graph_that_aliased_k_and_v_fails(ops):
    def replay(k, fn, state):
        fn()
        cache = fn.__defaults__[1]
        for kb, vb in zip(cache.k, cache.v):
            vb.copy_(kb)
    assert graph_self_test(Recording(replay), ops) == COMMIT_DIFFERS.format(1)


def test_a_second_bucket_that_loses_the_commit_is_named(ops):
    def replay(k, fn, state):
        cache = fn.__defaults__[1]
        saved = [t.clone() for t in (*cache.k, *cache.v)]
        fn()
        if k == 2:
            for t, s in zip((*cache.k, *cache.v), saved):
                t.copy_(s)
    a = Recording(replay)
    assert graph_self_test(a, ops) == COMMIT_DIFFERS.format(2)
    assert a.calls[-2:] == ["replay 1", "replay 2"]


# -- hardware -----------------------------------------------------------------------------------

def _pci(root, name, vendor, cls=None):
    """A sysfs PCI device directory with ``vendor`` and (unless None) ``class`` files."""
    d = root / name
    d.mkdir()
    (d / "vendor").write_text(vendor + "\n")
    if cls is not None:
        (d / "class").write_text(cls + "\n")


@pytest.fixture
def pci_root(tmp_path, monkeypatch):
    root = tmp_path / "pci"
    root.mkdir()
    monkeypatch.setattr(hardware, "PCI_ROOT", root)
    return root


def test_pci_devices_are_the_vendors_display_and_accelerator_devices(pci_root):
    _pci(pci_root, "0000:03:00.0", "0x1002", "0x030000")      # display controller (VGA)
    _pci(pci_root, "0000:00:02.0", "0x1002", "0x038000")      # display controller (other)
    _pci(pci_root, "0000:04:00.0", "0x1002", "0x120000")      # processing accelerator
    _pci(pci_root, "0000:05:00.0", "0x1002", "0x040300")      # audio: not a GPU
    _pci(pci_root, "0000:06:00.0", "0x1002", "0x130000")      # the class after accelerators
    _pci(pci_root, "0000:07:00.0", "0x1002", "0x020000")      # network
    _pci(pci_root, "0000:08:00.0", "0x10de", "0x030200")      # another vendor's GPU
    _pci(pci_root, "0000:09:00.0", "garbage", "0x030000")     # unreadable vendor: skipped
    _pci(pci_root, "0000:0a:00.0", "0x1002")                  # no class file: skipped
    assert hardware.pci_devices(0x1002) == ["0000:00:02.0", "0000:03:00.0", "0000:04:00.0"]
    assert hardware.pci_devices(0x10DE) == ["0000:08:00.0"]
    assert hardware.pci_devices(0x8086) == []


def test_no_pci_tree_means_no_pci_devices(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "PCI_ROOT", tmp_path / "absent")
    assert hardware.pci_devices(0x1002) == []


def test_the_hardware_line_names_at_most_four_devices_and_nodes(pci_root, tmp_path):
    for i in range(5):
        _pci(pci_root, f"0000:0{i}:00.0", "0x1002", "0x030000")
        (tmp_path / f"renderD12{i}").write_text("")
    (tmp_path / "kfd").write_text("")
    nodes = (str(tmp_path / "kfd"), str(tmp_path / "renderD*"), str(tmp_path / "kfd"))
    assert hardware.device_nodes(*nodes) == [str(tmp_path / n) for n in (
        "kfd", "renderD120", "renderD121", "renderD122", "renderD123", "renderD124")]
    assert hardware.hardware_summary("AMD", 0x1002, *nodes) == (
        "hardware: 5 AMD PCI device(s) (0000:00:00.0, 0000:01:00.0, 0000:02:00.0, "
        f"0000:03:00.0); {tmp_path}/kfd, {tmp_path}/renderD120, {tmp_path}/renderD121, "
        f"{tmp_path}/renderD122")


def test_the_hardware_line_without_hardware(pci_root, tmp_path):
    nodes = (str(tmp_path / "kfd"), str(tmp_path / "renderD*"))
    assert hardware.hardware_summary("AMD", 0x1002, *nodes) == (
        f"hardware: 0 AMD PCI device(s); no {tmp_path}/kfd / {tmp_path}/renderD* node")


def test_visible_devices_note_quotes_each_set_variable(monkeypatch):
    monkeypatch.setenv("FAKE_A", "0,1")
    monkeypatch.delenv("FAKE_B", raising=False)
    monkeypatch.setenv("FAKE_C", "")
    assert hardware.visible_devices_note("FAKE_A", "FAKE_B", "FAKE_C") == \
        "; FAKE_A='0,1'; FAKE_C=''"
    assert hardware.visible_devices_note("FAKE_B") == ""


@pytest.mark.parametrize("cuda, hip, xpu, line", [
    (None, None, None, "torch 9.9.9 (CPU-only build)"),
    ("12.8", None, None, "torch 9.9.9 CUDA 12.8"),
    (None, "6.4", None, "torch 9.9.9 HIP 6.4"),
    (None, None, "20250101", "torch 9.9.9 XPU 20250101"),
    ("12.8", "6.4", "20250101", "torch 9.9.9 CUDA 12.8 HIP 6.4 XPU 20250101"),
])
def test_the_torch_build_line(monkeypatch, cuda, hip, xpu, line):
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    for attr, value in (("cuda", cuda), ("hip", hip), ("xpu", xpu)):
        monkeypatch.setattr(torch.version, attr, value, raising=False)
    assert hardware.torch_build() == line


def test_a_test_allocation_reads_back_or_says_why_not(monkeypatch):
    assert hardware.try_allocate("cpu") is None
    real = torch.ones
    monkeypatch.setattr(torch, "ones", lambda *a, **k: real(*a, **k) - 1)
    assert hardware.try_allocate("cpu") == "a test allocation on cpu read back a wrong value"

    def boom(*a, **k):
        raise RuntimeError("out of memory (fixture)")
    monkeypatch.setattr(torch, "ones", boom)
    assert hardware.try_allocate("cpu:3") == \
        "a test allocation on cpu:3 failed: RuntimeError: out of memory (fixture)"
