"""The per-step rule of adaptive speculation (docs/adaptive.md): ``AdaptiveSchedule`` keeps each
live request's acceptance estimates α_{r,i} (a prior pooled over earlier calls, exponential
forgetting) and a cost table (fixed, or measured: ``MeasuredTable``, table.py), and chooses
each step's block b among ``candidates`` (1: a target-only step) from the past only: the rate
Σ_rows E_r[b] / cost(b, bucket), or with the rows' remaining budgets the projected time until
the batch's slowest row is done (finish.py), with probes back to speculation after runs of
target-only steps. ``begin`` freezes the table and pool a call decides with; ``end`` folds the
call's step times and acceptance into the table. It is pure enough to drive by hand:

    s = AdaptiveSchedule((1, 2, 4, 8), costs={1: 1.0, 2: 1.3, 4: 1.5, 8: 2.0})  # fixed table
    s.begin("sampled")                          # a new batch: forget its estimates; its mode
    b = s.choose(rows)                          # rows: the live requests' keys (hashable)
    b = s.choose(rows, remaining=[40, 12])      # or: projected time to finish the batch
    s.observe(rows, b, accepted, seconds)       # accepted[i]: drafts accepted for rows[i]
    s.end()                                     # the batch is done: fold its step times in
"""

from __future__ import annotations

from typing import Hashable, Iterable, Mapping, Sequence

from ...errors import InvalidInputError
from . import acceptance
from .acceptance import PRIOR_WEIGHT
from .finish import BlockLaw, expected_of, finish_rates, finish_steps
from .table import TRACK, MeasuredTable, add_measured_begin_listener, bucket_of, \
    measured_begin


MODES = ("greedy", "sampled")
# The mechanisms an ablation may switch off (``without``; docs/adaptive.md says what replaces
# each one). The policy's own: "call_plan" (adaptive.py, call_plan.py).
ABLATIONS = frozenset({"row_alpha", "row_scale", "pooled_prior", "cost_table", "drift",
                       "finish_rule", "call_plan", "probes", "calibration"})
UNIT_COST = 1.0     # "cost_table" off: every step of every block costs this
__all__ = ["ABLATIONS", "MODES", "UNIT_COST", "AdaptiveSchedule", "add_measured_begin_listener",
           "default_candidates"]


def default_candidates(block: int) -> tuple[int, ...]:
    """1, the powers of two below the draft's block size, that block size and twice it: few
    sizes, so graphs capture few buckets (the bundled block 8: 1, 2, 4, 8, 16). A draft keeps
    being accepted past its trained block where the target is predictable (the bundled pair at
    T = 0), and the schedule only takes the larger block where its measured acceptance pays for
    it."""
    return tuple(sorted({1, block, 2 * block} | {1 << k for k in range(1, block.bit_length())
                                                 if 1 << k < block}))


