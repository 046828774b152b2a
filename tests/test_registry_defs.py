"""The registry's discovery, probes, rows and selection against its documented contract, written
out by hand for scripted plugins (fake entry points, counted probes): exact rows, reasons, order."""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import pytest

from dflash2rt import registry as registry_mod
from dflash2rt.backend import BackendSpec, Probe, TorchOpsBackend
from dflash2rt.errors import BackendUnavailableError, InvalidInputError, UnknownBackendError
from dflash2rt.hookspecs import hookimpl
from dflash2rt.registry import ENV_VAR, BackendStatus, Registry, Selection, split_device


class _Counted:
    """A probe that counts its calls and returns a fixed Probe (or raises ``exc``)."""

    def __init__(self, probe: Probe | None = None, exc: Exception | None = None) -> None:
        self.probe, self.exc, self.calls = probe, exc, 0

    def __call__(self) -> Probe:
        self.calls += 1
        if self.exc is not None:
            raise self.exc
        return self.probe


def _create(name: str):
    return lambda p: TorchOpsBackend(name, "cpu", ())


def _spec(name: str, priority, probe, *, opt_in=False, summary="", probe_device=None):
    if isinstance(probe, Probe):
        probe = _Counted(probe)
    return BackendSpec(name, priority, probe, _create(name), summary=summary, opt_in=opt_in,
                       probe_device=probe_device)


class _Plugin:
    """A plugin object offering ``specs`` (and ``vendors`` through the vendor hook)."""

    def __init__(self, specs, vendors=None) -> None:
        self.specs, self.vendors = list(specs), vendors

    @hookimpl
    def dflash2rt_backends(self):
        return self.specs


class _VendorPlugin(_Plugin):
    @hookimpl
    def dflash2rt_gpu_vendors(self):
        return self.vendors


OK = Probe(True, device="here")


def _reg(*plugins) -> Registry:
    reg = Registry()
    for i, p in enumerate(plugins):
        reg.register(p, f"plugin{i}", f"dist{i}", f"{i}.0")
    return reg


# split_device ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, want", [
    ("cuda:1", ("cuda", 1)), ("cuda:0", ("cuda", 0)), ("cuda:12", ("cuda", 12)),
    ("cuda", ("cuda", None)), (":1", (":1", None)), ("cuda:", ("cuda:", None)),
    ("a:b:2", ("a:b", 2)), ("cuda:-1", ("cuda:-1", None)), ("weird:x", ("weird:x", None)),
    ("", ("", None)),
])
def test_split_device_each_part_alone(name, want):
    """A device index needs a separator, a base and digits: each missing alone gives no index."""
    assert split_device(name) == want


# rows ------------------------------------------------------------------------------------------

def test_status_defaults_and_dict():
    s = BackendStatus("n", True, "", "d", "dist", "1")
    assert (s.priority, s.opt_in, s.kernels, s.dtypes, s.graphs, s.summary, s.fp64) == \
        (None, False, "", (), "", "", True)
    d = BackendStatus("n", True, "r", "d", "dist", "1", 3, True, "k", ("a", "b"), "g", "s",
                      False).as_dict()
    assert d == {"name": "n", "available": True, "reason": "r", "device": "d",
                 "distribution": "dist", "version": "1", "priority": 3, "opt_in": True,
                 "kernels": "k", "dtypes": ["a", "b"], "graphs": "g", "summary": "s",
                 "fp64": False}


