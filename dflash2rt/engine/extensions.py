"""Row extensions: the optional features of a batch (logit processors, constraints, the
watermark) as one interface a decode step loops over. A batch holds the list of its active
extensions (``BatchState.extensions``: an empty list is plain decoding, and costs nothing), in
the order their hooks run: ``Procs`` (logit bias and penalties, ``ops.procs``), ``Watermark``
(``watermark.generate``), ``Constraint`` (``constraints.device``), ``Candidates`` (requests'
own candidate counts, ``candidates.py``, which the selector stage applies last). Each hook
defaults to leaving the step as it is; an implementation wraps its feature's device state and
says, per hook, what the feature does there: shape the draft logits, mask the selector's walk,
give the block's draws (a draw source, ``ops.draws``), process verify row j with the state
after d_1..d_j, advance its state by the committed tokens, and, for a feature whose state
graphs take as static inputs, what a capture needs. The stages (``stages.py``) call the hooks
in list order; the device work is the features' own ops, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from ..backend import TORCH_OPS
from ..constraints.device import ConstraintBatch
from ..ops.batch import BlockNoise
from ..ops.draws import DrawSource, EmitDraw
from ..ops.procs import ProcBatch
from ..ops.selector import WalkMask
from ..watermark import generate as wm_generate
from ..watermark.generate import KeyedDraws, WatermarkBatch
from . import candidates

EAGER_PROCS = ("steps of batches with logit processors, min-p, logprobs, constraints, a "
               "candidate count of their own or block verification run "
               "eagerly (graphs do not take their state as inputs)")
CONSTRAINT_WALK_OPS = ("constrained steps walk the selector with torch ops (the walk's "
                       "constraint mask has no kernel)")
WATERMARK_OPS = ("watermarked steps select and verify with torch ops (this backend's kernels do "
                 "not run the keyed draws)")
BLOCK_VERIFY_OPS = ("block-verified steps verify with torch ops (this backend's verify kernel "
                    "decides token by token)")


class RowExtension:
    """One optional feature's per-row device state and its hooks into a decode step (module
    docstring). ``graphed``: its state is a graph input (``graph_inputs``, ``of_inputs``);
    otherwise a batch that has it runs its steps eagerly, reported (``EAGER_PROCS``)."""

    graphed: bool = False
    graph_label: str = ""            # added to the names of its graphs ("draft sampled ...")

    def take(self, idx: Sequence[int]) -> "RowExtension":
        """The extension of rows ``idx`` (host-known; the batch keeps them, compacted)."""
        raise NotImplementedError

    def draft_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [R, γ, V] → the logits the selector takes its candidates from (proposals
        only: the walk's q is the law it draws from, so any shaping stays lossless)."""
        return logits

    def walk_mask(self) -> WalkMask | None:
        """A mask on the selector walk's path (``ops.selector.WalkMask``), or None."""
        return None

    def draws(self, noise: BlockNoise) -> DrawSource | None:
        """The block's draw source for select / verify in place of ``noise``, or None."""
        return None

    def verify_rows(self) -> torch.Tensor | bool | None:
        """[R] bool: the rows verified as a block (``ops.block_verify``); True: every row;
        None: none."""
        return None

    def next_draw(self, lens: torch.Tensor) -> EmitDraw | None:
        """The draw of each row's next token (first token, target-only steps), or None."""
        return None

    def process(self, logits: torch.Tensor, draft: torch.Tensor | None = None) -> torch.Tensor:
        """Target logits [R, T, V] → processed: row j with the state after d_1..d_j of draft
        [R, γ] (T = γ+1), or with the committed state (draft None, T = 1)."""
        return logits

    def commit_(self, tokens: torch.Tensor, count: torch.Tensor) -> None:
        """Advance the state by the first ``count`` [R] of tokens [R, T] (in place, device)."""

    def reports(self, kind: str, implementation: Mapping[str, str]) -> list[str]:
        """What a body of ``kind`` ("draft", "verify", "target-only") runs outside the backend's
        own ops for this feature, given ``Backend.implementation`` (reported as fallbacks)."""
        return []

    # ---- graph capture (``graphed`` extensions) ---------------------------------------------
    def graph_key(self) -> Any:
        """What sizes the static inputs (a captured graph serves batches with the same key)."""
        return None

    def graph_inputs(self) -> dict[str, torch.Tensor]:
        """The state as step-body inputs, per row."""
        return {}

    @classmethod
    def static_inputs(cls, key: Any, size: int, device: torch.device) -> dict[str, torch.Tensor]:
        """A bucket's static inputs for ``size`` rows, holding the padded rows' values."""
        return {}

    @classmethod
    def pads(cls) -> dict[str, Any]:
        """Each static input's inert value for padded rows."""
        return {}

    @classmethod
    def of_inputs(cls, inp: Mapping[str, torch.Tensor]) -> "RowExtension":
        """The extension a captured body reads from its inputs (nothing from the host)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Procs(RowExtension):
    """Logit bias and penalties (``ops.procs.ProcBatch``, which also carries the batch's
    logprobs requests): the draft logits with the committed counts where some row has a bias or
    a penalty, verify row j with the committed counts plus d_1..d_j."""

    batch: ProcBatch

    def take(self, idx):
        return Procs(self.batch.take(idx))

    def draft_logits(self, logits):
        b = self.batch
        return b.process(logits) if b.bias is not None or b.penalized else logits

    def process(self, logits, draft=None):
        return self.batch.process(logits, draft)

    def commit_(self, tokens, count):
        self.batch.commit_(tokens, count)


@dataclass(frozen=True)
class Watermark(RowExtension):
    """The watermark (``watermark.generate``): the block's draws are its keyed draw source
    (``KeyedDraws``), the next token's its keyed emit; the record of used contexts and the
    window advance on commit. Its state and key words are graph inputs."""

    batch: WatermarkBatch
    graphed = True
    graph_label = "watermarked"

    def take(self, idx):
        return Watermark(self.batch.take(idx))

    def draws(self, noise):
        return KeyedDraws(self.batch, noise)

    def next_draw(self, lens):
        return self.batch.marks(lens.new_zeros(lens.shape[0], 0))

    def commit_(self, tokens, count):
        self.batch.commit_(tokens, count)

    def reports(self, kind, implementation):
        impl = implementation
        if kind != "target-only" and impl.get("watermark", TORCH_OPS) == TORCH_OPS \
                and any(impl.get(op) != TORCH_OPS for op in ("select", "verify")):
            return [WATERMARK_OPS]
        return []

    def graph_key(self):
        return self.batch.shape

    def graph_inputs(self):
        return self.batch.inputs()

    @classmethod
    def static_inputs(cls, key, size, device):
        width, capacity = key
        return {n: torch.full(shape, wm_generate.PADS[n], dtype=torch.int64, device=device)
                for n, shape in zip(wm_generate.INPUTS, ((size, 9), (size, width),
                                                         (size, capacity), (size,)))}

    @classmethod
    def pads(cls):
        return dict(wm_generate.PADS)

    @classmethod
    def of_inputs(cls, inp):
        return Watermark(WatermarkBatch.of_inputs(dict(inp)))


@dataclass(frozen=True)
class Constraint(RowExtension):
    """Constraints (``constraints.device.ConstraintBatch``): the candidate sets' masks on the
    draft logits, the walk masked along its path (torch ops), verify row j masked with the
    state after d_1..d_j; the automaton states advance on commit."""

    batch: ConstraintBatch

    def take(self, idx):
        return Constraint(self.batch.take(idx))

    def draft_logits(self, logits):
        return self.batch.draft_logits(logits)

    def walk_mask(self):
        return self.batch.walk()

    def process(self, logits, draft=None):
        return self.batch.mask(logits, draft)

    def commit_(self, tokens, count):
        self.batch.commit_(tokens, count)

    def reports(self, kind, implementation):
        return [CONSTRAINT_WALK_OPS] if kind == "draft" \
            and implementation.get("select") != TORCH_OPS else []


@dataclass(frozen=True)
class Candidates(RowExtension):
    """Requests' own candidate counts (``candidates.py``): ``requested`` per row on the host
    (None: the draft's trained count), ``per_row`` the same on the device (0 for None). The
    selector stage asks it for the batch's width and each row's logits limited to its count
    (``limit``), after every other extension has shaped them."""

    requested: tuple[int | None, ...]
    per_row: torch.Tensor

    @classmethod
    def build(cls, requested: Sequence[int | None], device: torch.device
              ) -> "Candidates | None":
        """None when no row asks for a count of its own."""
        if all(k is None for k in requested):
            return None
        return cls(tuple(requested), torch.tensor([k or 0 for k in requested],
                                                   dtype=torch.int64, device=device))

    def take(self, idx):
        t = torch.tensor(list(idx), dtype=torch.int64, device=self.per_row.device)
        return Candidates(tuple(self.requested[i] for i in idx), self.per_row[t])

    def limit(self, logits: torch.Tensor, trained: int) -> tuple[int, torch.Tensor]:
        return candidates.limit(logits, self.requested, self.per_row, trained)


@dataclass(frozen=True)
class BlockVerify(RowExtension):
    """Block verification (``SamplingParams.verification``): ``asked`` per row on the host,
    ``rows`` the same on the device. Verify takes the torch ops (``ops.verify`` with
    ``block``: True where every row asked, so the token rule is not computed)."""

    asked: tuple[bool, ...]
    rows: torch.Tensor

    @classmethod
    def build(cls, rules: Sequence[str], device: torch.device) -> "BlockVerify | None":
        """None when no row asks for it."""
        asked = tuple(a == "block" for a in rules)
        if not any(asked):
            return None
        return cls(asked, torch.tensor(asked, dtype=torch.bool, device=device))

    def take(self, idx):
        asked = tuple(self.asked[i] for i in idx)
        return BlockVerify(asked, torch.tensor(asked, dtype=torch.bool, device=self.rows.device))

    def verify_rows(self):
        if not any(self.asked):                          # the rows that asked have left
            return None
        return True if all(self.asked) else self.rows

    def reports(self, kind, implementation):
        return [BLOCK_VERIFY_OPS] if kind == "verify" \
            and implementation.get("verify") != TORCH_OPS else []


def build(requests: Sequence, vocab: int | None, device: torch.device,
          watermark: WatermarkBatch | None = None) -> tuple[RowExtension, ...]:
    """The active extensions of a batch of engine Requests, in hook order: those its requests
    use (``vocab``: the target's vocabulary size, None refuses requests that need one) and the
    run's watermark state, if any."""
    procs = constraint = None
    if vocab is None:
        if any(q.params.processed for q in requests):
            raise ValueError("new_state needs the vocabulary size for logit processors")
    else:
        procs = ProcBatch.build([q.params for q in requests], [q.prompt_ids for q in requests],
                                vocab, device)
        constraint = ConstraintBatch.build([q.params.constraint for q in requests], vocab,
                                           device)
    own = Candidates.build([q.params.num_candidates for q in requests], device)
    block = BlockVerify.build([q.params.verification for q in requests], device)
    return tuple(e for e in (None if procs is None else Procs(procs),
                             None if watermark is None else Watermark(watermark),
                             None if constraint is None else Constraint(constraint), own, block)
                 if e is not None)
