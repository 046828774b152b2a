"""Qualification report dicts with every field of the report contract (verdict, implementation,
executed / minimum per level, errors), shaped like a real ``qualify --backend cpu --quick`` run:
one that passes on the CPU and one GPU-style report that fails on several counts."""

from __future__ import annotations

import copy
from typing import Any

OPS = ("conv_prepare", "conv_finish", "select", "verify", "noise")
MINIMUM = {"L0": 12, "L1": 85, "L2": 3, "L3": 2, "L4": 3, "graphs": 5}


def _level(title: str, result: str, passed: int, failed: int = 0, skipped: int = 0,
           minimum: int = 0, metrics: dict | None = None, reasons: list | None = None,
           note: str = "") -> dict[str, Any]:
    return {"title": title, "result": result, "passed": passed, "failed": failed,
            "skipped": skipped, "xfailed": 0, "xpassed": 0, "errors": 0,
            "executed": passed + failed, "minimum": minimum, "reasons": reasons or [],
            "note": note, "metrics": metrics or {}, "tests": []}


def _e2e(tonly: float, spec: float, tau: float, batch: int) -> dict[str, Any]:
    return {"prompts": batch, "tokens": 32 * batch, "tau": tau,
            "target_only_tokens_per_s": tonly, "ar_tokens_per_s": tonly,    # + deprecated alias
            "spec_tokens_per_s": spec, "hf_tokens_per_s": None, "greedy_equal": True,
            "hf_equal": None, "speedup_vs_target_only": spec / tonly, "speedup_vs_ar": spec / tonly,
            "speedup_vs_hf": None,
            "efficiency": 0.39, "mismatched_prompts": [],
            "time_split_per_step_s": {"draft": 0.0133, "select": 0.0053, "verify": 0.0220,
                                      "graphs": 0.0, "host": 0.0017}}


TEMPS = (("T=0", 0.0, 1.0), ("T=0.7 top-p 0.95", 0.7, 0.95), ("T=1", 1.0, 1.0))


def _rows() -> list[dict[str, Any]]:
    """measure_rows' rows: every temperature × batch (1, 4), three contenders each."""
    out = []
    for batch, tonly in ((1, 39.75), (4, 114.9)):
        for i, (label, t, top_p) in enumerate(TEMPS):
            def c(rate: float, tau: float, blocks: dict[str, int]) -> dict[str, Any]:
                return {"tokens_per_s": rate, "speedup_vs_target_only": rate / tonly,
                        "tau": tau, "steps": 10.0, "block_sizes": blocks,
                        "step_split_s": {"draft": 0.011, "verify": 0.013 + 0.002 * i,
                                         "host": 0.0002, "step": 0.0242 + 0.002 * i,
                                         "steps": 10}, "capture_s": 0.0, "warmup_s": 0.5,
                        "fallbacks": []}
            out.append({"temperature": label, "temperature_value": t, "top_p": top_p,
                        "batch": batch, "prompts": batch, "tokens": 16 * batch,
                        "seeds": [1234 + k for k in range(batch)],
                        "contenders": {"target_only": c(tonly, 1.0, {"1": 16}),
                                       "fixed": {**c(tonly * 2.5 - 10 * i, 6.8 - i, {"8": 3}),
                                                 "block_size": 8},
                                       "adaptive": c(tonly * 2.6 - 9 * i, 6.5 - i,
                                                     {"4": 1, "8": 2})},
                        "greedy_equal": True if t == 0 else None,
                        **({"mismatched_prompts": {"fixed": [], "adaptive": []}} if t == 0
                           else {})})
    return out


def _step_profile() -> dict[str, Any]:
    rows = [{"temperature": r["temperature"], "batch": r["batch"], "contender": name,
             "block_size": 8 if name == "fixed" else None,
             **{k: v for k, v in c["step_split_s"].items()}, "tau": c["tau"],
             "block_sizes": c["block_sizes"]}
            for r in _rows() for name, c in r["contenders"].items()]
    ratios = [{"batch": b, "temperature": label, "block_size": 8, "greedy_step_s": 0.0242,
               "sampled_step_s": 0.0242 + 0.002 * i, "ratio": (0.0242 + 0.002 * i) / 0.0242}
              for b in (1, 4) for i, (label, _, _) in enumerate(TEMPS) if i]
    return {"rows": rows, "sampled_over_greedy": ratios, "goal_sampled_over_greedy": 1.25,
            "method": "a separate untimed pass after the timed rounds"}


