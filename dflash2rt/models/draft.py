"""The DFlash2 draft: context injection, non-causal block attention, conv-wrapped sublayers.

One forward proposes a whole block: rows ``[anchor, MASK × γ]`` embedded with the *target's*
embedding attend (non-causally) to each other and to the draft context KV of committed tokens,
``k_proj/v_proj(hidden_norm(fc(target taps)))``. In DFlash2 every attention and MLP sublayer is
wrapped by the grouped dynamic conv (``prepare`` on its normed input, ``finish`` on its output);
DFlash v1 drafts have no conv and no selector.

A speculators draft may ship its own embedding (``embed_tokens``, over the target's ids) and LM
head (``lm_head``, over its own vocabulary); with a reduced vocabulary, ``d2t`` maps draft id
``i`` to target id ``i + d2t[i]`` and ``logits`` places the draft's logits there, at −inf
elsewhere: the draft proposes in its own ids, every later stage (processors, selector, verify)
works over the target's ids, and a token the draft cannot propose has q = 0.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash2rt.backend import Backend
from dflash2rt.models.draft_config import DraftConfig
from dflash2rt.models.kv_cache import KVCache
from dflash2rt.models.layers import Attention, RMSNorm, SwiGLU
from dflash2rt.models.rope import RopeTables, inv_freq
from dflash2rt.ops.vocab import place_draft_logits, target_ids


class DynamicConv(nn.Module):
    """Weights of one conv wrapper: base taps per side and the δ projection."""

    def __init__(self, hidden: int, taps: int, groups: int) -> None:
        super().__init__()
        self.taps, self.groups = taps, groups
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden))        # [side, Tk, H]
        self.kernel_projection = nn.Linear(hidden, 2 * taps * groups, bias=False)

    def deltas(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] → δ [N, 2, Tk, G] (side 0: input, side 1: output)."""
        return self.kernel_projection(x).view(x.shape[0], 2, self.taps, self.groups)


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        a = cfg.arch
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.self_attn = Attention(a.hidden_size, a.num_attention_heads, a.num_key_value_heads,
                                   a.head_dim, a.attention_bias, a.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.mlp = SwiGLU(a.hidden_size, a.intermediate_size, a.mlp_bias)
        conv = cfg.variant == "dflash2"
        mk = lambda: DynamicConv(a.hidden_size, cfg.conv_kernel_size, cfg.conv_groups)  # noqa: E731
        self.attention_conv = mk() if conv else None
        self.mlp_conv = mk() if conv else None

    def _sublayer(self, h, norm, conv, fn, backend: Backend, block: int) -> torch.Tensor:
        r, b, hid = h.shape
        x = norm(h)                                                           # [R, B, H]
        if conv is None:
            return h + fn(x)
        flat = x.reshape(r * b, hid)
        delta = conv.deltas(flat)                                             # [N, 2, Tk, G]
        x = backend.conv_prepare(flat, conv.base_kernel[0], delta[:, 0], block)
        a = fn(x.view(r, b, hid)).reshape(r * b, hid)
        out = backend.conv_finish(h.reshape(r * b, hid), a, conv.base_kernel[1], delta[:, 1], block)
        return out.view(r, b, hid)

    def forward(self, h, attend, backend: Backend, block: int):
        """``attend(self_attn, x)`` → the attention of the normed (conv-prepared) rows x."""
        attn = lambda x: attend(self.self_attn, x)  # noqa: E731
        h = self._sublayer(h, self.input_layernorm, self.attention_conv, attn, backend, block)
        return self._sublayer(h, self.post_attention_layernorm, self.mlp_conv, self.mlp,
                              backend, block)


class CandidateSelector(nn.Module):
    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        v, r = cfg.arch.vocab_size, cfg.selector_rank
        self.hidden_projection = nn.Linear(cfg.arch.hidden_size, r, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.zeros(v, r))
        self.successor_codebook = nn.Parameter(torch.zeros(v, r))


class DraftModel(RopeTables, nn.Module):
    """A DFlash2 / DFlash v1 draft; it borrows the target's embedding and LM head at run time."""

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        a = cfg.arch
        self.cfg = cfg
        self.fc = nn.Linear(len(cfg.target_layer_ids) * a.hidden_size, a.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(a.num_hidden_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.candidate_selector = CandidateSelector(cfg) if cfg.variant == "dflash2" else None
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size) if cfg.own_embedding \
            else None
        self.lm_head = nn.Linear(a.hidden_size, cfg.head_rows, bias=False) if cfg.own_head \
            else None
        if cfg.reduced_vocab:
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
            self.register_buffer("t2d", torch.zeros(a.vocab_size, dtype=torch.bool))
        else:
            self.d2t = self.t2d = None
        inv, self.attention_scaling = inv_freq(a.rope, a.head_dim)
        self.register_buffer("rope_inv_freq_bits", inv.view(torch.int32), persistent=False)

    def embed(self, ids: torch.Tensor, target) -> torch.Tensor:
        """ids [R, B] → [R, B, H]: the draft's own embedding if it ships one, else the target's."""
        return target.embed(ids) if self.embed_tokens is None else self.embed_tokens(ids)

    def logits(self, h: torch.Tensor, target) -> torch.Tensor:
        """Draft hidden [R, γ, H] → logits over the target's ids [R, γ, V]: the draft's own head
        if it ships one (else the target's); a reduced vocabulary placed by d2t, −inf elsewhere."""
        if self.lm_head is None:
            return target.lm_head(h)
        own = self.lm_head(h)                                                 # [R, γ, Vd]
        if self.d2t is None:
            return own
        return place_draft_logits(own, target_ids(self.d2t), self.cfg.arch.vocab_size)

    def context_kv(self, taps: torch.Tensor, positions: torch.Tensor):
        """Target taps [R, T, n_taps, H] at positions [R, T] → per layer (k, v) [R, T, n_kv, hd]."""
        return self.context_kv_of(self.context_hidden(taps), positions)

    def context_hidden(self, taps: torch.Tensor) -> torch.Tensor:
        """Target taps [R, T, n_taps, H] → the context hidden [R, T, H] (fc, then norm)."""
        return self.hidden_norm(self.fc(taps.flatten(-2)))

    def context_kv_of(self, ctx: torch.Tensor, positions: torch.Tensor):
        """Context hidden [R, T, H] at positions [R, T] → per layer (k, v) [R, T, n_kv, hd]."""
        cos, sin = self.rope(positions, ctx.dtype)
        return tuple(layer.self_attn.project_kv(ctx, cos, sin) for layer in self.layers)

    def write_context_kv(self, ctx: torch.Tensor, positions: torch.Tensor, cache: KVCache
                         ) -> None:
        """Context hidden [R, T, H] at positions [R, T] → its K/V per layer written into
        ``cache`` at those positions, every row (``context_kv_of``, then the writes)."""
        cos, sin = self.rope(positions, ctx.dtype, cache.max_len)
        for i, layer in enumerate(self.layers):
            layer.self_attn.write_kv(ctx, cos, sin, cache.k[i], cache.v[i], positions)

    def empty_cache(self, batch: int, max_len: int, dtype: torch.dtype, device) -> KVCache:
        """K/V per layer, and one side buffer [batch, max_len, H]: the context hidden of
        positions whose K/V a target-only step deferred (``engine.stages.catch_up_draft``)."""
        a = self.cfg.arch
        kv = KVCache.empty(a.num_hidden_layers, batch, max_len, a.num_key_value_heads,
                           a.head_dim, dtype, device)
        side = torch.zeros(batch, max_len, a.hidden_size, dtype=dtype, device=device)
        return KVCache(kv.k, kv.v, (side,))

    def forward(self, block_emb: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                lens: torch.Tensor, backend: Backend, ctx_len: int | None = None) -> torch.Tensor:
        """block_emb [R, B, H] at positions [R, B] (lens[r] + i); context rows [0, lens[r]) →
        hidden [R, B, H]. The block rows' K/V are written into the cache at their positions
        first (scratch past the context: the commit after verification overwrites them) and
        every row attends to its context window and the whole block (``backend.attention``), or
        in a causal layer (``cfg.causal``) to the block rows up to its own."""
        r, b, _ = block_emb.shape
        n_keys = cache.max_len if ctx_len is None else min(ctx_len + b, cache.max_len)
        h = block_emb * self.cfg.input_embedding_scale
        cos, sin = self.rope(positions, h.dtype, cache.max_len)
        start = lens.view(r, 1)
        hi = (start + b).expand(r, b)                                         # the whole block
        for i, layer in enumerate(self.layers):
            window = self.cfg.sliding_windows[i]
            causal = self.cfg.causal(i)
            lo = torch.zeros_like(positions) if window is None else \
                (positions - window + 1).clamp(min=0) if causal else \
                torch.minimum((positions - window + 1).clamp(min=0), start)    # [R, B]
            top = positions + 1 if causal else hi                # causal: block rows up to its own
            attend = (lambda a, x, i=i, lo=lo, top=top: a.forward_cached(
                x, cos, sin, cache.k[i], cache.v[i], positions, lo, top, n_keys,
                backend.attention))
            h = layer(h, attend, backend, b)
        return self.norm(h)
