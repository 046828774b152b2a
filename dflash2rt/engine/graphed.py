"""Graph-captured decode steps: draft + conv + selector + walk in one graph, verify + accept +
commit in another, per batch-size bucket, over the batch state's static cache storage; and the
target-only step (forward + sample + commit) in one graph, so both modes compare like for like.

Per-request temperatures and greedy flags are static tensors (select, not branch); one graph set
serves greedy-only batches and one serves batches with sampled requests. Padded rows are inert:
greedy, length 0, and they commit nothing (count 0) into their own unused slots.
"""

from __future__ import annotations

from typing import Any

import torch

from ..backend import Backend
from ..graphs.runner import GraphRunner
from ..models.kv_cache import KVCache
from ..models.pair import ModelPair
from ..ops.batch import BlockNoise, SamplingBatch
from ..ops.selector import SelectorOut
from . import steps
from .state import BatchState

BUCKETS = (1, 2, 4, 8, 16, 32)
LEN_STEP = 256      # cache lengths round up to this, so later generate() calls fit the graphs
_PARAMS = {"anchor": (torch.int64, 0), "lens": (torch.int64, 0), "seed": (torch.int64, 0),
           "key": (torch.int64, 0), "temperature": (torch.float32, 0.0),
           "top_k": (torch.int64, 0), "top_p": (torch.float32, 1.0), "greedy": (torch.bool, True)}
_NOISE = ("walk", "accept", "residual", "bonus")
GraphStats = dict[str, dict[int, dict[str, Any]]]     # graph name → bucket → counters


def _name(kind: str, sampled: bool) -> str:
    """A graph's name in stats and fallback messages: "verify greedy", "draft sampled", ..."""
    return f"{kind} {'sampled' if sampled else 'greedy'}"


class _GraphedSteps:
    """What both graphed step kinds share: the static caches they run over (the engine's, kept
    across generate() calls and shared by every mode), per-request parameters as static inputs,
    the bucket's BatchState over the caches, and the runners with their release and capture
    time."""

    def __init__(self, pair: ModelPair, backend: Backend, target: KVCache, draft: KVCache | None,
                 on_fallback) -> None:
        self.pair, self.backend, self.on_fallback = pair, backend, on_fallback
        self.full = (target, draft)
        self.runners: dict[Any, GraphRunner] = {}

    def _bucket_state(self, inp: dict[str, torch.Tensor], sampled: bool) -> BatchState:
        b = inp["anchor"].shape[0]
        sampling = SamplingBatch(inp["temperature"], inp["top_k"], inp["top_p"], inp["greedy"],
                                 any_sampled=sampled)
        return BatchState(self.full[0], self.full[1], inp["lens"], inp["anchor"], inp["seed"],
                          inp["key"], sampling, [0] * b, list(range(b)))

    def _param_inputs(self, size: int) -> dict[str, torch.Tensor]:
        dev = self.full[0].device
        return {n: torch.full((size,), v, dtype=d, device=dev) for n, (d, v) in _PARAMS.items()}

    @staticmethod
    def _param_pads() -> dict[str, Any]:
        return {n: v for n, (_, v) in _PARAMS.items()}

    @staticmethod
    def _live(st: BatchState) -> dict[str, torch.Tensor]:
        """The live rows' static inputs; "live" marks them (padding gets False), for the
        graphs that commit."""
        s = st.sampling
        return {"anchor": st.anchor, "lens": st.lens, "seed": st.seed, "key": st.key,
                "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
                "greedy": s.greedy,
                "live": torch.ones(st.size, dtype=torch.bool, device=st.lens.device)}

    def close(self) -> None:
        """Release the graphs and their static buffers (Engine.close, also before the engine
        grows its caches)."""
        for r in self.runners.values():
            r.close()
        self.runners.clear()

    @property
    def capture_s(self) -> float:
        """Seconds spent warming up and capturing graphs so far (inside decode steps)."""
        return sum(r.capture_s for r in self.runners.values())

    def graph_stats(self) -> GraphStats:
        """Per graph ("draft greedy", "verify sampled", "target-only greedy", ...) and bucket
        since capture: captured, verified, replays, eager runs, refusal (GraphRunner.stats)."""
        return {r.name: r.stats() for r in self.runners.values()}


def graph_delta(before: GraphStats, after: GraphStats) -> GraphStats:
    """One run's part of ``graph_stats()`` (taken before and after it, same runners): the
    buckets the run used, with the run's replays and eager runs and each bucket's state."""
    out: GraphStats = {}
    for name, buckets in after.items():
        for size, s in buckets.items():
            was = before.get(name, {}).get(size, {})
            d = {**s, "replays": s["replays"] - was.get("replays", 0),
                 "eager": s["eager"] - was.get("eager", 0)}
            if d["replays"] or d["eager"]:
                out.setdefault(name, {})[size] = d
    return out


