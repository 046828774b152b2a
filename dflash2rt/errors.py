"""The dflash2rt error hierarchy: every validation failure is one of these typed errors."""

from __future__ import annotations


class DFlash2Error(Exception):
    """Base class of every error dflash2rt raises on purpose."""


class BackendError(DFlash2Error):
    """A backend could not be found, loaded or used."""


class UnknownBackendError(BackendError, LookupError):
    """A backend name that no installed plugin provides."""


class BackendUnavailableError(BackendError):
    """A known backend that cannot run here; the message carries the probe's reason."""


class PluginError(BackendError):
    """A plugin broke the hook contract (bad return value, misspelled hook, duplicate name)."""


class InvalidInputError(DFlash2Error, ValueError):
    """An argument with a wrong shape, dtype, range or value; the message says what to fix."""


class SamplingParamsError(InvalidInputError):
    """Temperature, top-k, top-p, seed or max_new_tokens out of range."""


class ConflictingArgumentsError(InvalidInputError, TypeError):
    """One setting given twice, e.g. a sampling keyword of ``dflash2rt.run`` together with a
    ``sampling_params`` that carries the same setting; the message names the keywords."""


class ConstraintError(InvalidInputError):
    """A constraint hook that breaks its contract (a mask of the wrong size or type, a start
    state with no allowed token, a table out of range) or a pattern that does not parse."""


class NonFiniteLogitsError(InvalidInputError):
    """Logits or probabilities that contain NaN (or no finite entry at all)."""


class ModelNotFoundError(InvalidInputError, LookupError):
    """A model name that is no local directory, no bundled model, and no hub id that can be
    had (not in the cache offline, no such repository or revision); the message says how to
    get it."""


class MissingExtraError(DFlash2Error, ImportError):
    """A feature whose optional dependencies are not installed; the message names the pip
    extra that brings them (``pip install 'dflash2rt[hub]'``)."""


class CheckpointError(DFlash2Error):
    """A checkpoint that is malformed, incomplete, or does not match its partner model."""


class DraftMismatchError(CheckpointError):
    """A draft that does not fit its target: vocabulary (size or mapping), hidden size, tap
    layers, mask token or tokenizer. Raised from the configs and safetensors headers, before
    any weight is read; the message names the mismatch and what would fix it."""


class ResourceError(DFlash2Error, MemoryError):
    """A run that needs more memory (or another resource) than the device has; the message says
    how much it needs, how much there is, and what to lower."""


class DistributedError(DFlash2Error, RuntimeError):
    """A tensor-parallel run that cannot start or went wrong across ranks: a model that does
    not shard over the ranks (heads, KV heads or the MLP not divisible by tp), a rank that died
    or timed out, ranks that disagree on the committed tokens; the message names the rank."""
