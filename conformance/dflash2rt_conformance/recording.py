"""A Backend proxy that records every verify call (logits and decisions) for the L4 checks."""

from __future__ import annotations

from dflash2rt.backend import Backend


class RecordingBackend(Backend):
    """Delegates every op to ``inner``; keeps (logits, accept_len, tokens, greedy) per verify."""

    def __init__(self, inner: Backend) -> None:
        super().__init__()
        self.inner, self.name, self.device, self.dtypes = inner, inner.name, inner.device, \
            inner.dtypes
        self.calls: list[tuple] = []

    @property
    def standing_fallbacks(self) -> tuple[str, ...]:
        return self.inner.standing_fallbacks

    def conv_prepare(self, x, base, delta, block_size):
        return self.inner.conv_prepare(x, base, delta, block_size)

    def conv_finish(self, h, a, base, delta, block_size):
        return self.inner.conv_finish(h, a, base, delta, block_size)

    def select(self, logits, proj, anchor, pred_codebook, succ_codebook, params, sampling,
               u_walk):
        return self.inner.select(logits, proj, anchor, pred_codebook, succ_codebook, params,
                                 sampling, u_walk)

    def verify(self, logits, draft, candidates, q, sampling, noise, check=True):
        out = self.inner.verify(logits, draft, candidates, q, sampling, noise, check)
        self.calls.append((logits.detach().float().cpu(), out.accept_len.cpu(),
                           out.tokens.cpu(), sampling.greedy.cpu()))
        return out

    def attention(self, q, k, v, lo, hi, scale):
        return self.inner.attention(q, k, v, lo, hi, scale)

    def noise(self, seed, request, anchor_pos, gamma):
        return self.inner.noise(seed, request, anchor_pos, gamma)
