"""Triton kernels of the DFlash2 ops, written once for every GPU vendor (and the interpreter).

Importing this package imports triton; only kernel-backed backends do that. Each op module has a
private ``@triton.jit`` kernel, a launcher that checks and reshapes, and a thin public wrapper
with the signature of the reference op in ``dflash2rt.ops``. Launch parameters come from a
per-vendor tuning table (``Tuning``) that the plugin passes in.
"""

from .tuning import interpreting

if interpreting():          # device-function calls without a language re-patch each
    from .interpreter_calls import install

    install()
