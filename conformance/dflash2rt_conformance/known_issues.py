"""Bugs in dflash2rt's own ops that the suite has found and that are still open.

Each entry marks the affected samples ``xfail`` (non-strict, only for the stated exception type,
so a wrong value still fails) with the precise description; the report lists them. Remove an
entry when the bug is fixed (the sample then passes, and an XPASS in the report says so).
"""

from __future__ import annotations

# (op, sample name) → (exception type name, reason). Empty: the conv bug with taps past the
# block start (slice xb[:, :B - t] with B - t < 0) was fixed in dflash2rt/ops/conv.py.
KNOWN: dict[tuple[str, str], tuple[str, str]] = {}
