"""Peak host memory per rank of loading a pair for tensor parallelism (VmHWM of
/proc/self/status, each rank a fresh process):

    python scripts/tp_load_rss.py PAIR_DIR --tp 2 [--whole]

``--tp 1``: ``load_pair`` (the whole target); ``--tp N``: each rank loads its shard
(``distributed.shard.load_pair_shard``: slices read from the memory-mapped safetensors);
``--whole``: each rank loads the whole target, then slices it in place (``shard_target``), as
before sharded loading. Prints one line per rank: VmRSS before loading, VmHWM after, the bytes
of the rank's target and draft tensors."""

from __future__ import annotations

import argparse
import json
import os


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def _bytes(module) -> int:
    seen, n = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            n += t.numel() * t.element_size()
    return n


def _load(root: str, tp: int, whole: bool) -> dict:
    import torch

    from dflash2rt.models.pair import load_pair

    before = _status()["VmRSS"]
    target, draft = os.path.join(root, "target"), os.path.join(root, "draft")
    if tp == 1:
        pair, rank = load_pair(target, draft, torch.float32, "cpu"), 0
    else:
        from dflash2rt.distributed import group, shard

        g = group.join(torch.device("cpu"), tp)
        rank = g.rank
        if whole:
            pair = load_pair(target, draft, torch.float32, "cpu")
            shard.shard_target(pair.target, g)
        else:
            pair = shard.load_pair_shard(target, draft, g, torch.float32, "cpu")
    st = _status()
    return {"rank": rank, "rss_before": before, "hwm": st["VmHWM"], "rss_after": st["VmRSS"],
            "target_bytes": _bytes(pair.target), "draft_bytes": _bytes(pair.draft)}


def _rank(root: str, tp: int, whole: bool, out: str) -> None:
    res = _load(root, tp, whole)
    with open(f"{out}.{res['rank']}", "w") as f:
        json.dump(res, f)


def main() -> None:
    import tempfile

    ap = argparse.ArgumentParser()
    ap.add_argument("pair")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--whole", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank")
        if args.tp == 1:
            import multiprocessing as mp

            p = mp.get_context("spawn").Process(target=_rank, args=(args.pair, 1, False, out))
            p.start()
            p.join()
        else:
            from dflash2rt.distributed import launch

            launch.spawn(_rank, args.tp, (args.pair, args.tp, args.whole, out))
        mode = "TP=1 load_pair" if args.tp == 1 else (
            f"TP={args.tp} {'whole load + shard_target' if args.whole else 'sharded load'}")
        for r in range(args.tp):
            d = json.load(open(f"{out}.{r}"))
            gib = {k: v / 2**30 for k, v in d.items() if k != "rank"}
            print(f"{mode} rank {r}: VmRSS before {gib['rss_before']:.2f} GiB, peak VmHWM "
                  f"{gib['hwm']:.2f} GiB, VmRSS after {gib['rss_after']:.2f} GiB; tensors: "
                  f"target {gib['target_bytes']:.2f} GiB, draft {gib['draft_bytes']:.2f} GiB")


if __name__ == "__main__":
    main()
