"""The typed backend contract the hot path calls, and its device-generic torch implementation."""

from __future__ import annotations

import abc
import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from .ops import attention as attention_op
from .ops import conv, exact32, fused, selector, verify
from .ops.batch import BlockNoise, SamplingBatch
from .ops.draws import Draws, WalkDraws
from .ops.rng import Stream, uniforms

# What executes an op (Backend.implementation): the words every report uses.
TRITON_KERNEL, TORCH_OPS, TRITON_INTERPRETER = "triton kernel", "torch ops", "triton interpreter"
UNSUPPORTED = "unsupported"    # the op raises a typed error (e.g. no watermark without float64)
OPS = ("conv_prepare", "conv_finish", "select", "verify", "noise", "attention", "rms_norm",
       "attention_prologue", "watermark")
# "watermark": what makes the keyed draws when select / verify are given the watermark's draw
# source (``watermark.generate.KeyedDraws``: the walk under subkey A, the residual / bonus under B)


@dataclass(frozen=True)
class Probe:
    """What a backend found at run time on this machine.

    ``reason`` says why the backend is unavailable (never empty then); for an available backend it
    may add a note. ``kernels``, ``dtypes`` and ``graphs`` say what the backend would use here;
    ``fp64``: whether the device computes in float64 (some Intel GPUs do not).
    """

    available: bool
    reason: str = ""
    device: str = ""
    kernels: str = ""
    dtypes: tuple[str, ...] = ()
    graphs: str = ""
    details: Mapping[str, str] = field(default_factory=dict)
    fp64: bool = True

    def __post_init__(self) -> None:
        if not self.available and not self.reason.strip():
            raise ValueError("an unavailable backend must say why (Probe.reason)")


class Fallbacks:
    """One run's record of every alternative path taken, each once, in order: the backend's
    standing fallbacks first, then what the run reported (a graph bucket run eagerly, a model
    pass skipped, ...). One is made per ``Engine.generate()`` and ends in its RunStats."""

    def __init__(self, standing: Sequence[str] = ()) -> None:
        self.reported: list[str] = []
        for what in standing:
            self.report(what)

    def report(self, what: str) -> None:
        if what not in self.reported:
            self.reported.append(what)


@dataclass(frozen=True)
class BackendSpec:
    """One backend a plugin offers: a run-time probe and a factory for the typed Backend.

    ``priority``: higher is preferred by ``auto`` (the CPU backend is lowest). ``opt_in`` backends
    (e.g. a CPU interpreter lane for GPU kernels) are only used when asked for by name.
    ``probe_device``: for a backend with several devices, the probe of device ``index`` (the
    registry's "name:index", e.g. "cuda:1"); ``probe`` is that of the current device.
    """

    name: str
    priority: int
    probe: Callable[[], Probe]
    create: Callable[[Probe], "Backend"]
    summary: str = ""
    opt_in: bool = False
    probe_device: Callable[[int], Probe] | None = None


