"""TargetModel: a native Qwen3/Llama decoder whose one forward serves prefill, decode and block verify."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from dflash2rt.errors import InvalidInputError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.kv_cache import KVCache
from dflash2rt.models.layers import Attention, RMSNorm, SwiGLU
from dflash2rt.models.rope import RopeTables, inv_freq
from dflash2rt.ops.attention import AttentionFn, attention


@dataclass(frozen=True)
class TargetOutput:
    """What one target forward returns (the cached forward has written its K/V rows)."""

    logits: torch.Tensor  # [R, T, V] (or [R, 1, V] with logits_at)
    taps: torch.Tensor  # [R, T, n_taps, H]: output of decoder layer tap_layer_ids[i]


class DecoderLayer(nn.Module):
    """Pre-norm block: h + attn(norm(h)), then h + mlp(norm(h))."""

    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        qk_eps = cfg.rms_norm_eps if cfg.qk_norm else None
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.attention_bias, qk_eps
        )
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)

    def forward(self, h: torch.Tensor, attend: Callable[[Attention, torch.Tensor], torch.Tensor]
                ) -> torch.Tensor:
        """``attend(self_attn, normed h)`` → the attention sublayer's output [R, T, H]."""
        h = h + attend(self.self_attn, self.input_layernorm(h))  # [R, T, H]
        return h + self.mlp(self.post_attention_layernorm(h))


class _Backbone(nn.Module):
    """Holds the modules under HF's `model.` prefix so state_dict names equal checkpoint names."""

    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


def causal_mask(valid: torch.Tensor) -> torch.Tensor:
    """Bool [R, T, T]: row j sees valid rows j' <= j, and itself (padded rows stay finite)."""
    t = valid.shape[1]
    j = torch.arange(t, device=valid.device)
    causal = j[None, :] <= j[:, None]  # [T, T]
    return causal & (valid[:, None, :] | (j[None, :] == j[:, None]))  # [R, T, T]


