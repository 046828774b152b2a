"""The pytest plugin (entry point ``pytest11``): options, the backend header and the level
markers; ``session.Recorder`` (registered here) keeps the results and writes the verdict into
the JSON / Markdown / JUnit reports, the terminal summary and the exit status.

Run ``pytest --pyargs dflash2rt_conformance --dflash2rt-backend NAME``. The backend comes only
from ``dflash2rt.registry``. The plugin is inert in other pytest sessions (it only adds its
options) unless ``--dflash2rt-backend`` is given or the conformance package is being collected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from .results import Results
from .sizes import FULL, SMALL, Sizes

STATE = pytest.StashKey["State"]()
DEFAULT_BACKEND = "cpu"


@dataclass
class State:
    """The session's backend selection, options, environment and results."""

    backend_name: str
    model: str
    quick: bool
    small: bool
    json_path: str | None
    markdown_path: str | None
    allow_fallback: bool = False
    statuses: list = field(default_factory=list)
    selection: Any = None
    status: Any = None
    error: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    results: Results = field(default_factory=Results)
    report: dict | None = None                  # Results.as_dict at the end of the session

    @property
    def sizes(self) -> Sizes:
        return SMALL if self.small else FULL

    @property
    def backend(self):
        if self.error:
            pytest.fail(f"dflash2rt conformance: {self.error}", pytrace=False)
        return self.selection.backend


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("dflash2rt", "dflash2rt conformance suite")
    g.addoption("--dflash2rt-backend", default=None, metavar="NAME",
                help=f"backend under test, by registry name (default: {DEFAULT_BACKEND})")
    g.addoption("--dflash2rt-model", default="auto", metavar="MODEL",
                help="L4 model: auto (the bundled pair; the suite's tiny random pair only when "
                     "no bundled pair is installed), tiny, a bundled name, or a directory with "
                     "target/ and draft/")
    g.addoption("--dflash2rt-allow-fallback", action="store_true",
                help="certify a backend asked for by name even though its kernels fell back "
                     "(e.g. to torch ops); the reports say so")
    g.addoption("--dflash2rt-quick", action="store_true",
                help="small samples and smaller laws only (a fast smoke run)")
    g.addoption("--dflash2rt-small", action="store_true",
                help="reduced L2-L4 instances for slow lanes such as triton-interpret "
                     "(sizes.py; named in the header and the reports)")
    g.addoption("--dflash2rt-json", default=None, metavar="FILE", help="write the JSON report")
    g.addoption("--dflash2rt-markdown", default=None, metavar="FILE",
                help="write the Markdown summary")


def _active(config: pytest.Config) -> bool:
    if config.getoption("dflash2rt_backend") is not None:
        return True
    args = list(config.args) + list(config.invocation_params.args)
    return any("dflash2rt_conformance" in str(a) for a in args)


def make_state(config: pytest.Config) -> State:
    """Discover backends and select the one under test (registry only, never a direct import)."""
    from dflash2rt.errors import DFlash2Error
    from dflash2rt.registry import Registry

    from . import env, models

    st = State(config.getoption("dflash2rt_backend") or DEFAULT_BACKEND,
               config.getoption("dflash2rt_model"), config.getoption("dflash2rt_quick"),
               config.getoption("dflash2rt_small"),
               config.getoption("dflash2rt_json"), config.getoption("dflash2rt_markdown"),
               config.getoption("dflash2rt_allow_fallback"))
    st.environment = {"dflash2rt.backend": st.backend_name,
                      "dflash2rt.l4_model": models.describe_l4(st.model),
                      "dflash2rt.allow_fallback": str(st.allow_fallback)}
    reg = Registry.discover()
    st.statuses = reg.statuses()
    try:
        st.selection = reg.select(st.backend_name)
    except DFlash2Error as exc:
        st.error = f"{type(exc).__name__}: {exc}"
        st.environment["dflash2rt.error"] = st.error
        return st
    st.status = next((s for s in st.statuses if s.name == st.selection.name), None)
    st.environment.update(env.properties(st.selection, st.status))
    st.environment["dflash2rt.quick"] = str(st.quick)
    st.environment["dflash2rt.sizes"] = st.sizes.describe()
    return st


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "dflash2rt_level(name): conformance level L0..L4/graphs")
    config.addinivalue_line("markers", "dflash2rt_exhaustive: deselected by --dflash2rt-quick")
    if _active(config):
        from .session import Recorder

        config.stash[STATE] = st = make_state(config)
        config.pluginmanager.register(Recorder(st), "dflash2rt-conformance-recorder")


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    st = config.stash.get(STATE, None)
    if st is None:
        return None
    lines = ["dflash2rt conformance — backends (registry):",
             f"  {'name':<16} {'available':<9} {'plugin':<26} device / reason"]
    for s in st.statuses:
        where = s.device if s.available else s.reason
        lines.append(f"  {s.name:<16} {'yes' if s.available else 'no':<9} "
                     f"{(s.distribution + ' ' + s.version):<26} {where}")
    if st.error:
        lines.append(f"selected: {st.backend_name}: UNAVAILABLE — {st.error}")
        return lines
    e = st.environment
    lines += [f"selected: {st.selection.name} ({st.selection.how}); device {e['device']} "
              f"[{e['device.torch']}]; driver {e['driver']}; runtime {e['runtime']}",
              f"versions: torch {e['torch']}, numpy {e['numpy']}, triton {e['triton']}; plugin "
              f"{e['plugin.distribution']} {e['plugin.version']}; dflash2rt-conformance "
              f"{e['dflash2rt-conformance']}; commit {e['git.commit']}",
              f"implementation: {e['dflash2rt.implementation']}; graphs: {e['backend.graphs']}"
              + _fallback_note(st),
              f"mode: {'quick' if st.quick else 'full'}; L2-L4 sizes: {st.sizes.describe()}; "
              f"L4 model: {e['dflash2rt.l4_model']}"]
    return lines


def _fallback_note(st: State) -> str:
    kernel_fb = getattr(st.selection.backend, "kernel_fallbacks", None)
    if not kernel_fb:
        return ""
    verdict = ("allowed by --allow-fallback" if st.allow_fallback else "accepted (auto selection)"
               if st.selection.how == "auto" else "REFUSED (asked for by name; --allow-fallback)")
    return f"; kernel fallback {verdict}: {'; '.join(kernel_fb)}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    st = config.stash.get(STATE, None)
    if st is None:
        return
    keep, drop = [], []
    for item in items:
        m = item.get_closest_marker("dflash2rt_level")
        if m is not None:
            item.extra_keyword_matches.add(m.args[0])
            item.user_properties.append(("dflash2rt_level", m.args[0]))
        (drop if st.quick and item.get_closest_marker("dflash2rt_exhaustive") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
