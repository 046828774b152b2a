"""The float64 oracle: every DFlash2 op written again in NumPy only (no torch, no dflash2rt).

Modules: ``rng`` (Philox-4x32-10 and uniforms), ``sampling`` (target_probs, inverse_cdf),
``conv``, ``attention`` (key ranges over cache rows, GQA), ``selector`` (top-K,
unary/softcap, lattice, walk), ``verify`` (greedy and chain
speculative sampling), ``rope`` (frequencies and attention scaling from a checkpoint's
config.json), ``model`` (RMSNorm, GQA attention, SwiGLU, target and draft forwards), ``step`` (one full speculative step), ``laws`` (exact law enumeration) and
``mutants`` (seeded buggy verifiers the L0 oracle must detect). Inputs are NumPy arrays that
the suite has already rounded to the dtype under test; all arithmetic is float64.
"""
