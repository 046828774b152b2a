"""Instance sizes of the law levels L2–L4: ``FULL`` for every backend by default, ``SMALL`` with
``--dflash2rt-small`` for lanes that pay per kernel program (the Triton interpreter runs one
program per lattice row, in Python: docs/benchmarks/conformance-lanes.md). SMALL keeps every
lattice check exact (quarter tables on the 4-point lattice, TV ≤ 1e-12) on smaller instances:
fewer draft slots and rounds, a coarser lattice for the float tables (compared with the
reference on the same lattice), fewer greedy tokens and a χ² sample whose detectable TV is
printed. The run's header and reports name the sizes used."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sizes:
    name: str
    l2_quarter_gamma: int = 3       # draft slots of the L2 quarter-table block
    l2_float_points: int = 8        # lattice points per coin on the L2 float tables
    l3_gamma: int = 3               # draft slots per L3 round
    l3_length: int = 4              # L3: the joint law of the first L tokens
    l3_dedup: bool = False          # L3: verify once per distinct draft (lattice.round_law_backend)
    l3_adaptive_bmax: int = 4       # L3 adaptive: block sizes 1..bmax (1 = target-only step)
    l3_adaptive_length: int = 4     # L3 adaptive: the joint law of the first L tokens
    l4_greedy_tokens: int | None = None   # L4 greedy: None = 12 (quick) / 32
    l4_samples: int | None = None         # L4 χ²: None = sized for TV 0.03 (quick) / 0.01

    def describe(self) -> str:
        if self == FULL:
            return "full"
        return (f"{self.name} (L2 quarter γ={self.l2_quarter_gamma}, float lattice "
                f"{self.l2_float_points}-point; L3 γ={self.l3_gamma}, L={self.l3_length}, "
                f"{'deduplicated verify rows' if self.l3_dedup else 'all rows'}, adaptive blocks "
                f"1..{self.l3_adaptive_bmax}, L={self.l3_adaptive_length}; L4 "
                f"{self.l4_greedy_tokens} greedy tokens, χ² n={self.l4_samples})")


FULL = Sizes("full")
SMALL = Sizes("small", l2_quarter_gamma=2, l2_float_points=4, l3_gamma=2, l3_length=2,
              l3_dedup=True, l3_adaptive_bmax=2, l3_adaptive_length=3, l4_greedy_tokens=6,
              l4_samples=200)