def test_rows_and_selections_are_immutable():
    s = BackendStatus("n", True, "", "d", "dist", "1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.available = False
    assert len({s, BackendStatus("n", True, "", "d", "dist", "1")}) == 1
    sel = Selection(TorchOpsBackend("x", "cpu", ()), "x", "auto")
    with pytest.raises(dataclasses.FrozenInstanceError):
        sel.name = "y"


def test_describe_lists_every_skip_in_order():
    sel = Selection(TorchOpsBackend("x", "cpu", ()), "x", "auto", (("a", "why a"), ("b", "b!")))
    assert sel.describe() == ("backend x (auto) on cpu\n  skipped a: why a\n"
                              "  skipped b: b!")
    assert Selection(TorchOpsBackend("x", "cpu", ()), "x", "explicit").describe() == \
        "backend x (explicit) on cpu"


def test_statuses_copy_every_field_and_sort_best_first():
    rich = Probe(True, "a note", "dev0", "kern", ("float32", "bfloat16"), "graphs on", fp64=False)
    reg = _reg(_Plugin([_spec("low", 1, rich, summary="the low one"),
                        _spec("none", None, Probe(False, "absent")),
                        _spec("high", 7, OK, opt_in=True)]),
               _Plugin([_spec("zero", 0, OK), _spec("mid", 3, OK)]))
    rows = reg.statuses()
    assert [r.name for r in rows] == ["high", "mid", "low", "none", "zero"]
    assert rows[2] == BackendStatus("low", True, "a note", "dev0", "dist0", "0.0", 1, False,
                                    "kern", ("float32", "bfloat16"), "graphs on", "the low one",
                                    False)
    assert rows[3] == BackendStatus("none", False, "absent", "", "dist0", "0.0", None)
    assert rows[0].opt_in is True and rows[4].distribution == "dist1"


def test_priority_zero_and_one_keep_their_order():
    """Registered low first: priority 1 still sorts (and is chosen) before priority 0."""
    reg = _reg(_Plugin([_spec("p0", 0, OK), _spec("p1", 1, OK)]))
    assert [r.name for r in reg.statuses()] == ["p1", "p0"]
    assert reg.select("auto").name == "p1"
    reg = _reg(_Plugin([_spec("pn", None, OK), _spec("pneg", -1, OK)]))
    assert [r.name for r in reg.statuses()] == ["pn", "pneg"]


def test_failures_follow_the_backends_unavailable():
    reg = _reg(_Plugin([_spec("a", 1, OK)]), _Plugin([_spec("a", 2, OK)]))
    rows = reg.statuses()
    assert [(r.name, r.available, r.distribution, r.version) for r in rows] == \
        [("a", True, "dist0", "0.0"), ("a", False, "dist1", "1.0")]
    assert rows[1].reason == ("duplicate backend name from plugin 'plugin1'; already provided "
                              "by 'plugin0'")
    assert rows[1].device == "" and rows[1].priority is None


# register -------------------------------------------------------------------------------------

def test_each_plugin_adds_only_its_own_backends_and_vendors():
    v1, v2, v3 = object(), object(), object()
    reg = _reg(_VendorPlugin([_spec("a", 1, OK)], [v1, v2]), _Plugin([_spec("b", 2, OK)]),
               _VendorPlugin([_spec("c", 3, OK)], [v3]))
    assert reg.failures == []
    assert list(reg.entries) == ["a", "b", "c"]
    assert [(e.plugin, e.distribution, e.version) for e in reg.entries.values()] == \
        [("plugin0", "dist0", "0.0"), ("plugin1", "dist1", "1.0"), ("plugin2", "dist2", "2.0")]
    assert reg.vendors == [v1, v2, v3]


def test_hook_returning_none_is_a_reason_and_empty_adds_nothing():
    reg = _reg(_VendorPlugin([_spec("a", 1, OK)], None), _VendorPlugin([], [1]),
               _Plugin([]))
    assert reg.vendors == [1] and list(reg.entries) == ["a"]
    assert [(f.name, f.reason.split(":")[0]) for f in reg.failures] == \
        [("plugin0", "dflash2rt_gpu_vendors() raised TypeError")]

    class NonePlugin:
        @hookimpl
        def dflash2rt_backends(self):
            return None

    reg = Registry()
    reg.register(NonePlugin(), "none")
    assert reg.entries == {}
    assert [f.reason.split(":")[0] for f in reg.failures] == \
        ["dflash2rt_backends() raised TypeError"]


def test_non_spec_is_refused_whole_beside_a_good_plugin():
    reg = _reg(_Plugin([_spec("a", 1, OK), "not a spec"]), _Plugin([_spec("b", 1, OK)]))
    assert list(reg.entries) == ["b"]
    assert [(f.name, f.reason) for f in reg.failures] == \
        [("plugin0", "dflash2rt_backends must return BackendSpec objects")]


def test_hook_that_raises_is_a_reason_and_others_load():
    class Raising:
        @hookimpl
        def dflash2rt_backends(self):
            raise RuntimeError("no luck")

    reg = Registry()
    reg.register(Raising(), "bad", "bad-dist", "9")
    reg.register(_Plugin([_spec("b", 1, OK)]), "good")
    assert list(reg.entries) == ["b"]
    assert reg.failures == [BackendStatus("bad", False, "dflash2rt_backends() raised "
                                          "RuntimeError: no luck", "", "bad-dist", "9")]


def test_contract_break_unregisters_the_plugin():
    class Misspelled:
        @hookimpl
        def dflash2rt_backend(self):
            return []

    class BadArgs:
        @hookimpl
        def dflash2rt_backends(self, extra):
            return []

    reg = Registry()
    for plugin, name in ((Misspelled(), "miss"), (BadArgs(), "args")):
        reg.register(plugin, name, "d", "v")
        assert not reg.pm.is_registered(plugin)
    assert [f.name for f in reg.failures] == ["miss", "args"]
    assert all(f.reason.startswith("plugin breaks the hook contract: ") and not f.available
               for f in reg.failures)
    reg.register(_Plugin([_spec("b", 1, OK)]), "good")
    assert list(reg.entries) == ["b"] and len(reg.failures) == 2


# discover -------------------------------------------------------------------------------------

def _ep(name, load, dist=("pkg", "1.2")):
    return SimpleNamespace(name=name, value=f"{name}.mod:plugin", load=load,
                           dist=SimpleNamespace(name=dist[0], version=dist[1]) if dist else None)


def _fake_eps(monkeypatch, eps):
    groups = []

    def entry_points(group):
        groups.append(group)
        return list(eps)

    monkeypatch.setattr(registry_mod, "metadata", SimpleNamespace(entry_points=entry_points))
    return groups


def test_discover_loads_in_name_order_and_keeps_the_first_duplicate(monkeypatch):
    def loader(name, prio):
        return lambda: _Plugin([_spec("same", prio, OK), _spec(name, prio, OK)])

    groups = _fake_eps(monkeypatch, [_ep("zeta", loader("z", 2)), _ep("alpha", loader("a", 1),
                                                                       dist=None)])
    reg = Registry.discover("my.group")
    assert groups == ["my.group"]
    assert list(reg.entries) == ["same", "a", "z"]
    assert (reg.entries["same"].plugin, reg.entries["same"].distribution,
            reg.entries["same"].version) == ("alpha", "?", "?")
    assert [(f.name, f.distribution) for f in reg.failures] == [("same", "pkg")]


class _Boom(BaseException):
    pass


def test_import_failures_are_reasons_but_interrupts_propagate(monkeypatch):
    def raising(exc):
        def load():
            raise exc
        return load

    _fake_eps(monkeypatch, [_ep("b", raising(ImportError("gone"))),
                            _ep("c", raising(_Boom("odd"))),
                            _ep("d", lambda: _Plugin([_spec("d", 1, OK)]))])
    reg = Registry.discover()
    assert list(reg.entries) == ["d"]
    assert [(f.name, f.reason, f.available, f.distribution, f.version) for f in reg.failures] == [
        ("b", "plugin failed to import (b.mod:plugin): ImportError: gone", False, "pkg", "1.2"),
        ("c", "plugin failed to import (c.mod:plugin): _Boom: odd", False, "pkg", "1.2")]
    for exc in (KeyboardInterrupt(), SystemExit(3)):
        _fake_eps(monkeypatch, [_ep("a", raising(exc))])
        with pytest.raises(type(exc)):
            Registry.discover()


# probe ----------------------------------------------------------------------------------------

def test_probe_is_cached_and_a_raising_probe_is_unavailable():
    good, bad = _Counted(OK), _Counted(exc=ValueError("boom"))
    reg = _reg(_Plugin([_spec("g", 1, good), _spec("b", 2, bad)]))
    assert reg.probe("g") is reg.probe("g") and good.calls == 1
    p = reg.probe("b")
    assert p == Probe(False, "probe raised ValueError: boom") and bad.calls == 1
    reg.statuses()
    reg.statuses()
    assert (good.calls, bad.calls) == (1, 1)


def test_device_probes_are_cached_per_index_and_apart_from_the_plain_probe():
    calls = []

    def probe_device(i):
        calls.append(i)
        if i == 3:
            raise OSError("no such device")
        return Probe(True, device=f"dev{i}")

    plain = _Counted(Probe(True, device="current"))
    reg = _reg(_Plugin([_spec("m", 1, plain, probe_device=probe_device),
                        _spec("s", 1, OK)]))
    assert reg.probe("m:0").device == "dev0" and reg.probe("m:1").device == "dev1"
    assert reg.probe("m:0") is reg.probe("m:0") and calls == [0, 1]
    assert plain.calls == 0
    assert reg.probe("m").device == "current" and plain.calls == 1
    assert reg.probe("m:3") == Probe(False, "probe raised OSError: no such device")
    assert calls == [0, 1, 3]
    assert reg.probe("s:0") == Probe(False, "backend 's' has no devices to choose from: use 's' "
                                            "without ':0'")
    with pytest.raises(UnknownBackendError):
        reg.probe("nope:0")


def test_create_builds_from_the_probe_of_that_device():
    seen = []
    spec = BackendSpec("m", 1, lambda: Probe(True, device="cur"),
                       lambda p: seen.append(p.device) or TorchOpsBackend("m", "cpu", ()),
                       probe_device=lambda i: Probe(i < 2, "" if i < 2 else f"no m:{i}",
                                                    device=f"d{i}"))
    reg = Registry()
    reg.register(_Plugin([spec]), "p")
    assert reg.create("m:1").name == "m" and reg.create("m").name == "m"
    assert seen == ["d1", "cur"]
    with pytest.raises(BackendUnavailableError, match="^backend 'm:2' is not available here: "
                                                      "no m:2$"):
        reg.create("m:2")


# unknown names --------------------------------------------------------------------------------

def test_unknown_backend_message_exactly():
    with pytest.raises(UnknownBackendError) as err:
        Registry().entry("x")
    assert str(err.value) == ("unknown backend 'x'; installed backends: none. Install its plugin "
                              "package (e.g. dflash2rt-cuda) or pick one of these.")
    reg = _reg(_Plugin([_spec("b", 1, OK), _spec("a", 1, OK)]))
    with pytest.raises(UnknownBackendError, match=r"^unknown backend 'x'; installed backends: "
                                                  r"a, b\. "):
        reg.entry("x")


@pytest.mark.parametrize("name", [0, 1.5, b"cpu", ["cpu"], True, object()])
def test_a_name_that_is_not_a_string_is_refused_naming_it(name, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "cpu")         # not read: the name was given
    reg = _reg(_Plugin([_spec("cpu", 1, OK)]))
    with pytest.raises(InvalidInputError, match=r"^a backend name must be a string \(e\.g\. "
                                                 r"'cpu', 'cuda:1', 'auto'\) or None for the "
                                                 rf"default, got {re.escape(repr(name))}$"):
        reg.select(name)


def test_unknown_backend_names_the_first_failure_of_that_name_only():
    reg = _reg(_Plugin([_spec("a", 1, OK)]))
    reg._fail("other", "other reason", "d", "v")
    with pytest.raises(UnknownBackendError) as err:
        reg.select("x")
    assert "(" not in str(err.value).split(";")[0]
    reg._fail("x", "first reason", "d", "v")
    reg._fail("x", "second reason", "d", "v")
    with pytest.raises(UnknownBackendError) as err:
        reg.select("x")
    assert str(err.value).startswith("unknown backend 'x' (first reason); installed backends: a.")


# select ---------------------------------------------------------------------------------------

def test_auto_skips_each_kind_of_backend_with_its_reason():
    reg = _reg(_Plugin([_spec("optin-best", 9, OK, opt_in=True),
                        _spec("optin-down", 8, Probe(False, "gone"), opt_in=True),
                        _spec("down", 7, Probe(False, "no device")),
                        _spec("first", 5, OK), _spec("second", 4, OK),
                        _spec("third", 0, OK)]))
    sel = reg.select("auto")
    assert (sel.name, sel.backend.name) == ("first", "first")
    assert sel.skipped == (("optin-best", "opt-in backend, used only when named"),
                           ("optin-down", "opt-in backend, used only when named"),
                           ("down", "no device"),
                           ("second", "available, lower priority than first"),
                           ("third", "available, lower priority than first"))


def test_auto_with_nothing_available_lists_every_reason():
    reg = _reg(_Plugin([_spec("o", 9, OK, opt_in=True), _spec("d", 1, Probe(False, "absent"))]))
    with pytest.raises(BackendUnavailableError) as err:
        reg.select("auto")
    assert str(err.value) == ("no backend is available: o: opt-in backend, used only when named; "
                              "d: absent")
    with pytest.raises(BackendUnavailableError, match="^no backend is available: $"):
        Registry().select("auto")


def test_only_one_available_is_chosen_with_no_skips():
    sel = _reg(_Plugin([_spec("only", 1, OK)])).select("auto")
    assert (sel.name, sel.skipped) == ("only", ())


def test_explicit_names_an_opt_in_and_raises_for_unavailable():
    reg = _reg(_Plugin([_spec("o", 9, OK, opt_in=True), _spec("d", 1, Probe(False, "absent")),
                        _spec("c", 0, OK)]))
    sel = reg.select("o")
    assert (sel.name, sel.how, sel.skipped) == ("o", "explicit", ())
    with pytest.raises(BackendUnavailableError, match="^backend 'd' is not available here: "
                                                      "absent$"):
        reg.select("d")


@pytest.mark.parametrize("env, name, how", [
    (None, "c", "auto"), ("", "c", "auto"), ("auto", "c", "auto"), ("o", "o", f"env {ENV_VAR}"),
])
def test_environment_variable(monkeypatch, env, name, how):
    reg = _reg(_Plugin([_spec("o", 9, OK, opt_in=True), _spec("c", 0, OK)]))
    if env is None:
        monkeypatch.delenv(ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(ENV_VAR, env)
    sel = reg.select()
    assert (sel.name, sel.how) == (name, how)
    assert reg.select("c").how == "explicit"          # an explicit name beats the variable
    auto = reg.select("auto")                         # "auto" by name: chosen as by default
    assert (auto.name, auto.how) == ("c", "auto") and auto.skipped