class GraphedSpecSteps(_GraphedSteps):
    """Replays the two step graphs for the live rows of a BatchState."""

    def __init__(self, pair: ModelPair, backend: Backend, target: KVCache, draft: KVCache,
                 block: int, on_fallback) -> None:
        super().__init__(pair, backend, target, draft, on_fallback)
        self.block, self.gamma = block, block - 1

    def _draft_body(self, sampled: bool):
        def body(inp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            st = self._bucket_state(inp, sampled)
            pos = steps.block_positions(st, self.block)
            ctx = st.draft_full.max_len
            h_e = steps.draft_block(self.pair, st, self.backend, pos, ctx)
            noise = (BlockNoise.draw(st.seed, st.key, st.lens, self.gamma) if sampled
                     else BlockNoise.unused(st.size, self.gamma, st.lens.device))
            sel = steps.select_block(self.pair, st, self.backend, h_e, noise)
            return {"draft": sel.draft, "cand": sel.candidates, "q": sel.q,
                    "bad": sel.bad, "bad_lattice": sel.bad_lattice,
                    **{n: getattr(noise, n) for n in _NOISE}}
        return body

    def _verify_body(self, sampled: bool):
        def body(inp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            st = self._bucket_state(inp, sampled)
            pos = steps.block_positions(st, self.block)
            # verify reads draft, candidates and q; the draft graph's flags go to the engine
            sel = SelectorOut(inp["draft"], inp["cand"], inp["q"], inp["bad"], inp["bad"])
            noise = BlockNoise(*(inp[n] for n in _NOISE))
            tgt, ver = steps.verify_block(self.pair, st, self.backend, sel, noise, pos,
                                          st.target_full.max_len)
            acc = ver.accept_len
            count = torch.where(inp["live"], acc + 1, 0)                  # padded rows: inert
            steps.commit_kv(self.pair, st, tgt, pos, count)    # inputs stay unmodified
            return {"acc": acc, "tokens": ver.tokens, "bad": ver.bad, "bad_q": ver.bad_q,
                    "lens": st.lens + count,
                    "anchor": ver.tokens.gather(1, acc.view(-1, 1))[:, 0]}
        return body

    def _runner(self, kind: str, sampled: bool) -> GraphRunner:
        key = (kind, sampled)
        if key not in self.runners:
            self.runners[key] = GraphRunner(
                self.backend.graph_adapter, BUCKETS, self._make_inputs(kind),
                self._draft_body(sampled) if kind == "draft" else self._verify_body(sampled),
                self._pads(kind), self.on_fallback, name=_name(kind, sampled))
        return self.runners[key]

    def _make_inputs(self, kind: str):
        dev, g, k = self.full[0].device, self.gamma, self._top_k()

        def make(size: int) -> dict[str, torch.Tensor]:
            out = self._param_inputs(size)
            if kind == "verify":
                out.update(draft=torch.zeros(size, g, dtype=torch.int64, device=dev),
                           cand=torch.zeros(size, g, k, dtype=torch.int64, device=dev),
                           q=torch.zeros(size, g, k, device=dev),
                           bad=torch.zeros(size, dtype=torch.bool, device=dev),
                           live=torch.zeros(size, dtype=torch.bool, device=dev),
                           bonus=torch.full((size,), 0.5, device=dev),
                           **{n: torch.full((size, g), 0.5, device=dev) for n in _NOISE[:3]})
            return out
        return make

    def _pads(self, kind: str) -> dict[str, Any]:
        pads = self._param_pads()
        if kind == "verify":
            pads.update(draft=0, cand=0, q=0.0, bad=False, live=False,
                        **{n: 0.5 for n in _NOISE})
        return pads

    def _top_k(self) -> int:
        return steps.selector_params(self.pair).top_k

    def step(self, st: BatchState) -> dict[str, torch.Tensor]:
        """Draft graph then verify graph for the live rows; updates st.lens / st.anchor."""
        sampled = st.sampling.any_sampled
        live = self._live(st)
        d = self._runner("draft", sampled).run(live)
        v = self._runner("verify", sampled).run({**live, **d})
        st.lens.copy_(v["lens"])
        st.anchor.copy_(v["anchor"])
        return {**v, "draft_bad": d["bad"], "lattice_bad": d["bad_lattice"]}


class GraphedTargetSteps(_GraphedSteps):
    """Replays the target-only step graph (one token per request) for the live rows."""

    def _body(self, sampled: bool):
        def body(inp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            st = self._bucket_state(inp, sampled)
            token, bad, out, pos = steps.target_only_forward(self.pair, st,
                                                             st.target_full.max_len)
            count = torch.where(inp["live"], 1, 0)                      # padded rows: inert
            steps.commit_kv(self.pair, st, out, pos, count)             # inputs stay unmodified
            return {"token": token, "bad": bad, "lens": st.lens + count}
        return body

    def _runner(self, sampled: bool) -> GraphRunner:
        if sampled not in self.runners:
            def make(size: int) -> dict[str, torch.Tensor]:
                return {**self._param_inputs(size),
                        "live": torch.zeros(size, dtype=torch.bool, device=self.full[0].device)}
            self.runners[sampled] = GraphRunner(self.backend.graph_adapter, BUCKETS, make,
                                                self._body(sampled),
                                                {**self._param_pads(), "live": False},
                                                self.on_fallback,
                                                name=_name("target-only", sampled))
        return self.runners[sampled]

    def step(self, st: BatchState) -> dict[str, torch.Tensor]:
        """One token per live row; updates st.lens / st.anchor."""
        v = self._runner(st.sampling.any_sampled).run(self._live(st))
        st.lens.copy_(v["lens"])
        st.anchor.copy_(v["token"])
        return v
