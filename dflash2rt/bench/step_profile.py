"""``dflash2rt bench step-profile``: where a graphed decode step's time goes on a GPU backend:
the per-step split (draft, verify, host) of the greedy and the sampled speculative step at the
draft's block size, and their ratio (:func:`~dflash2rt.bench.profile.profile_steps`: every
graph replay between two device syncs), each captured graph's replay time alone, the whole step
as the engine runs it (host work and the one sync included), the top kernels of each graph's
body run eagerly under torch.profiler, the model's GEMM shapes alone (CUDA), and the kernels a
step and a prefill launch (``bench.launches``, counted on the CPU)."""

from __future__ import annotations

from typing import Any

import torch

from ..backend import Backend
from ..engine.engine import Engine
from ..engine.request import Request, SamplingParams
from ..models.pair import ModelPair
from .launches import count_launches, launches_text
from .measure import TEMPERATURES, mean_ms, seeded_requests
from .profile import profile_steps

PROMPT = "def parse(self, text):\n"


def _top_kernels(fn, n: int = 12) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_type.name == "CUDA" or
            getattr(e, "self_device_time_total", 0) > 0]
    rows.sort(key=lambda e: -getattr(e, "self_device_time_total", 0))
    return [{"kernel": e.key[:90], "calls": e.count,
             "us": getattr(e, "self_device_time_total", 0)} for e in rows[:n]]


def _graphed_ms(fn, sync, calls: int = 50) -> float:
    fn()
    sync()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return mean_ms(graph.replay, sync, 10) / calls


def _gemms(pair, device, sync) -> list[dict]:
    """GPU time (a graph of 50 calls, so no launch overhead) of x [M, hidden] @ W^T for the
    model's MLP and LM-head widths: M = 1 (a target-only step), block (a verify / draft block),
    8 blocks; fp32, fp32 with TF32, bf16 (cuBLAS's choice)."""
    cfg = pair.target.cfg
    block = pair.draft.cfg.block_size if pair.draft is not None else 8
    rows = []
    for n in (cfg.intermediate_size, cfg.vocab_size):
        for m in (1, block + 1, 8 * (block + 1)):
            for name, dtype, tf32 in (("fp32", torch.float32, False),
                                      ("tf32", torch.float32, True),
                                      ("bf16", torch.bfloat16, False)):
                x = torch.randn(m, cfg.hidden_size, device=device, dtype=dtype)
                w = torch.randn(n, cfg.hidden_size, device=device, dtype=dtype)
                old = torch.backends.cuda.matmul.allow_tf32
                torch.backends.cuda.matmul.allow_tf32 = tf32
                forms = {"": lambda: torch.nn.functional.linear(x, w)}
                if name == "fp32":      # the same product in other shapes cuBLAS may serve faster
                    forms.update({" W@xT": lambda: w @ x.t(),
                                  " row-batched": lambda: torch.matmul(x[:, None, :], w.t())})
                try:
                    for form, fn in forms.items():
                        rows.append({"m": m, "n": n, "k": cfg.hidden_size, "dtype": name + form,
                                     "us": 1e3 * _graphed_ms(fn, sync)})
                finally:
                    torch.backends.cuda.matmul.allow_tf32 = old
    return rows


def step_profile(pair: ModelPair, backend: Backend) -> dict[str, Any]:
    """The profile of one decode step of ``pair`` on ``backend`` (module docstring), as JSON.
    ``backend`` must capture graphs (``backend.graph_adapter``): ValueError otherwise."""
    if backend.graph_adapter is None:
        raise ValueError(f"backend {backend.name!r} captures no graphs: nothing to profile")
    sync = torch.cuda.synchronize if backend.device.type == "cuda" else (lambda: None)
    ids = tuple(pair.tokenizer.encode(PROMPT))
    res: dict[str, Any] = {"backend": backend.name,
                           "launches": count_launches(pair, backend)}   # counted on the CPU
    block = pair.draft.cfg.block_size
    with torch.inference_mode(), Engine(pair, backend) as engine:
        # the synced split, greedy vs sampled, at the draft's block size (graphs captured by the
        # first, untimed call of each)
        split = {}
        for t in TEMPERATURES:
            for spec in (True, False):
                reqs = [seeded_requests([ids], 96, t)]
                b = block if spec else None
                profile_steps(engine, reqs, spec, b)                   # capture, untimed
                p = profile_steps(engine, reqs, spec, b)
                split[f"{t.label} {'spec' if spec else 'target-only'}"] = {
                    k: (1e3 * v if k in ("draft", "verify", "host", "step") else v)
                    for k, v in p.items()}
        res["synced_split_ms"] = split
        greedy = split[f"{TEMPERATURES[0].label} spec"]["step"]
        res["sampled_over_greedy"] = {t.label: split[f"{t.label} spec"]["step"] / greedy
                                      for t in TEMPERATURES[1:]}
        for spec in (True, False):
            mode = "spec" if spec else "target-only"
            reqs = lambda: [Request(ids, SamplingParams(max_new_tokens=96,  # noqa: E731
                                                        ignore_eos=True))]
            b = block if spec else None                               # fixed block, not adaptive
            engine.generate(reqs(), spec=spec, block_size=b)          # capture
            _, st = engine.generate(reqs(), spec=spec, block_size=b)  # replay
            res[f"{mode}_step_ms"] = 1e3 * st.step_s
            res[f"{mode}_tau"] = st.tau
            graphed = engine.runner.captured()[("spec", block) if spec else ("target-only",)]
            for key, runner in graphed.items():
                bucket = runner.state[1]
                name = f"{mode}:{key}"
                res[f"{name}_replay_ms"] = mean_ms(bucket.graph.replay, sync, 50)
                res[f"{name}_eager_body_ms"] = mean_ms(lambda: runner.body(bucket.inputs),
                                                       sync, 10)
                if backend.device.type == "cuda":
                    res[f"{name}_top_kernels"] = _top_kernels(
                        lambda: runner.body(bucket.inputs))
    if backend.device.type == "cuda":
        try:
            res["gemm_us"] = _gemms(pair, backend.device, sync)
        except Exception as exc:  # noqa: BLE001 - a diagnostic; keep the profile above
            res["gemm_error"] = f"{type(exc).__name__}: {exc}"
    return res


def step_profile_text(res: dict[str, Any]) -> str:
    """The profile as text, one entry (or table) per key."""
    lines: list[str] = []
    for k, v in res.items():
        if k == "launches":
            lines.append("kernel launches (counted on the CPU as this device runs them):")
            lines += ["    " + line for line in launches_text(v).splitlines()]
        elif k == "gemm_us":
            lines.append("linear x[M, K] @ W[N, K]^T, GPU us per call (graph of 50):")
            lines += [f"    M {row['m']:3d} N {row['n']:5d} K {row['k']} {row['dtype']}: "
                      f"{row['us']:7.1f}" for row in v]
        elif k == "synced_split_ms":
            lines.append("per-step split, ms (synced profiling pass):")
            lines += [f"    {name:28} draft {row['draft']:8.3f} verify {row['verify']:8.3f} "
                      f"host {row['host']:8.3f} step {row['step']:8.3f}"
                      for name, row in v.items()]
        elif isinstance(v, dict):
            lines.append(f"{k}: " + ", ".join(f"{a} {b:.3f}" for a, b in v.items()))
        elif not k.endswith("top_kernels"):
            lines.append(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
        else:
            lines.append(k)
            lines += [f"    {row['us']:9.1f} us  x{row['calls']:<3d} {row['kernel']}"
                      for row in v]
    return "\n".join(lines)