def passing_cpu() -> dict[str, Any]:
    levels = {
        "L0": _level("reference self-check (exact laws, mutation detection)", "pass", 12,
                     minimum=12, metrics={"TV Fraction V=3 γ=2 L=3 [a]": "0",
                                          "TV closed form Dirichlet V=4 K=3 γ=3 L=4": 7.13e-17,
                                          "mutant shared_noise TV": 0.3125}),
        "L1": _level("op and decision conformance vs the float64 reference", "pass", 198,
                     minimum=85, metrics={"spec_step qwen3_sampled_v11 float32 accept_len": 1}),
        "L2": _level("induced law of the verifier on a uniform lattice", "pass", 3, minimum=3,
                     metrics={"TV backend vs exact law, quarter [q1]": 0.0}),
        "L3": _level("joint law over several rounds (context-dependent tables)", "pass", 2,
                     minimum=2, metrics={"greedy chain": "(1, 2, 3, 1)"}),
        "L4": _level("end to end on a model through the Engine", "pass", 3, minimum=3, metrics={
            "model": "bundled 'stdlib-code' (torch.float32)",
            "greedy batch1": {"tokens_equal": 32, "own_argmax": 32, "exemptions": 0,
                              "tau": 1.8823529411764706},
            "sampled first tokens (T=1, top_k=3)": {
                "samples": 86658, "cells": 9, "chi2": 18.488, "dof": 8, "p_value": 0.01785,
                "tv_estimate": 0.00637, "detectable_tv": 0.00971, "alpha": 0.001}}),
        "graphs": _level("graph replay == eager", "skipped", 0, skipped=6,
                         note="backend cpu captures no graphs (graph mode none)"),
    }
    env = {"dflash2rt.backend": "cpu", "device": "cpu (x86_64, 2 cores, 1 torch threads)",
           "torch": "2.13.0+cpu", "numpy": "2.4.6", "git.commit": "e3cf9ee396f748479e87635892",
           "dflash2rt.sizes": "full", "dflash2rt.l4_model": "bundled 'stdlib-code'"}
    conformance = {
        "status": "pass", "result": "pass", "reasons": [], "errors": [], "seconds": 44.6,
        "schema": "dflash2rt-conformance/1", "environment": env, "selection": "all levels",
        "summary_line": "218 passed, 6 skipped, 66 deselected in 37.54s", "exit_code": 0,
        "implementation": {"backend": "cpu", "ops": {op: "torch ops" for op in OPS},
                           "kernels": "torch ops: " + ", ".join(OPS), "graphs": "none",
                           "fallbacks": [], "allow_fallback": False},
        "levels": levels, "exemptions": [],
        "ops": [{"op": "conv_finish.out", "dtype": "float32", "kind": "float",
                 "max_abs": 7.09e-07, "max_rel": 3.1e-4, "atol": 2e-06, "rtol": 2e-06,
                 "checks": 8, "mismatches": 0, "passed": True},
                {"op": "conv_finish.out", "dtype": "bfloat16", "kind": "float", "max_abs": 0.0497,
                 "max_rel": 0.09, "atol": 0.1, "rtol": 0.05, "checks": 8, "mismatches": 0,
                 "passed": True},
                {"op": "verify.probs", "dtype": "float64", "kind": "float", "max_abs": 0.0,
                 "max_rel": 0.0, "atol": 1e-12, "rtol": 1e-12, "checks": 4, "mismatches": 0,
                 "passed": True},
                {"op": "verify.accept_len", "dtype": "float32", "kind": "exact", "max_abs": 0.0,
                 "max_rel": 0.0, "atol": None, "rtol": None, "checks": 12, "mismatches": 0,
                 "passed": True}]}
    sweep = [{"block_size": b, "tau": t, "speedup_vs_target_only": s, "speedup_vs_ar": s,
              "predicted_speedup": p,
              "t_target_s": 0.025, "t_draft_s": 0.012, "t_verify_s": 0.02}
             for b, t, s, p in ((2, 1.8, 0.9, 0.85), (4, 2.44, 1.23, 1.13), (8, 3.19, 1.7, 1.45))]
    return {
        "schema": "dflash2rt-qualify/1", "backend": "cpu", "quick": True,
        "model": "stdlib-code", "complete": True, "elapsed_s": 56.9,
        "verdict": {"result": "pass", "reasons": []},
        "system": {"backend": "cpu", "device": env["device"],
                   "kernels": "torch eager ops (reference semantics)",
                   "graphs": "none: eager on CPU (no graph API for CPU tensors)",
                   "dtypes": ["float32", "float64", "bfloat16"], "plugin_distribution":
                   "dflash2rt", "plugin_version": "0.1.0", "runtime": {"torch": "2.13.0+cpu"},
                   "torch": "2.13.0+cpu", "numpy": "2.4.6", "python": "3.11.7",
                   "commit": "e3cf9ee396f748479e87635892ee62b61ada9470+dirty",
                   "all_backends": [{"name": "cpu", "available": True, "reason": ""},
                                    {"name": "cuda", "available": False,
                                     "reason": "torch 2.13.0+cpu has no CUDA support"}]},
        "sections": {
            "conformance": conformance,
            "op_microbench": {"status": "done", "seconds": 0.03, "rows": [
                {"op": "conv", "batch": 1, "latency_us": 125.7, "bytes": 2816,
                 "achieved_gbps": 0.0224, "peak_gbps": None, "fraction_of_peak": None}]},
            "graphs": {"status": "done", "seconds": 0.0, "applicable": False,
                       "reason": "backend cpu captures no graphs"},
            "end_to_end": {"status": "done", "seconds": 20.1,
                           "batch1": _e2e(39.75, 104.4, 6.8, 1),
                           "batch4": _e2e(114.9, 183.2, 3.72, 4),
                           "rows": _rows(), "step_profile": _step_profile(),
                           "cache_sizing_capture_s": 0.0},
            "block_sweep": {"status": "done", "seconds": 30.2, "rows": sweep,
                            "recommended_block_size": 8,
                            "fit": "speedup = tau * T_target / (T_draft + T_verify)"}},
        "fallbacks": [], "known_deviations": ["Residual and bonus tokens are drawn by inverse "
                                              "CDF over float64 cumulative sums."],
    }


