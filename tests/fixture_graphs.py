"""Out-of-tree fixture backends with fake graph adapters on CPU (written as real distributions:
dist-info + entry point), for the conformance graphs level's proof of replay."""

from __future__ import annotations

from pathlib import Path

SOURCE = '''
import torch
from dflash2rt.backend import BackendSpec, Probe, TorchOpsBackend
from dflash2rt.graphs.adapter import GraphCaptureError
from dflash2rt.hookspecs import hookimpl

MODE = "{mode}"


class WrongArgmax(torch.overrides.TorchFunctionMode):
    """A miscaptured kernel: inside a replay every argmax returns the next index."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {{}}))
        if func in (torch.argmax, torch.Tensor.argmax):
            dim = (kwargs or {{}}).get("dim", args[1] if len(args) > 1 else -1)
            out = (out + 1) % args[0].shape[dim]
        return out


class Adapter:
    """Fake graphs: replay re-runs the captured step over the static buffers ({mode})."""
    name = "fake-graph-{mode}"

    def new_pool(self):
        return None

    def capture(self, fn, pool):
        if MODE == "refuse":
            raise GraphCaptureError("fake-graph: capture refused by the fixture driver")
        fn()

        class Graph:
            def replay(self):
                if MODE == "differ":
                    with WrongArgmax():
                        fn()
                else:
                    fn()
        return Graph()


def create(p):
    be = TorchOpsBackend("{name}", "cpu", (torch.float32, torch.float64))
    be.graph_adapter = Adapter()
    return be


@hookimpl
def dflash2rt_backends():
    return [BackendSpec("{name}", 1, lambda: Probe(True, device="cpu (fake graphs, {mode})"),
                        create, opt_in=True)]
'''

MODES = ("replay", "refuse", "differ")   # correct graphs; capture refused; replay != eager


def install_graph_backend(root: Path, mode: str) -> str:
    """Install the fixture backend ``graphs-MODE`` under ``root`` (a sys.path entry)."""
    assert mode in MODES, mode
    name = f"graphs-{mode}"
    module = f"fixture_graphs_{mode}"
    (root / f"{module}.py").write_text(SOURCE.format(mode=mode, name=name))
    dist = root / f"{module}-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[dflash2rt.backends]\n{name} = {module}\n")
    return name