class TargetModel(RopeTables, nn.Module):
    """Qwen3 or Llama causal LM with a static external KV cache and hidden-state taps."""

    def __init__(self, cfg: TargetConfig, tap_layer_ids: Sequence[int] = ()) -> None:
        super().__init__()
        taps = tuple(int(i) for i in tap_layer_ids)
        if len(set(taps)) != len(taps) or any(not 0 <= i < cfg.num_hidden_layers for i in taps):
            raise InvalidInputError(
                f"tap_layer_ids {list(taps)} must be distinct layer indices in [0, {cfg.num_hidden_layers})"
            )
        self.cfg = cfg
        self.tap_layer_ids = taps
        self.model = _Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.tie_weights()
        inv, self.attention_scaling = inv_freq(cfg.rope, cfg.head_dim)  # [hd/2] float32 on CPU
        # Stored as int32 bits so that model.to(dtype) cannot round the frequencies; .to(device) moves it.
        self.register_buffer("rope_inv_freq_bits", inv.view(torch.int32), persistent=False)

    def tie_weights(self) -> None:
        """Share the embedding matrix with the LM head (tie_word_embeddings)."""
        self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def final_norm(self) -> RMSNorm:
        return self.model.norm

    @property
    def rope_inv_freq(self) -> torch.Tensor:
        """Inverse frequencies [hd/2], float32, bit-identical to transformers'."""
        return self.rope_inv_freq_bits.view(torch.float32)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [...] -> embeddings [..., H]."""
        return self.model.embed_tokens(ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        lens: torch.Tensor,
        ctx_len: int | None = None,
        logits_at: torch.Tensor | None = None,
        attn: AttentionFn = attention,
    ) -> TargetOutput:
        """Run T new rows per request at positions lens[r] + t; each writes its K/V into the
        cache at its position first, then attends (causally) over the cache: rows
        [0, lens[r]) and the new rows up to itself.

        input_ids, positions [R, T] int64 (positions[r, t] = lens[r] + t < cache.max_len);
        lens [R] int64. Rows past a request's real ones (right padding) give garbage that no
        earlier row reads; what they write lies past the request's length (scratch, as are
        rejected rows: committing is advancing ``lens``). `ctx_len` (host int; default: the whole
        cache is read) bounds the cache rows read before the new ones: pass it only when
        every lens[r] <= ctx_len. `logits_at` [R] int64 (row index per request) computes the
        logits of that row only: [R, 1, V] (prefill needs the last prompt row alone). ``attn``:
        the attention op (a backend's ``attention``). No device->host sync.
        """
        self._check(input_ids, positions, cache, lens, ctx_len)
        t = input_ids.shape[1]
        n_keys = cache.max_len if ctx_len is None else min(ctx_len + t, cache.max_len)
        h = self.embed(input_ids)  # [R, T, H]
        cos, sin = self.rope(positions, h.dtype, cache.max_len)  # [R, T, hd]: a table gather
        lo, hi = torch.zeros_like(positions), positions + 1  # [R, T]: keys [0, pos]

        def layer_attend(i: int):
            return lambda a, x: a.forward_cached(x, cos, sin, cache.k[i], cache.v[i], positions,
                                                 lo, hi, n_keys, attn)

        return self._run(h, layer_attend, logits_at)

    def forward_full(self, input_ids: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor
                     ) -> TargetOutput:
        """A causal forward of whole sequences without a cache (training, references):
        input_ids, positions [R, T]; valid [R, T] bool (invalid rows: garbage, never read)."""
        h = self.embed(input_ids)  # [R, T, H]
        cos, sin = self.rope(positions, h.dtype)
        mask = causal_mask(valid)  # [R, T, T]
        none = h.new_zeros(h.shape[0], 0, self.cfg.num_key_value_heads, self.cfg.head_dim)
        return self._run(h, lambda i: lambda a, x: a(x, cos, sin, none, none, mask)[0], None)

    def _run(self, h: torch.Tensor, layer_attend, logits_at: torch.Tensor | None) -> TargetOutput:
        """The decoder stack, taps and LM head; ``layer_attend(i)`` is layer i's attention."""
        taps: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.model.layers):
            h = layer(h, layer_attend(i))
            if i in self.tap_layer_ids:
                taps[i] = h
        last = h
        if logits_at is not None:
            last = h.gather(1, logits_at.view(-1, 1, 1).expand(-1, 1, h.shape[-1]))  # [R, 1, H]
        logits = self.lm_head(self.model.norm(last))  # [R, T or 1, V]
        if self.tap_layer_ids:
            tapped = torch.stack([taps[i] for i in self.tap_layer_ids], dim=2)  # [R, T, n_taps, H]
        else:
            tapped = h.new_zeros(*h.shape[:2], 0, h.shape[-1])
        return TargetOutput(logits=logits, taps=tapped)

    def _check(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        lens: torch.Tensor,
        ctx_len: int | None,
    ) -> None:
        """Host-side checks of shapes and dtypes only (no tensor values are read)."""
        if input_ids.dim() != 2 or input_ids.dtype != torch.int64:
            raise InvalidInputError(f"input_ids must be [R, T] int64, got {tuple(input_ids.shape)} {input_ids.dtype}")
        r, t = input_ids.shape
        if positions.shape != (r, t) or positions.dtype != torch.int64:
            raise InvalidInputError(
                f"positions must be [{r}, {t}] int64, got {tuple(positions.shape)} {positions.dtype}"
            )
        if lens.shape != (r,) or lens.dtype != torch.int64:
            raise InvalidInputError(f"lens must be [{r}] int64, got {tuple(lens.shape)} {lens.dtype}")
        if cache.num_layers != self.cfg.num_hidden_layers or cache.batch_size != r:
            raise InvalidInputError(
                f"cache has {cache.num_layers} layers x {cache.batch_size} requests; "
                f"the model needs {self.cfg.num_hidden_layers} layers x {r} requests"
            )
        if cache.k[0].shape[2:] != (self.cfg.num_key_value_heads, self.cfg.head_dim):
            raise InvalidInputError(f"cache heads {tuple(cache.k[0].shape[2:])} do not match the model")
        if cache.dtype != self.lm_head.weight.dtype:
            raise InvalidInputError(f"cache dtype {cache.dtype} differs from the model's {self.lm_head.weight.dtype}")
        if t > cache.max_len:
            raise InvalidInputError(f"{t} new rows exceed the cache's max_len {cache.max_len}")
        if ctx_len is not None and not 0 <= ctx_len <= cache.max_len:
            raise InvalidInputError(f"ctx_len {ctx_len} must be in [0, {cache.max_len}]")
