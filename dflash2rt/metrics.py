"""A run's speculation metrics in the Prometheus text exposition format, named after vLLM's.

vLLM serves its spec-decode counters on ``/metrics`` (``vllm:spec_decode_num_drafts_total``,
``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total``,
``..._num_accepted_tokens_per_pos_total{position="i"}``, ``vllm:generation_tokens_total``).
dflash2rt is a library and a command, not a server, so one run's metrics go to a file instead,
in the same format and under the same names with a ``dflash2rt:`` prefix:

    text = dflash2rt.metrics.prometheus_text(res.stats)     # the exposition, as a string
    dflash2rt.run(..., metrics="run.prom")                  # written after the run
    dflash2rt run --metrics run.prom ...                    # the same from the command line

The file suits node_exporter's textfile collector (written whole, then renamed into place) and
any parser of the format. Counters (``_total``) count this run only; the gauges are the mean
acceptance length, the acceptance rate and the per-position rates. Every series named as one of
vLLM's has vLLM's definition (``vllm/v1/spec_decode/metrics.py``): the acceptance rate is
accepted / drafted tokens, the mean acceptance length 1 + accepted / drafts, and
``dflash2rt:spec_decode_acceptance_rate_per_pos`` accepted_per_pos / drafts, what vLLM's
dashboards compute. Two series vLLM lacks, under names of their own:
``dflash2rt:spec_decode_num_reached_tokens_per_pos_total`` (drafts that verified position i:
with adaptive block sizes not every draft has every position, so accepted / drafts understates
a deep position's rate) and ``dflash2rt:spec_decode_conditional_acceptance_rate_per_pos``
(accepted / reached). Position i is draft slot i + 1, the first token after the anchor being
position 0, as in vLLM. Label names follow Prometheus's grammar, ``[a-zA-Z_][a-zA-Z0-9_]*``
(ASCII). RunStats documents how each number is counted.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping, Sequence

from .engine.stats import RunStats
from .errors import InvalidInputError

PREFIX = "dflash2rt:"
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def labels_text(labels: Mapping[str, str]) -> str:
    """``{k="v",...}`` with Prometheus's escapes ("" for no labels)."""
    if not labels:
        return ""
    esc = lambda v: str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")  # noqa: E731
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


def value_text(v: int | float) -> str:
    """A sample's value as the Prometheus Python client writes it."""
    return str(v) if isinstance(v, int) else repr(float(v))


def _family(name: str, kind: str, help_: str, samples: Sequence[tuple[dict, int | float]]
            ) -> list[str]:
    """One metric family: HELP and TYPE lines (counters named with ``_total``, as the
    Prometheus Python client writes them), then its samples."""
    name = PREFIX + name + ("_total" if kind == "counter" else "")
    return [f"# HELP {name} {help_}", f"# TYPE {name} {kind}",
            *(f"{name}{labels_text(lab)} {value_text(v)}" for lab, v in samples)]


def prometheus_text(stats: RunStats, labels: Mapping[str, str] | None = None) -> str:
    """The run's speculation metrics as Prometheus text; ``labels`` (e.g. ``model_name``) go
    on every sample. A target-only run has no drafts: its counters and gauges are 0."""
    if not isinstance(stats, RunStats):
        raise InvalidInputError(f"prometheus_text needs a RunStats (RunResult.stats), got "
                                f"{type(stats).__name__}")
    base = dict(labels or {})
    bad = [k for k in base if not isinstance(k, str) or not LABEL_NAME.fullmatch(k)
           or k.startswith("__") or k == "position"]
    if bad:
        raise InvalidInputError(f"metric label names must match [a-zA-Z_][a-zA-Z0-9_]* (ASCII, "
                                f"Prometheus's grammar), not be 'position' nor start with "
                                f"'__': {bad}")
    one = lambda v: [(base, v)]                                           # noqa: E731
    per_pos = lambda vs: [({**base, "position": str(i)}, v) for i, v in enumerate(vs)]  # noqa: E731
    lines = [
        *_family("spec_decode_num_drafts", "counter", "Speculative request-steps (one draft "
                 "block verified for one request); target-only steps are not drafts.",
                 one(stats.num_drafts)),
        *_family("spec_decode_num_draft_tokens", "counter", "Draft tokens verified.",
                 one(stats.num_draft_tokens)),
        *_family("spec_decode_num_accepted_tokens", "counter", "Draft tokens accepted.",
                 one(stats.num_accepted_tokens)),
        *_family("spec_decode_num_accepted_tokens_per_pos", "counter", "Draft tokens accepted "
                 "per draft position (0: the first draft token).",
                 per_pos(stats.accepted_per_pos)),
        *_family("spec_decode_num_reached_tokens_per_pos", "counter", "Drafts that verified "
                 "the draft position (the block had it and every earlier position was "
                 "accepted).", per_pos(stats.reached_per_pos)),
        *_family("generation_tokens", "counter", "Tokens returned to the caller.",
                 one(stats.generated)),
        *_family("spec_decode_mean_acceptance_length", "gauge", "Mean tokens committed per "
                 "draft, the bonus token included: 1 + accepted / drafts (0: no drafts).",
                 one(stats.mean_acceptance_length)),
        *_family("spec_decode_acceptance_rate", "gauge", "Accepted over drafted tokens "
                 "(0: no drafts).", one(stats.acceptance_rate)),
        *_family("spec_decode_acceptance_rate_per_pos", "gauge", "Drafts that accepted the "
                 "draft position over all drafts, as vLLM's per-position acceptance rate "
                 "(0: no drafts).", per_pos(stats.acceptance_rate_per_pos)),
        *_family("spec_decode_conditional_acceptance_rate_per_pos", "gauge", "P(draft "
                 "position accepted | reached) (0: never reached).",
                 per_pos(stats.conditional_acceptance_rate_per_pos)),
    ]
    return "\n".join(lines) + "\n"


def check_metrics_path(path: str | os.PathLike) -> Path:
    """``path`` as a Path if a metrics file can be written there (its folder exists and it is
    not a folder), else an InvalidInputError; run before decoding, so a bad path fails fast."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise InvalidInputError(f"metrics must be a file path, got {path!r}")
    p = Path(path).expanduser()
    if p.is_dir():
        raise InvalidInputError(f"metrics path {str(p)!r} is a directory; give a file name "
                                "(e.g. run.prom)")
    if not p.parent.is_dir():
        raise InvalidInputError(f"metrics path {str(p)!r}: folder {str(p.parent)!r} does not "
                                "exist; create it or give another path")
    return p


def write_metrics(stats: RunStats, path: str | os.PathLike,
                  labels: Mapping[str, str] | None = None) -> Path:
    """Write ``prometheus_text(stats, labels)`` to ``path`` (a temporary file renamed into
    place, so a collector never reads half a file) → the path written."""
    p = check_metrics_path(path)
    text = prometheus_text(stats, labels)
    tmp = p.with_name(f".{p.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, p)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass                   # the folder refuses writes: nothing was left there
        raise InvalidInputError(f"cannot write metrics file {str(p)!r}: {exc.strerror or exc}; "
                                "give a writable path") from exc
    return p
