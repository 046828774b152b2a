"""Backend discovery and selection.

Plugins come from the entry-point group ``dflash2rt.backends`` (the built-in CPU backend too). Each
entry point is loaded in its own ``try``: a plugin that fails to import or breaks the contract
becomes a row with its reason and never stops the others. Selection is by explicit name, by the
``DFLASH2RT_BACKEND`` variable, or ``auto`` (highest priority available, opt-in backends excluded,
with the reason every other backend was skipped). pluggy is used here only; engines get a typed
:class:`~dflash2rt.backend.Backend`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from . import hookspecs
from .backend import Backend, BackendSpec, Probe
from .errors import BackendUnavailableError, InvalidInputError, UnknownBackendError

ENV_VAR = "DFLASH2RT_BACKEND"


@dataclass(frozen=True)
class BackendStatus:
    """One row of ``dflash2rt backends``."""

    name: str
    available: bool
    reason: str
    device: str
    distribution: str
    version: str
    priority: int | None = None
    opt_in: bool = False
    kernels: str = ""
    dtypes: tuple[str, ...] = ()
    graphs: str = ""
    summary: str = ""
    fp64: bool = True

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["dtypes"] = list(self.dtypes)
        return d


@dataclass(frozen=True)
class Selection:
    """The chosen backend, why, and why every other candidate was skipped."""

    backend: Backend
    name: str
    how: str                                   # "explicit", "env DFLASH2RT_BACKEND", "auto"
    skipped: tuple[tuple[str, str], ...] = ()  # (name, reason)

    def describe(self) -> str:
        lines = [f"backend {self.name} ({self.how}) on {self.backend.device}"]
        lines += [f"  skipped {n}: {r}" for n, r in self.skipped]
        return "\n".join(lines)


@dataclass
class _Entry:
    spec: BackendSpec
    plugin: str
    distribution: str
    version: str
    probe: Probe | None = None
    devices: dict[int, Probe] = field(default_factory=dict)     # "name:index" probes


def split_device(name: str) -> tuple[str, int | None]:
    """"cuda:1" → ("cuda", 1); a name without a device index → (name, None)."""
    base, sep, index = name.rpartition(":")
    return (base, int(index)) if sep and base and index.isdigit() else (name, None)


def _probed(probe) -> Probe:
    try:
        return probe()
    except Exception as exc:  # noqa: BLE001 - the reason is the result
        return Probe(False, f"probe raised {type(exc).__name__}: {exc}")


@dataclass
class Registry:
    """Loaded plugins, their backends, and the failures met while loading them."""

    pm: pluggy.PluginManager = field(default_factory=lambda: pluggy.PluginManager(
        hookspecs.PROJECT))
    entries: dict[str, _Entry] = field(default_factory=dict)
    failures: list[BackendStatus] = field(default_factory=list)
    vendors: list[Any] = field(default_factory=list)    # plugin_kit.GpuVendor, from the plugins

    def __post_init__(self) -> None:
        self.pm.add_hookspecs(hookspecs)

    @classmethod
    def discover(cls, group: str = hookspecs.ENTRY_POINT_GROUP) -> "Registry":
        """Load every entry point of ``group``, one at a time."""
        reg = cls()
        for ep in sorted(metadata.entry_points(group=group), key=lambda e: e.name):
            dist = ep.dist.name if ep.dist else "?"
            version = ep.dist.version if ep.dist else "?"
            try:
                plugin = ep.load()
            except BaseException as exc:  # noqa: BLE001 - any import failure is a reason
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                reg._fail(ep.name, f"plugin failed to import ({ep.value}): "
                          f"{type(exc).__name__}: {exc}", dist, version)
                continue
            reg.register(plugin, ep.name, dist, version)
        return reg

    def register(self, plugin: object, name: str, distribution: str = "",
                 version: str = "") -> None:
        """Register one plugin object and collect its backends; contract breaks become reasons."""
        try:
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            self._fail(name, f"plugin breaks the hook contract: {exc}", distribution, version)
            return
        hook = self.pm.hook
        for impl in [i for i in hook.dflash2rt_gpu_vendors.get_hookimpls() if i.plugin is plugin]:
            self.vendors += self._call(impl, name, distribution, version) or []
        for impl in [i for i in hook.dflash2rt_backends.get_hookimpls() if i.plugin is plugin]:
            specs = self._call(impl, name, distribution, version) or []
            if not all(isinstance(s, BackendSpec) for s in specs):
                self._fail(name, "dflash2rt_backends must return BackendSpec objects",
                           distribution, version)
                continue
            for spec in specs:
                if spec.name in self.entries:
                    self._fail(spec.name, f"duplicate backend name from plugin {name!r}; "
                               f"already provided by {self.entries[spec.name].plugin!r}",
                               distribution, version)
                    continue
                self.entries[spec.name] = _Entry(spec, name, distribution, version)

    def _call(self, impl: Any, name: str, distribution: str, version: str) -> list:
        """One hook impl of one plugin, so a plugin that raises cannot hide the others."""
        try:
            return list(impl.function())
        except Exception as exc:  # noqa: BLE001 - reported, never raised
            self._fail(name, f"{impl.function.__name__}() raised {type(exc).__name__}: {exc}",
                       distribution, version)
            return []

    def _fail(self, name: str, reason: str, distribution: str, version: str) -> None:
        self.failures.append(BackendStatus(name, False, reason, "", distribution, version))

    def probe(self, name: str) -> Probe:
        """Probe one backend (cached), "name:index" for one device of a backend with several;
        a probe that raises is an unavailable backend."""
        base, index = split_device(name)
        entry = self.entry(base)
        if index is not None:
            if entry.spec.probe_device is None:
                return Probe(False, f"backend {base!r} has no devices to choose from: use "
                             f"{base!r} without ':{index}'")
            if index not in entry.devices:
                entry.devices[index] = _probed(lambda: entry.spec.probe_device(index))
            return entry.devices[index]
        if entry.probe is None:
            entry.probe = _probed(entry.spec.probe)
        return entry.probe

    def statuses(self) -> list[BackendStatus]:
        """Every backend and every failed plugin, best first."""
        rows = []
        for name, e in self.entries.items():
            p = self.probe(name)
            rows.append(BackendStatus(
                name, p.available, p.reason, p.device, e.distribution, e.version,
                e.spec.priority, e.spec.opt_in, p.kernels, p.dtypes, p.graphs, e.spec.summary,
                p.fp64))
        rows.sort(key=lambda s: -(s.priority or 0))
        return rows + list(self.failures)

    def entry(self, name: str) -> _Entry:
        """The installed entry (spec, distribution, version) of backend ``name``, or
        UnknownBackendError saying which are installed."""
        if name not in self.entries:
            known = ", ".join(sorted(self.entries)) or "none"
            failed = [f for f in self.failures if f.name == name]
            hint = f" ({failed[0].reason})" if failed else ""
            raise UnknownBackendError(
                f"unknown backend {name!r}{hint}; installed backends: {known}. "
                "Install its plugin package (e.g. dflash2rt-cuda) or pick one of these.")
        return self.entries[name]

    def create(self, name: str) -> Backend:
        """Build the named backend ("name:index": on that device) or raise
        BackendUnavailableError with the probe's reason."""
        entry = self.entry(split_device(name)[0])
        probe = self.probe(name)
        if not probe.available:
            raise BackendUnavailableError(f"backend {name!r} is not available here: "
                                          f"{probe.reason}")
        return entry.spec.create(probe)

    def select(self, name: str | None = None) -> Selection:
        """Explicit name > $DFLASH2RT_BACKEND > auto (loud when explicit, reasoned when auto)."""
        how = "explicit"
        if name is not None and not isinstance(name, str):
            raise InvalidInputError(f"a backend name must be a string (e.g. 'cpu', 'cuda:1', "
                                    f"'auto') or None for the default, got {name!r}")
        if name is None:
            name = os.environ.get(ENV_VAR) or "auto"
            how = f"env {ENV_VAR}"
        if name != "auto":
            return Selection(self.create(name), name, how)
        how = "auto"                          # asked for by name, by the variable or by default
        chosen, skipped = None, []
        for s in self.statuses():
            if s.opt_in:
                reason = "opt-in backend, used only when named"
            elif not s.available:
                reason = s.reason
            elif chosen is None:
                chosen = s.name
                continue
            else:
                reason = f"available, lower priority than {chosen}"
            skipped.append((s.name, reason))
        if chosen is None:
            raise BackendUnavailableError("no backend is available: " + "; ".join(
                f"{n}: {r}" for n, r in skipped))
        return Selection(self.create(chosen), chosen, how, tuple(skipped))