def same_device(a: torch.device | str, b: torch.device | str) -> bool:
    """Whether a and b are one device: the type and, for accelerators, the index (no index is
    the type's current device)."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    return a.type in ("cpu", "meta") or _index(a) == _index(b)


def _index(d: torch.device) -> int:
    if d.index is not None:
        return d.index
    module = getattr(torch, d.type, None)
    return int(module.current_device()) if hasattr(module, "current_device") else 0


class Backend(abc.ABC):
    """The DFlash2 ops on one device. Engines call these methods directly (no pluggy dispatch)."""

    name: str
    device: torch.device
    dtypes: tuple[torch.dtype, ...]
    graph_adapter: Any = None            # a dflash2rt.graphs GraphAdapter, or None for eager
    has_fp64: bool = True                # False: the device has no float64 (Intel Arc A-series)

    def __init__(self) -> None:
        self._standing: list[str] = []            # creation-time fallbacks: apply to every run
        self.kernel_fallbacks: list[str] = []     # why the plugin's kernels do not run (standing)

    @property
    def standing_fallbacks(self) -> tuple[str, ...]:
        """The alternative paths reported when the backend was made (torch ops instead of
        kernels, graphs disabled, ...): every run's ``Fallbacks`` starts from them."""
        return tuple(self._standing)

    @property
    def implementation(self) -> dict[str, str]:
        """What executes each op (``OPS``): "triton kernel", "torch ops", "triton interpreter",
        or a plugin's own words. A Backend that runs its own code overrides this ("watermark":
        what makes the keyed draws of the watermark's draw source in its select / verify)."""
        return {**{op: "undeclared" for op in OPS}, "watermark": TORCH_OPS}

    def implementation_summary(self) -> str:
        """One line, e.g. "triton kernel: conv_prepare, conv_finish, select, verify; torch ops:
        noise"; with kernel fallbacks it ends with "(fallback: <why>)"."""
        by_impl: dict[str, list[str]] = {}
        for op, impl in self.implementation.items():
            by_impl.setdefault(impl, []).append(op)
        text = "; ".join(f"{impl}: {', '.join(ops)}" for impl, ops in by_impl.items())
        return text + (f" (fallback: {'; '.join(self.kernel_fallbacks)})"
                       if self.kernel_fallbacks else "")

    def report_kernel_fallback(self, why: str) -> None:
        """The plugin's kernels could not be used and another implementation replaces them (a
        standing fallback that conformance refuses for a backend asked for by name)."""
        if why not in self.kernel_fallbacks:
            self.kernel_fallbacks.append(why)
        self.report_fallback(why)

    def with_standing_fallback(self, what: str) -> "Backend":
        """A shallow copy of this backend whose standing fallbacks add ``what`` (for a run that
        changes the copy, e.g. graphs turned off under tensor parallelism); this one is left
        as it was."""
        twin = copy.copy(self)
        twin._standing = [*self._standing, what]
        return twin

    def report_fallback(self, what: str) -> None:
        """Record a standing alternative path while the backend is being made (plugins call
        this from their factory, e.g. torch ops instead of kernels); what falls back during a
        run is reported to that run's ``Fallbacks`` instead."""
        if what not in self._standing:
            self._standing.append(what)

    model_pass: Callable[[list[torch.nn.Module]], str] | None = None
    """Optional vendor pass over the loaded models (XPU: ``ipex.optimize``); returns what it did."""

    def prepare_models(self, modules: list[torch.nn.Module], fallbacks: Fallbacks
                       ) -> str | None:
        """Run ``model_pass`` once per module (the Engine calls this) → what the pass did to
        these modules (also when an earlier engine ran it), or None without a pass. A failure
        is reported to ``fallbacks`` (again by every later caller for the same modules) and
        leaves the modules as they were."""
        if self.model_pass is None:
            return None
        todo = [m for m in modules if id(self) not in getattr(m, "_dflash2rt_prepared", {})]
        if todo:
            try:
                did, why = self.model_pass(todo), ""
            except Exception as exc:  # noqa: BLE001 - reported; the plain modules stay correct
                why = f"model pass skipped ({type(exc).__name__}: {exc}); the models run unmodified"
                did = None
            for m in todo:
                m._dflash2rt_prepared = {**getattr(m, "_dflash2rt_prepared", {}),
                                         id(self): (why, did)}
        done: list[str] = []
        for m in modules:                          # each module's pass: its failure, its result
            why, did = m._dflash2rt_prepared[id(self)]
            if why:
                fallbacks.report(why)
            if did and did not in done:
                done.append(did)
        return "; ".join(done) or None

    @property
    def compiles_ahead(self) -> bool:
        """Whether this backend's kernels compile for its device when first launched, so that an
        engine compiles them ahead (``compile_ahead``); False (the default): nothing compiles."""
        return False

    def compile_ahead(self, launches: Sequence[Any]) -> dict[Any, str]:
        """Compile the kernel variants of ``launches`` (``kernels.launch.Launch``, collected by
        a shape-only trace) without running them → why each variant that failed to compile
        failed, by compile key (it then compiles when first launched). The default compiles
        nothing."""
        return {}

    @abc.abstractmethod
    def conv_prepare(self, x: torch.Tensor, base: torch.Tensor, delta: torch.Tensor,
                     block_size: int) -> torch.Tensor:
        """Input side of the DFlash2 conv: x [N, H], base [Tk, H], delta [N, Tk, G] → [N, H]."""

    @abc.abstractmethod
    def conv_finish(self, h: torch.Tensor, a: torch.Tensor, base: torch.Tensor,
                    delta: torch.Tensor, block_size: int) -> torch.Tensor:
        """Output side: h + conv(a, base, delta) → [N, H]."""

    @abc.abstractmethod
    def select(self, logits: torch.Tensor, proj: torch.Tensor, anchor: torch.Tensor,
               pred_codebook: torch.Tensor, succ_codebook: torch.Tensor,
               params: selector.SelectorParams, sampling: SamplingBatch,
               draws: WalkDraws) -> selector.SelectorOut:
        """Candidate selector: top-K, lattice, walk (see ``dflash2rt.ops.selector``). ``draws``:
        the walk's draw source (``dflash2rt.ops.draws``): the walk uniforms [R, γ], or a
        ``DrawSource`` such as the watermark's keyed draws, which a device that cannot make
        them refuses (``WatermarkUnsupportedError`` without float64), never replacing them."""

    @abc.abstractmethod
    def verify(self, logits: torch.Tensor, draft: torch.Tensor, candidates: torch.Tensor,
               q: torch.Tensor, sampling: SamplingBatch, draws: Draws,
               check: bool = True) -> verify.VerifyOut:
        """Lossless verification (see ``dflash2rt.ops.verify``). ``draws``: the block's
        ``BlockNoise``, or a ``DrawSource`` (its acceptance coins and residual / bonus draws;
        refused as in ``select`` where the device cannot make them)."""

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor,
                  hi: torch.Tensor, scale: float) -> torch.Tensor:
        """Attention over cache rows: q [R, T, nh, hd], k/v [R, L, n_kv, hd]; row (r, j) sees
        keys lo[r, j] <= p < hi[r, j] (see ``dflash2rt.ops.attention``). Default: torch SDPA."""
        return attention_op.attention(q, k, v, lo, hi, scale)

    def noise(self, seed: torch.Tensor, request: torch.Tensor, anchor_pos: torch.Tensor,
              gamma: int) -> BlockNoise:
        """All uniforms of one step, from the counter-based generator (identical on every device)."""
        return BlockNoise.draw(seed, request, anchor_pos, gamma)

    def token_uniforms(self, seed: torch.Tensor, request: torch.Tensor, position: torch.Tensor,
                       lead: int = 0) -> torch.Tensor:
        """seed, request, position [R] → [R] float32: the bonus stream's uniform that decides
        the token at position[r] + lead (prefill's first token, a target-only step's), from
        the same generator as ``noise``."""
        return uniforms(seed, request, position + lead if lead else position, Stream.BONUS)

    # The models' fusable ops (``ops.fused``, same contracts): with ``fuses_model_ops`` the
    # models run this backend's ``rms_norm`` and ``attention_prologue`` during a decode.
    fuses_model_ops: bool = False

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return fused.rms_norm(x, weight, eps)

    def attention_prologue(self, *args: Any) -> torch.Tensor:
        return fused.attention_prologue(*args)

    def device_guard(self) -> contextlib.AbstractContextManager:
        """The backend's device made current (``torch.<type>.device``): Triton launches on the
        current device, and a graph captures there, whatever device the tensors are on. A null
        context where the device module has no such guard (the CPU)."""
        module = getattr(torch, self.device.type, None)
        if not hasattr(module, "device"):
            return contextlib.nullcontext()
        return module.device(self.device)

    def run_context(self) -> contextlib.AbstractContextManager:
        """Entered by the Engine around the whole decode of a ``generate()`` call: the device
        guard, with ``has_fp64`` False the float32 formulation for the ops the engine calls
        directly (``sample_next``, ``dflash2rt.ops.exact32``), and with ``fuses_model_ops``
        this backend's kernels for the models' norms and attention prologues
        (``ops.fused.using``)."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.device_guard())
        if not self.has_fp64:
            stack.enter_context(exact32.without_fp64())
        if self.fuses_model_ops:                  # the models' fusable ops: its kernels
            stack.enter_context(fused.using(self))
        return stack


class TorchOpsBackend(Backend):
    """The reference semantics: device-generic torch ops, eager, on ``device``."""

    def __init__(self, name: str, device: torch.device | str,
                 dtypes: tuple[torch.dtype, ...], has_fp64: bool = True) -> None:
        super().__init__()
        self.name = name
        self.device = torch.device(device)
        self.dtypes = dtypes
        self.has_fp64 = has_fp64

    @property
    def implementation(self) -> dict[str, str]:
        return {**{op: TORCH_OPS for op in OPS},
                "watermark": TORCH_OPS if self.has_fp64 else UNSUPPORTED}

    def conv_prepare(self, x, base, delta, block_size):
        return conv.conv_prepare(x, base, delta, block_size)

    def conv_finish(self, h, a, base, delta, block_size):
        return conv.conv_finish(h, a, base, delta, block_size)

    def select(self, logits, proj, anchor, pred_codebook, succ_codebook, params, sampling, draws):
        return selector.select(logits, proj, anchor, pred_codebook, succ_codebook, params,
                               sampling, draws, self.has_fp64)

    def verify(self, logits, draft, candidates, q, sampling, draws, check=True):
        return verify.verify(logits, draft, candidates, q, sampling, draws, check, self.has_fp64)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} on {self.device}>"
