"""τ, top-K mass and the selector / verify cost as the selector's candidate count K grows.

The draft's ``dflash_config.selector_top_k`` (K) sets how many candidates per draft slot the
selector's lattice holds (``ops.selector``). :func:`k_curve` decodes a pair's held-out prompts
with the engine at a fixed block (the draft's, not adaptive), once per K and per temperature,
with K overridden by :func:`with_top_k`: a draft model built from the same config with only
``selector_top_k`` replaced, sharing the loaded draft's tensors (nothing on disk or in the
loaded pair changes). Per K and temperature it reports:

- τ: mean accepted drafts + 1 per speculative step (the engine's accept histogram, before
  length truncation), beside the engine's committed tokens per step (``tau_engine``, which the
  last step's truncation to ``max_new_tokens`` lowers a little) and the per-slot acceptance
  (``train.heldout.per_slot``);
- the target's probability mass on the K candidates per slot (``train.evaluate.topk_mass``),
  teacher-forced on the target-only continuation of each prompt at that temperature, the same
  text for every K;
- the select and verify ops' seconds per step (batch 1) on inputs recorded from the first
  prompt's engine run at that K, timed in interleaved rounds (every K once per round, the order
  rotated; each call's fastest of a few repeats) and given as the fastest round, with its
  ratio to the first K's (:func:`time_ops`), since a shared CPU drifts and is preempted;
- at T = 0, how many prompts' speculative tokens equal target-only greedy decoding.

The engine runs go prompt by prompt (target-only and every K on prompt i before prompt
i + 1); a ``RunCache`` keeps them, so that a run cut short resumes. Tokens/s are not reported:
on a shared machine they measure the other load more than K.

K may be the whole vocabulary (``"full"``): the torch ops accept any 1 <= K <= V
(``ops.selector.check_select_args``; verify takes any K). It costs more per step than the
others: the selector's walk scores and draws only the lattice rows it reads
(``ops.selector.ROW_WALK_MIN_K``), but over all V candidates. So it may decode only the first ``full_vocab_prompts`` prompts; every row then also gives
``tau_subset``, its τ on those prompts, for a paired comparison.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..backend import Backend
from ..engine.engine import Engine
from ..models.draft import DraftModel
from ..models.pair import ModelPair, load_pair
from ..bench.measure import SEED, TEMPERATURES, Temperature, resolve_backend, seeded_requests
from .evaluate import topk_mass
from .heldout import per_slot
from .op_timing import recording_ops, rotated, time_ops

DEFAULT_KS: tuple[int | str, ...] = (16, 32, 64, 128, "full")
TARGET_ONLY = "target_only"


def with_top_k(pair: ModelPair, k: int) -> ModelPair:
    """The pair with its draft's ``selector_top_k`` set to ``k``: a new draft module of the
    replaced config holding the loaded draft's own tensors (assigned, not copied); the target,
    the tokenizer and ``pair`` itself are unchanged."""
    src = pair.draft
    if src is None or src.cfg.variant != "dflash2":
        raise ValueError("K is the candidate count of a DFlash2 draft's selector; this pair has "
                         + ("no draft" if src is None else f"a {src.cfg.variant} draft"))
    cfg = dataclasses.replace(src.cfg, selector_top_k=int(k))
    with torch.device("meta"):
        draft = DraftModel(cfg)
    draft.load_state_dict(src.state_dict(), strict=True, assign=True)
    draft.requires_grad_(False)
    if hasattr(src, "source_dir"):
        draft.source_dir = src.source_dir
    return ModelPair(pair.target, draft.eval(), pair.tokenizer, pair.name)


def resolve_ks(ks: Sequence[int | str], vocab: int) -> list[int]:
    """K values ("full" or "all": the vocabulary), in the order given, duplicates dropped."""
    out: list[int] = []
    for k in ks:
        v = vocab if str(k).strip().lower() in ("full", "all", "v", "vocab") else int(k)
        if not 1 <= v <= vocab:
            raise ValueError(f"K={v} must be in [1, vocab={vocab}]")
        if v not in out:
            out.append(v)
    return out


def load_heldout(model: str | Path = "stdlib-code", n_prompts: int | None = None
                 ) -> tuple[ModelPair, list[list[int]], Path]:
    """A bundled name or a directory with target/, draft/ and heldout_prompts.json → (pair, the
    first ``n_prompts`` held-out prompts' ids (None: all), the directory); as ``dflash2rt bench
    heldout`` loads them."""
    from ..bundled import heldout_ids, model_dir

    root = model_dir(model)
    pair = load_pair(root / "target", root / "draft")
    ids = heldout_ids(root)
    return pair, ids[:n_prompts] if n_prompts is not None else ids, root


def _tau(hist: Sequence[int]) -> float:
    """Mean accepted drafts + 1 per step of an accept histogram."""
    steps = sum(hist)
    return 1.0 + sum(a * c for a, c in enumerate(hist)) / steps if steps else 0.0


def _add(hist: list[int], more: Sequence[int]) -> None:
    for a, c in enumerate(more):
        hist += [0] * (a + 1 - len(hist))
        hist[a] += c


class RunCache:
    """Each engine run's result (tokens, accept histogram) under a key naming everything it
    depends on, kept in a JSON file when ``path`` is given, written after every run: a
    :func:`k_curve` cut short (a time limit on a busy machine) resumes where it stopped when
    run again with the same file."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = None if path is None else Path(path)
        self.runs: dict[str, dict[str, Any]] = {}
        if self.path is not None and self.path.is_file():
            self.runs = json.loads(self.path.read_text(encoding="utf-8"))

    @staticmethod
    def key(*parts: Any) -> str:
        return json.dumps(parts)

    def get(self, key: str) -> dict[str, Any] | None:
        return self.runs.get(key)

    def put(self, key: str, value: dict[str, Any]) -> None:
        self.runs[key] = value
        if self.path is not None:
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps(self.runs), encoding="utf-8")
            os.replace(tmp, self.path)


