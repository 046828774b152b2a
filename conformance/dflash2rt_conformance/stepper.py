"""One speculative step through dflash2rt's own engine steps on the backend under test
(prefill → draft_block → select_block → verify_block), with every intermediate returned."""

from __future__ import annotations

import torch

from dflash2rt.engine import stages
from dflash2rt.engine.state import BatchState
from dflash2rt.models.kv_cache import KVCache
from dflash2rt.models.pair import ModelPair
from dflash2rt.ops.batch import SamplingBatch


def run_step(pair: ModelPair, backend, prompt: tuple[int, ...], seed: int, key: int,
             temperature: float, top_k: int, top_p: float) -> dict:
    dev, n = backend.device, len(prompt)
    block = pair.draft.cfg.block_size
    a = pair.target.cfg
    max_len = n + block + 1
    i64 = lambda xs: torch.tensor(xs, dtype=torch.int64, device=dev)  # noqa: E731
    st = BatchState(
        KVCache.empty(a.num_hidden_layers, 1, max_len, a.num_key_value_heads, a.head_dim,
                      pair.dtype, dev),
        pair.draft.empty_cache(1, max_len, pair.dtype, dev), i64([0]), i64([0]), i64([seed]),
        i64([key]), SamplingBatch.build([temperature], [top_k], [top_p], dev), [0], [0])
    with torch.inference_mode():
        first = stages.prefill(pair, st, backend, [prompt])
        pos = stages.block_positions(st, block)
        h_e = stages.draft_block(pair, st, backend, pos, n)
        noise = backend.noise(st.seed, st.key, st.lens, block - 1)
        sel = stages.select_block(pair, st, backend, h_e, noise)
        tgt, ver, _ = stages.verify_block(pair, st, backend, sel, noise, pos, n)
        logits = pair.target.lm_head(h_e)
    return {"anchor": int(first.token[0]), "draft_hidden": h_e[0], "draft_logits": logits[0],
            "candidates": sel.candidates[0], "draft": sel.draft[0], "q": sel.q[0],
            "verify_logits": tgt.logits[0], "accept_len": int(ver.accept_len[0]),
            "tokens": ver.tokens[0], "bad": bool(ver.bad[0] | sel.bad[0])}
