"""Device-function calls at the interpreter's launch cost, not at a re-patch each.

Triton's interpreter maps ``triton.language`` onto NumPy by patching the language modules when a
kernel launches (``_patch_lang``) and restoring them when it returns. It also runs that patching
again on *every call of a ``@triton.jit`` device function* inside the kernel, although the modules
are already patched for the launch: each re-patch walks the members of ``tl``, ``tl.tensor`` and
``tl.math`` with ``inspect.getmembers`` and finds nothing left to replace (patched members are no
longer builtins; the rest is set to the values it already holds). For kernels that call small
device functions in loops, the float32 formulation of verification above all, that walk is most
of the interpreter's time.

``install()`` wraps ``_patch_lang`` so that, inside a launch, a device function whose language
modules the launch has already patched skips the walk; the launch's own patching and restoring
are upstream's, unchanged. It only ever runs under ``TRITON_INTERPRET=1`` (the interpreter lanes:
what the kernels compute is the same, only sooner), and does nothing if this Triton's interpreter
does not have the shape it expects (then every call re-patches, as upstream does).
"""

from __future__ import annotations

import inspect

_state: dict = {"patched": None}     # ids of the language modules the open launch has patched


class _Unchanged:
    """A device function's scope when its modules are already patched: nothing to restore
    (upstream discards a device function's scope without restoring it either)."""

    def restore(self) -> None:
        pass


class _LaunchScope:
    """The launch's own scope: restoring it ends the launch."""

    def __init__(self, scope) -> None:
        self.scope = scope

    def restore(self) -> None:
        _state["patched"] = None
        self.scope.restore()


def launch_open() -> bool:
    """Whether an interpreted launch is running (its language patching in force)."""
    return _state["patched"] is not None


_langs_of: dict = {}                 # function → ids of the language modules its globals hold


def _lang_ids(fn, tl) -> frozenset:
    ids = _langs_of.get(fn)
    if ids is None:
        ids = _langs_of[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                        if inspect.ismodule(v) and v in (tl, tl.core))
    return ids


def install() -> bool:
    """Wrap the interpreter's ``_patch_lang`` (once per process); False when this Triton's
    interpreter lacks what the wrapper relies on (then nothing is changed)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_lang", None)
    if getattr(original, "dflash2rt_wrapped", False):
        return True
    if original is None or not hasattr(interpreter, "GridExecutor") \
            or not hasattr(interpreter, "InterpretedFunction"):
        return False

    def patch_lang(fn):
        langs = _lang_ids(fn, tl)
        patched = _state["patched"]
        if patched is None:                        # a launch begins: upstream patches
            scope = original(fn)
            _state["patched"] = langs
            return _LaunchScope(scope)
        if langs <= patched:                       # a device call, modules already patched
            return _Unchanged()
        _state["patched"] = patched | langs        # a device call reaching other modules
        return original(fn)

    patch_lang.dflash2rt_wrapped = True
    interpreter._patch_lang = patch_lang
    return True