@dataclasses.dataclass
class _Setup:
    """What every temperature's rows share."""

    pair: ModelPair
    pairs: dict[int, ModelPair]
    engines: dict[Any, Engine]
    runs: dict[Any, int]          # contender → prompts it decodes (the first N)
    backend: Backend
    prompts: list[list[int]]
    max_new: int
    block: int
    rounds: int
    steps: int
    seed: int
    cache: RunCache
    say: Callable[[str], None]
    captured: dict[int, dict[str, list]] = dataclasses.field(default_factory=dict)


def k_curve(pair: ModelPair, prompts: Sequence[Sequence[int]],
            ks: Sequence[int | str] = DEFAULT_KS,
            temperatures: Sequence[Temperature] = TEMPERATURES, max_new_tokens: int = 64,
            backend: Backend | str = "cpu", block_size: int | None = None,
            timing_rounds: int = 5, timing_steps: int = 3, seed: int = SEED,
            full_vocab_prompts: int | None = None, cache: RunCache | None = None,
            log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The K curve of ``pair`` on ``prompts`` (token ids; module docstring): one row per
    temperature x K in ``rows``, with the run's counts beside them. Every prompt is decoded
    alone (batch 1), with seed ``seed + i`` for prompt i, exactly ``max_new_tokens`` new
    tokens (EOS ignored); ``block_size`` None: the draft's. ``full_vocab_prompts``: the
    full-vocabulary K decodes only the first that many prompts (None: all). ``cache``: the
    engine runs already made (``RunCache``). ``timing_rounds`` 0 skips the op timing."""
    start = time.perf_counter()
    be = resolve_backend(backend)
    vocab = pair.draft.cfg.arch.vocab_size
    kvals = resolve_ks(ks, vocab)
    prompts = [list(p) for p in prompts]
    n_full = len(prompts) if full_vocab_prompts is None else \
        max(1, min(full_vocab_prompts, len(prompts)))
    pairs = {k: with_top_k(pair, k) for k in kvals}
    engines: dict[Any, Engine] = {TARGET_ONLY: Engine(pair, be)}
    engines.update({k: Engine(pairs[k], be) for k in kvals})
    setup = _Setup(pair, pairs, engines,
                   {TARGET_ONLY: len(prompts),
                    **{k: n_full if k == vocab else len(prompts) for k in kvals}},
                   be, prompts, max_new_tokens, block_size or pair.draft.cfg.block_size,
                   timing_rounds, timing_steps, seed, cache or RunCache(),
                   log or (lambda _msg: None))
    rows: list[dict[str, Any]] = []
    try:
        for t in temperatures:
            rows += _temperature_rows(setup, t)
    finally:
        for eng in engines.values():
            eng.close()
    subset = min(setup.runs.values())
    for r in rows:
        if subset == len(prompts):
            del r["tau_subset"]
    _tau_vs_greedy(rows)
    return {"model": pair.name, "backend": be.name, "torch_threads": torch.get_num_threads(),
            "prompts": len(prompts), "prompt_tokens_mean": statistics.mean(map(len, prompts)),
            "subset_prompts": subset, "max_new_tokens": max_new_tokens,
            "block_size": setup.block, "vocab": vocab, "ks": kvals,
            "timing_rounds": timing_rounds, "timing_steps": timing_steps, "seed": seed,
            "rows": rows, "seconds": time.perf_counter() - start}


def _tau_vs_greedy(rows: list[dict[str, Any]]) -> None:
    """Each row's τ over its K's τ at T = 0 (None without a T = 0 row of that K)."""
    greedy = {r["k"]: r["tau"] for r in rows if r["temperature"] == 0}
    for r in rows:
        r["tau_vs_greedy"] = r["tau"] / greedy[r["k"]] if greedy.get(r["k"]) else None


SAME = ("model", "prompts", "subset_prompts", "max_new_tokens", "block_size", "vocab", "ks",
        "seed")


def merge(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Results of :func:`k_curve` runs of the same setting (``SAME``) at other temperatures
    (one run per temperature keeps each run short on a busy machine) → one result: their rows
    in run order, T = 0 first, ``seconds`` summed (each run's in ``run_seconds``). The op
    timing's ratios are each run's own (every run interleaves its K values)."""
    if not results:
        raise ValueError("nothing to merge")
    first = results[0]
    for res in results[1:]:
        diff = [key for key in SAME if res.get(key) != first.get(key)]
        if diff:
            raise ValueError(f"the runs differ in {', '.join(diff)}")
    rows = [dict(r) for res in results for r in res["rows"]]
    rows.sort(key=lambda r: r["temperature"] != 0)                  # stable: T = 0 first
    _tau_vs_greedy(rows)
    return {**first, "rows": rows, "seconds": sum(r["seconds"] for r in results),
            "run_seconds": [r["seconds"] for r in results],
            "torch_threads": sorted({r["torch_threads"] for r in results})[-1]}


def _run(s: _Setup, t: Temperature, name: Any, i: int, req, record: bool
         ) -> dict[str, Any]:
    """One engine run of prompt i by contender ``name`` (cached), its select / verify calls
    recorded for the op timing with ``record`` (then run even when cached)."""
    key = RunCache.key(s.pair.name, t.temperature, t.top_p, name, s.max_new, s.block,
                       s.seed + i, hashlib.sha1(repr(s.prompts[i]).encode()).hexdigest())
    got = s.cache.get(key)
    if got is not None and not record:
        return got
    spec = name != TARGET_ONLY
    rec = recording_ops(s.backend, s.captured[name], s.steps) if record else \
        contextlib.nullcontext()
    with rec:
        outs, st = s.engines[name].generate([req], spec=spec, block_size=s.block if spec
                                            else None)
    got = {"outputs": list(outs[0].token_ids), "hist": list(st.accept_hist),
           "committed": st.committed, "request_steps": st.request_steps}
    s.cache.put(key, got)
    return got


def _temperature_rows(s: _Setup, t: Temperature) -> list[dict[str, Any]]:
    """The rows of one temperature: the engine runs (interleaved per prompt; each contender
    decodes its first ``s.runs[name]`` prompts), the op timing on the calls recorded from the
    first prompt's runs, the top-K mass per K on the target-only continuations of every
    prompt."""
    t0 = time.perf_counter()
    names: list[Any] = [TARGET_ONLY, *s.pairs]
    reqs = seeded_requests(s.prompts, s.max_new, t, s.seed)
    s.captured = {k: {"select": [], "verify": []} for k in s.pairs}
    done: dict[Any, list[dict[str, Any]]] = {n: [] for n in names}
    for i, req in enumerate(reqs):
        for name in rotated([n for n in names if i < s.runs[n]], i):
            record = bool(s.rounds) and i == 0 and name != TARGET_ONLY
            done[name].append(_run(s, t, name, i, req, record))
        s.say(f"{t.label}: prompt {i + 1} / {len(reqs)} done ({time.perf_counter() - t0:.0f} s)")
    timing = time_ops(s.backend, s.captured, s.rounds) if s.rounds else {}
    ref = [d["outputs"] for d in done[TARGET_ONLY]]
    subset = min(s.runs.values())
    rows = []
    for k, kpair in s.pairs.items():
        runs = done[k]
        hist: list[int] = []
        for d in runs:
            _add(hist, d["hist"])
        sub: list[int] = []
        for d in runs[:subset]:
            _add(sub, d["hist"])
        mass = topk_mass(kpair, s.prompts, ref, t.temperature, t.top_p)
        slots = per_slot(hist, s.block)
        outputs = [d["outputs"] for d in runs]
        row = {"temperature": t.temperature, "top_p": t.top_p, "label": t.label, "k": k,
               "prompts": len(runs), "tau": _tau(hist), "tau_subset": _tau(sub),
               "tau_engine": sum(d["committed"] for d in runs)
               / max(sum(d["request_steps"] for d in runs), 1),
               "steps": sum(hist), "accept_hist": hist,
               "per_slot_acceptance": slots, "acceptance": statistics.mean(slots),
               "topk_mass": mass["topk_mass"], "topk_mass_per_slot": mass["topk_mass_per_slot"],
               "greedy_equal": (sum(o == r for o, r in zip(outputs, ref))
                                if t.temperature == 0 else None),
               "outputs": outputs if t.temperature == 0 else None,
               **timing.get(k, {})}
        rows.append(row)
        s.say(f"{t.label} K={k}: tau {row['tau']:.3f} on {len(runs)} prompts (engine "
              f"{row['tau_engine']:.3f}; first {subset}: {row['tau_subset']:.3f}), accept/slot "
              f"{row['acceptance']:.3f}, top-K mass {row['topk_mass']:.3f}"
              + (f", select {row['select_ms']:.2f} ms, verify {row['verify_ms']:.2f} ms"
                 if k in timing else "")
              + (f", greedy == target-only {row['greedy_equal']}/{len(runs)}"
                 if t.temperature == 0 else ""))
    if t.temperature == 0:
        rows[0]["target_only_outputs"] = ref
    s.say(f"{t.label}: {time.perf_counter() - t0:.1f} s")
    return rows


def markdown_table(result: dict[str, Any]) -> str:
    """The rows of :func:`k_curve` as a markdown table (the select / verify ratios: of the
    fastest rounds, to the first K at the same temperature; tokens/s stay in the JSON: on a
    shared machine they measure the other load more than K)."""
    first, vocab, n = result["ks"][0], result["vocab"], result["prompts"]
    sub = result["subset_prompts"] if result["subset_prompts"] < n else None
    lines = ["| T | K | prompts | τ | " + (f"τ, first {sub} prompts | " if sub else "")
             + "τ / τ(T=0) | accept / slot | top-K mass | "
             f"select ms (× K={first}) | verify ms (× K={first}) | greedy = target-only |",
             "|---" * (11 if sub else 10) + "|"]
    for r in result["rows"]:
        k = f"{r['k']} (all)" if r["k"] == vocab else str(r["k"])
        ratio = "" if r.get("tau_vs_greedy") is None else f"{r['tau_vs_greedy']:.2f}"
        ref = next((x for x in result["rows"] if x["temperature"] == r["temperature"]
                    and x["top_p"] == r["top_p"] and x["k"] == first), None)
        sel, ver = (f"{r[f'{op}_ms']:.2f} (×{r[f'{op}_ms'] / ref[f'{op}_ms']:.2f})"
                    if ref and f"{op}_ms" in r and f"{op}_ms" in ref else ""
                    for op in ("select", "verify"))
        eq = "" if r["greedy_equal"] is None else f"{r['greedy_equal']} / {r['prompts']}"
        lines.append(f"| {r['label'].removeprefix('T=')} | {k} | {r['prompts']} | "
                     f"{r['tau']:.2f} | " + (f"{r['tau_subset']:.2f} | " if sub else "")
                     + f"{ratio} | {r['acceptance']:.3f} | {r['topk_mass']:.3f} | {sel} | "
                     f"{ver} | {eq} |")
    return "\n".join(lines)
