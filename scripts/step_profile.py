"""Where a graphed decode step's time goes on a GPU backend (JSON): the per-step split (draft,
verify, host) of the greedy and the sampled speculative step at the draft's block size, and their
ratio (dflash2rt.bench.measure.profile_steps: every graph replay between two device syncs), each
captured graph's replay time alone, the whole step as the engine runs it (host work and the one
sync included), and the top kernels of each graph's body run eagerly under torch.profiler."""

from __future__ import annotations

import argparse
import json
import sys

import torch

from dflash2rt.api import resolve_model
from dflash2rt.bench.measure import TEMPERATURES, mean_ms, seeded_requests
from dflash2rt.bench.profile import profile_steps
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.registry import Registry

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
    """GPU time (a graph of 50 calls, so no launch overhead) of x [M, hidden] @ W^T for the model's MLP and LM-head widths: M = 1 (a target-only step),
    block (a verify / draft block), 8 blocks; fp32, fp32 with TF32, bf16 (cuBLAS's choice)."""
    cfg = pair.target.cfg
    block = pair.draft.cfg.block_size if pair.draft is not None else 8
    rows = []
    for n in (cfg.intermediate_size, cfg.vocab_size):
        for m in (1, block + 1, 8 * (block + 1)):
            for name, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--model", default="stdlib-code")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    backend = Registry.discover().select(args.backend).backend
    if backend.graph_adapter is None:
        print(f"{args.backend} captures no graphs: nothing to profile", file=sys.stderr)
        return 1
    pair = resolve_model(args.model, backend.device, torch.float32)
    sync = torch.cuda.synchronize if backend.device.type == "cuda" else (lambda: None)
    ids = tuple(pair.tokenizer.encode(PROMPT))
    res: dict = {"backend": args.backend}
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
            reqs = lambda: [Request(ids, SamplingParams(max_new_tokens=96, ignore_eos=True))]  # noqa: E731
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
                res[f"{name}_eager_body_ms"] = mean_ms(lambda: runner.body(bucket.inputs), sync, 10)
                if backend.device.type == "cuda":
                    res[f"{name}_top_kernels"] = _top_kernels(lambda: runner.body(bucket.inputs))
    if backend.device.type == "cuda":
        try:
            res["gemm_us"] = _gemms(pair, backend.device, sync)
        except Exception as exc:  # noqa: BLE001 - a diagnostic; keep the profile above
            res["gemm_error"] = f"{type(exc).__name__}: {exc}"
    for k, v in res.items():
        if k == "gemm_us":
            print("linear x[M, K] @ W[N, K]^T, GPU us per call (graph of 50):")
            for row in v:
                print(f"    M {row['m']:3d} N {row['n']:5d} K {row['k']} {row['dtype']}: "
                      f"{row['us']:7.1f}")
        elif k == "synced_split_ms":
            print("per-step split, ms (synced profiling pass):")
            for name, row in v.items():
                print(f"    {name:28} draft {row['draft']:8.3f} verify {row['verify']:8.3f} "
                      f"host {row['host']:8.3f} step {row['step']:8.3f}")
        elif isinstance(v, dict):
            print(f"{k}: " + ", ".join(f"{a} {b:.3f}" for a, b in v.items()))
        elif not k.endswith("top_kernels"):
            print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
        else:
            print(k)
            for row in v:
                print(f"    {row['us']:9.1f} us  x{row['calls']:<3d} {row['kernel']}")
    json.dump(res, open(args.out, "w"), indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