class AdaptiveSchedule:
    """Per-request acceptance estimates (reset by ``begin``) and a cost table (fixed, or
    measured by calibration and tracked between calls, possibly shared: ``table``);
    ``choose`` / ``observe`` / ``end``. ``without``: mechanisms switched off (``ABLATIONS``)."""

    def __init__(self, candidates: Sequence[int], costs: Mapping | None = None, *,
                 prior: float = 0.8, prior_weight: float | Mapping[str, float] = PRIOR_WEIGHT,
                 decay: float = 0.9,
                 probe: int = 4, max_probe: int = 64, reps: int = 3, track: float | None = None,
                 table: MeasuredTable | None = None,
                 without: Iterable[str] = frozenset()) -> None:
        self.without = frozenset(without)
        if not self.without <= ABLATIONS:
            raise InvalidInputError(f"unknown mechanisms {sorted(self.without - ABLATIONS)} in "
                                    f"without: the adaptive ones are {sorted(ABLATIONS)}")
        if "cost_table" in self.without:      # a fixed table in which every step costs alike
            costs = dict.fromkeys(candidates, UNIT_COST)
        cands = sorted(set(int(b) for b in candidates))
        if not cands or cands[0] < 1:
            raise InvalidInputError(f"block size candidates must be integers >= 1, got "
                                    f"{list(candidates)!r}")
        self.candidates = tuple(cands)
        self.prior, self.prior_weight, self.decay = prior, prior_weight, decay
        weights = prior_weight if isinstance(prior_weight, Mapping) else \
            dict.fromkeys(MODES, prior_weight)
        if set(weights) != set(MODES) or not all(float(w) > 0 for w in weights.values()):
            raise InvalidInputError(f"prior_weight must be a positive number or one per mode "
                                    f"{MODES}, got {prior_weight!r}")
        self._weights = {m: float(w) for m, w in weights.items()}
        self.probe, self.max_probe, self.reps = probe, max_probe, reps
        if track is None:                  # a fixed table learns nothing unless asked
            track = 0.0 if costs is not None else TRACK
        if not 0.0 <= track <= 1.0:
            raise InvalidInputError(f"track must be in [0, 1], got {track!r}")
        self.track = float(track)
        self.fixed = costs is not None
        self._fixed = dict(costs or {})
        # measured seconds per (block, bucket, mode); ``table``: one shared with others
        self.table = MeasuredTable() if table is None else table
        self._samples = self.table.samples
        self.begin()

    # ---- per batch of requests -------------------------------------------------------------
    def begin(self, mode: str = "greedy", law: Hashable = None) -> None:
        """A new batch of requests: drop per-request estimates and the probe state (the cost
        table is kept); ``mode``: "sampled" if any request samples, else "greedy" (the part of
        a measured table that its costs come from), either followed by ", " and what else
        sets a step's cost (``adaptive.mode_of``: the requests' candidate counts); ``law``:
        what the batch's acceptance depends on besides the pair (the engine passes its
        requests' sampling settings when they share them): the acceptance pool is kept per
        (mode, law)."""
        base = mode.split(", ", 1)[0]
        if base not in MODES:
            raise InvalidInputError(f"schedule mode must be one of {MODES} (then ', ' and "
                                    f"more), got {mode!r}")
        self.mode, self.law = mode, law
        self._pw = self._weights[base]                   # this call's prior weight
        self._rows: dict[Hashable, tuple[list[float], list[float]]] = {}   # accepted, reached
        self._law_cache: dict[Hashable, dict[int, BlockLaw]] = {}          # per row (_laws)
        self._only, self._gap = 0, self.probe          # target-only steps in a row, probe gap
        self._held: tuple | None = None                # the rows of a run of target-only steps
        # the table and pool this call decides with (a copy of the pool for ``replica``)
        self._frozen = {} if self.fixed else self.table.costs_now("drift" not in self.without)
        if not self.fixed:
            measured_begin(self)
        self._pooled = self.table.accept_copy()
        self._pool = self._pooled.pool(mode, law)
        self._steps: dict[tuple[int, int, str], list[float]] = {}   # this call's step seconds
        self._counts: tuple[list[float], list[float]] = ([], [])    # this call's, per slot
        self._made = [0.0, 0.0]        # this call's decode tokens (observed) and seconds

    def replica(self) -> "AdaptiveSchedule":
        """A schedule that decides as this one's current (or last) call did and learns nothing:
        that call's cost table as a fixed one, its acceptance pool, the same parameters,
        ``track=0`` (``AdaptivePolicy.replica`` adds that call's plan). Another engine given it
        chooses the same blocks from the same outcomes (graph replay vs eager, backend vs
        backend)."""
        out = AdaptiveSchedule(self.candidates, self.costs, prior=self.prior,
                               prior_weight=self.prior_weight, decay=self.decay,
                               probe=self.probe, max_probe=self.max_probe, reps=self.reps,
                               track=0.0, table=self._pooled.accept_copy(),
                               without=self.without - {"cost_table"})
        return out

    def end(self) -> tuple[float, float]:
        """The batch is done: fold its decode steps' seconds and its per-slot acceptance
        counts into the table (module docstring; ``track=0``: neither); choices of the next
        ``begin`` see them, this call's never did. → the tokens its observed decode steps
        committed and their seconds (what the call plan folds by default)."""
        steps, self._steps = self._steps, {}
        counts, self._counts = self._counts, ([], [])
        made, self._made = self._made, [0.0, 0.0]
        if self.track == 0.0:
            return made[0], made[1]
        self.table.fold_accept(self.mode, self.law, counts)
        if not self.fixed:
            self.table.fold_costs(steps, self._frozen, self.track,
                                  first="calibration" in self.without)
        return made[0], made[1]

    def alphas(self, row: Hashable, slots: int) -> list[float]:
        """α_1 .. α_slots for ``row`` from its counts (``observe``) and the pool of this mode
        and law (``end``: each slot's acceptance over earlier calls, once it has ``POOL_MIN``
        observations). With a pool whose slot 1 is known: the pooled profile times the row's
        factor (``acceptance.scaled``). Without one (the first call, or the "pooled_prior"
        ablation), or in the "row_scale" ablation: per-slot counts over ``prior_weight``
        (this mode's) pseudo-observations of a chained prior (``acceptance.chained``)."""
        acc, seen = ((), ()) if "row_alpha" in self.without else self._rows.get(row, ((), ()))
        pool = () if "pooled_prior" in self.without else self._pool
        if pool and pool[0] is not None and "row_scale" not in self.without:
            return acceptance.scaled(acc, seen, pool, slots, self.prior)
        return acceptance.chained(acc, seen, pool, slots, self.prior, self._pw)

    def alpha(self, row: Hashable, slot: int) -> float:
        """P(slot accepted | reached) for ``row`` (slots count from 1; see ``alphas``)."""
        return self.alphas(row, slot)[-1] if slot > 0 else self.prior

    def expected(self, row: Hashable, block: int) -> float:
        """E[committed tokens | block] for ``row``: 1 + Σ_j Π_{i≤j} α_i."""
        return expected_of(self.alphas(row, block - 1), block)

    # ---- costs -------------------------------------------------------------------------------
    def cost(self, block: int, bucket: int) -> float | None:
        """Seconds of a step (None: not known yet)."""
        if self.fixed:
            c = self._fixed.get((block, bucket), self._fixed.get(block))
            if c is None:
                raise InvalidInputError(f"the fixed cost table has no entry for block {block} "
                                        f"(bucket {bucket})")
            return float(c)
        key = (block, bucket, self.mode)
        if key in self._frozen:
            return self._frozen[key]
        if "calibration" in self.without:   # untimed: as the cheapest entry the call knows
            known = [c for (_, k, m), c in self._frozen.items() if k == bucket and m == self.mode]
            return min(known, default=UNIT_COST)
        return self.table.calibrated(key)              # calibrated during this call

    def calibrate(self, bucket: int) -> list[int]:
        """The candidates still to time at ``bucket`` (one step each, then ask again)."""
        if self.fixed or "calibration" in self.without:
            return []
        return [b for b in self.candidates
                if len(self._samples.get((b, bucket, self.mode), ())) < self.reps]

    def measure(self, block: int, bucket: int, seconds: float) -> None:
        """One calibration step's seconds (ignored once the entry holds ``reps`` samples)."""
        s = self._samples.setdefault((block, bucket, self.mode), [])
        if not self.fixed and len(s) < self.reps:
            s.append(float(seconds))

    @property
    def costs(self) -> dict[tuple[int, int], float]:
        """The cost table of the current mode as the current (or last) call decides with it:
        (block, bucket) → seconds; bucket 0: a fixed entry for every bucket."""
        if self.fixed:
            return {k if isinstance(k, tuple) else (int(k), 0): float(v)
                    for k, v in sorted(self._fixed.items(), key=str)}
        return {(b, k): c for (b, k, m) in sorted(set(self._samples) | set(self._frozen))
                if m == self.mode and (c := self.cost(b, k)) is not None}

    # ---- decisions ---------------------------------------------------------------------------
    def scores(self, rows: Sequence[Hashable]) -> dict[int, float]:
        """Σ_rows E_r[b] / cost(b, bucket) per candidate."""
        costs = self._calibrated(bucket_of(len(rows)))
        return {b: sum(self.expected(r, b) for r in rows) / max(c, 1e-12)
                for b, c in costs.items()}

    def _calibrated(self, bucket: int) -> dict[int, float]:
        """Every candidate's cost at ``bucket``; InvalidInputError while one is not known."""
        out = {}
        for b in self.candidates:
            c = self.cost(b, bucket)
            if c is None:
                raise InvalidInputError(f"no cost for block {b} at bucket {bucket}: "
                                        "calibrate first")
            out[b] = c
        return out

    def finish_scores(self, rows: Sequence[Hashable], remaining: Sequence[int]
                      ) -> dict[int, float]:
        """Per candidate: the batch's remaining tokens over its projected time to finish them
        if every step kept that block (module docstring). A bucket below the live one whose
        cost is not measured yet takes the nearest measured larger bucket's cost."""
        if len(remaining) != len(rows):
            raise InvalidInputError(f"remaining: {len(remaining)} budgets for {len(rows)} rows")
        return finish_rates([self._laws(r) for r in rows], [max(int(n), 1) for n in remaining],
                            self.candidates, self._tail_cost)

    def _laws(self, row: Hashable) -> dict[int, BlockLaw]:
        """``row``'s BlockLaw per candidate, kept until its estimates change (``observe``): a
        run of target-only steps observes nothing, so its choices reuse them."""
        laws = self._law_cache.get(row)
        if laws is None:
            chain = self.alphas(row, max(self.candidates) - 1)
            laws = self._law_cache[row] = BlockLaw.family(chain, self.candidates)
        return laws

    def steps_to_finish(self, row: Hashable, block: int, n: int) -> float:
        """Steps ``row`` needs for its last ``n`` tokens if every step used ``block``
        (``finish_steps`` of the row's α)."""
        return finish_steps(self.alphas(row, block - 1), block, n)

    def _tail_cost(self, block: int, live: int) -> float:
        """cost(block, bucket of ``live`` rows), else that of the nearest larger bucket known."""
        k = bucket_of(live)
        while True:
            c = self.cost(block, k)
            if c is not None:
                return c
            if k > 1 << 20:
                raise InvalidInputError(f"no cost for block {block} at bucket "
                                        f"{bucket_of(live)} or above: calibrate first")
            k *= 2

    def choose(self, rows: Sequence[Hashable], remaining: Sequence[int] | None = None) -> int:
        """The next step's block size: the best score (ties: the smaller block), or a probe of
        the best speculative block after ``probe`` target-only steps in a row. ``remaining``
        (each row's token budget left, host-known): the projected time to finish the batch
        decides (``finish_scores``) instead of the per-step rate (``scores``).
        A run of target-only steps keeps its choice until its probe is due or a row leaves,
        without scoring: target-only steps observe nothing, so the rows' estimates stand still
        (the rate rule's scores exactly; the finish rule's budgets shrink by a token a step),
        and scoring them again would only cost time."""
        key, probes = tuple(rows), "probes" not in self.without
        if self._held == key and (self._only < self._gap or not probes):
            self._only += 1
            return 1
        self._held = None
        if remaining is not None and "finish_rule" not in self.without:
            self._calibrated(bucket_of(len(rows)))     # the live bucket must be calibrated
            scores = self.finish_scores(rows, remaining)
        else:
            scores = self.scores(rows)
        best = max(self.candidates, key=lambda b: (scores[b], -b))
        spec = [b for b in self.candidates if b > 1]
        if best == 1 and spec and probes and self._only >= self._gap:
            self._only, self._gap = 0, min(2 * self._gap, self.max_probe)
            return max(spec, key=lambda b: (scores[b], -b))
        if best == 1:
            self._only += 1
            self._held = key
        else:
            self._only, self._gap = 0, self.probe
        return best

    def project(self, rows: int, remaining: Sequence[int]) -> tuple[int, float, float] | None:
        """A call's first-step projection for ``rows`` fresh requests with these budgets, from
        the pool and table it decides with: (best speculative block, its tokens/s, the
        target-only tokens/s) by ``finish_scores`` (the "finish_rule" ablation: ``scores``);
        None before anything is pooled for the call's (mode, law) or while a candidate is
        untimed at its bucket (the call plan's input, call_plan.py)."""
        k = bucket_of(rows)
        if not self._pool or self._pool[0] is None or self.candidates[-1] < 2 \
                or any(self.cost(b, k) is None for b in self.candidates):
            return None
        fresh = [object() for _ in range(rows)]
        scores = self.scores(fresh) if "finish_rule" in self.without else \
            self.finish_scores(fresh, remaining)
        spec = max((b for b in self.candidates if b > 1), key=lambda b: (scores[b], -b))
        return spec, scores[spec], scores[1]

    def observe(self, rows: Sequence[Hashable], block: int, accepted: Sequence[int],
                seconds: float | None = None) -> None:
        """A finished step's outcome: ``accepted[i]`` drafts of ``rows[i]`` accepted (0 for a
        target-only step, which teaches nothing) and its wall ``seconds`` (capture excluded),
        kept for ``end``: the table this call decides with never follows step timing."""
        if seconds is not None:
            self._steps.setdefault((block, bucket_of(len(rows)), self.mode), []).append(
                float(seconds))
            self._made[0] += sum(accepted) + len(rows)
            self._made[1] += float(seconds)
        if block < 2:
            return
        gamma = max(self.candidates) - 1
        call_acc, call_seen = self._counts
        for r, a in zip(rows, accepted):
            self._law_cache.pop(r, None)
            acc, seen = self._rows.setdefault(r, ([0.0] * gamma, [0.0] * gamma))
            for j in range(min(a + 1, block - 1, gamma)):        # slots 1 .. reached
                acc[j] *= self.decay
                seen[j] = seen[j] * self.decay + 1.0
                if j >= len(call_seen):
                    call_acc.append(0.0)
                    call_seen.append(0.0)
                call_seen[j] += 1.0
                if j < a:
                    acc[j] += 1.0
                    call_acc[j] += 1.0