def failing_gpu() -> dict[str, Any]:
    """A cuda report: two ops fell back to torch, L1 and graphs fail, a suite failed to import."""
    r = copy.deepcopy(passing_cpu())
    r["backend"] = "cuda"
    r["system"].update(backend="cuda", device="NVIDIA H200 (sm_90, 139 GiB)",
                       kernels="triton kernels (FlagGems-style tuning table)")
    conf = r["sections"]["conformance"]
    reasons = ["collection error in dflash2rt_conformance/suites/test_l1_ops.py: ImportError: "
               "cannot import name 'chunked_verify'",
               "implementation: backend 'cuda' was asked for by name but its kernels fell back "
               "(verify: triton build failed: out of shared memory); what ran: torch ops",
               "L1: 3 test(s) failed", "graphs: executed 2 < minimum 5 (3 skipped)",
               "graphs: 1 capture refused (bucket 4)",
               "L1 verify.tokens bfloat16: 3 of 240 entries differ (exact comparison)",
               "graphs: bucket 4 of 'verify sampled' ran eagerly (capture refused)"]
    conf.update(status="fail", result="fail", reasons=reasons, errors=[
        {"where": "dflash2rt_conformance/suites/test_l1_ops.py", "phase": "collect",
         "message": "ImportError: cannot import name 'chunked_verify'"}])
    conf["implementation"] = {
        "backend": "cuda", "ops": {"conv_prepare": "triton kernel", "conv_finish": "triton kernel",
                                   "select": "triton kernel", "verify": "torch ops",
                                   "noise": "torch ops"},
        "kernels": "triton kernel: conv_prepare, conv_finish, select; torch ops: verify, noise "
                   "— fallback REFUSED: the backend was asked for by name",
        "graphs": "cuda graphs", "fallbacks": ["verify: triton build failed: out of shared "
                                               "memory"], "allow_fallback": False}
    lv = conf["levels"]
    lv["L1"].update(result="fail", passed=195, failed=3, executed=198,
                    reasons=["3 test(s) failed", "1 suite module(s) of this level failed to "
                             "import (collection error)"])
    lv["graphs"].update(result="fail", passed=2, skipped=3, executed=2, minimum=5,
                        reasons=["executed 2 < minimum 5 (3 skipped)"])
    r["verdict"] = {"result": "fail", "reasons": reasons}
    r["fallbacks"] = ["verify: triton build failed: out of shared memory"]
    return r
