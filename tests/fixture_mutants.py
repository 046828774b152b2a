"""Out-of-tree mutant backends, one planted bug each: kernels, adaptive speculation,
watermarking, logit processors and constraints.

Each mutant is a TorchOpsBackend subclass (or a patched runtime op) installed as a real
distribution with a ``dflash2rt.backends`` entry point; ``source(name, dtypes)`` writes it for a
backend that declares only float32 ("float32") or float32, float64 and bfloat16 ("all").
"""

from __future__ import annotations

from pathlib import Path

BASE = '''
import torch
from dflash2rt.backend import BackendSpec, Probe, TorchOpsBackend
from dflash2rt.hookspecs import hookimpl
from dflash2rt.ops import sampling as ops_sampling, verify as ops_verify
from dflash2rt.ops.batch import BlockNoise
from dflash2rt.ops.conv import check_conv_args
from dflash2rt.ops.sampling import target_probs
from dflash2rt.ops.verify import VerifyOut, assemble_tokens

CHUNK = 2048        # the vocabulary chunk of the chunked-scan mutants (the largest tuned block_v)
TILE = 128          # the channel tile of the conv mutant (the smallest tuned block_h)
{prelude}

class Mutant(TorchOpsBackend):
{body}

@hookimpl
def dflash2rt_backends():
    probe = lambda: Probe(True, device="cpu (mutant fixture)", dtypes={probe})
    return [BackendSpec("{name}", 1, probe, lambda p: Mutant("{name}", "cpu", {dtypes}),
                        opt_in=True)]
'''

DTYPES = {"float32": ('("float32",)', "(torch.float32,)"),
          "all": ('("float32", "float64", "bfloat16")',
                  "(torch.float32, torch.float64, torch.bfloat16)")}

_TOPP_KEEPS_ONE_MORE = '''
def _target_probs_keeps_one_more(logits, temperature, top_k, top_p, **host_facts):
    """ops.sampling.target_probs with `before <= top_p`: at an exact boundary the token whose
    mass ahead equals top_p is kept too (one token too many)."""
    r, _, v = logits.shape
    x = ops_sampling.scale(logits, temperature.view(r, 1, 1))
    srt, order = torch.sort(x, dim=-1, descending=True, stable=True)
    rank = torch.arange(v, device=x.device).view(1, 1, v)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, v)).clamp(max=v).view(r, 1, 1)
    srt = srt.masked_fill(srt < srt.gather(-1, (k - 1).expand(r, srt.shape[1], 1)), -torch.inf)
    p_sorted = torch.softmax(srt, dim=-1)
    before = torch.cumsum(p_sorted, dim=-1) - p_sorted
    keep = (before <= top_p.float().view(r, 1, 1)) | (top_p >= 1).view(r, 1, 1) | (rank == 0)
    srt = srt.masked_fill(~keep, -torch.inf)
    return torch.softmax(torch.full_like(x, -torch.inf).scatter(-1, order, srt), dim=-1)


ops_sampling.target_probs = ops_verify.target_probs = _target_probs_keeps_one_more
'''

_PROCS_PRE_BLOCK = '''
from dflash2rt.ops import procs as ops_procs


def _pre_block_counts(counts, draft):
    """Every verify row gets the committed counts (the in-block drafts are not counted)."""
    t = 1 if draft is None else draft.shape[1] + 1
    return counts.unsqueeze(1).expand(-1, t, -1)


ops_procs.block_counts = _pre_block_counts
'''

_PROCS_ROW0 = '''
from dflash2rt.ops import procs as ops_procs

_process = ops_procs.ProcBatch.process


def _row0_everywhere(self, logits, draft=None):
    """Row 0's processing, as a change to the logits, applied to every row."""
    row0 = logits[:, :1].float()
    delta = torch.where(torch.isfinite(row0), _process(self, logits[:, :1], None) - row0, 0.0)
    return logits.float() + delta


ops_procs.ProcBatch.process = _row0_everywhere
'''

_CONSTRAINT_ROW0 = '''
from dflash2rt.constraints import device as constraint_device


def _row0_state(table, state, draft):
    """Every verify row gets the committed state (row 0's mask on every row)."""
    t = 1 if draft is None else draft.shape[1] + 1
    return state.view(-1, 1).expand(-1, t)


constraint_device.block_states = _row0_state
'''

_SHAPES_OK = '''
        g = logits.shape[1] - 1
        if g < 1 or tuple(draft.shape) != (logits.shape[0], g):    # let the real checks raise
            return super().verify(logits, draft, candidates, q, sampling, noise, check)
'''

_CHUNKED_ARGMAX = '''
def _chunked_argmax(x):
    """[..., V] → argmax per row scanning chunks of CHUNK; a tie with an earlier chunk's
    maximum goes to the LATER chunk (`>=` instead of `>`)."""
    best = torch.full(x.shape[:-1], -torch.inf, device=x.device)
    best_i = torch.zeros(x.shape[:-1], dtype=torch.int64, device=x.device)
    for s in range(0, x.shape[-1], CHUNK):
        c = x[..., s:s + CHUNK].float()
        m, i = c.amax(-1), c.argmax(-1) + s
        take = m >= best
        best_i, best = torch.where(take, i, best_i), torch.where(take, m, best)
    return best_i
'''

_CHUNKED_ICDF = '''
def _chunked_inverse_cdf(w, u):
    """First index with cdf > u·total, scanning chunks of CHUNK, but each chunk's cumulative
    sum restarts at 0 (the running sum of the earlier chunks is dropped)."""
    r, v = w.shape
    target = (u.double() * w.sum(1)).view(r, 1)
    count = torch.zeros(r, dtype=torch.int64, device=w.device)
    for s in range(0, v, CHUNK):
        count += (torch.cumsum(w[:, s:s + CHUNK], 1) <= target).sum(1)
    last = torch.where(w > 0, torch.arange(v, device=w.device), -1).amax(1)
    return torch.minimum(count, last)
'''

_WM_ONE_KEY = '''
from dflash2rt.watermark import generate as wm_generate


def _emit_with_draft_key(self, law, slot, plain):
    """Marks.emit keyed by subkey A (the draft's) instead of B: one key for both sides."""
    s = slot.view(-1, 1)
    drawn = wm_generate.draw_dense(self.key.draft, self.ctx.gather(1, s)[:, 0], law)
    return torch.where(self.fresh.gather(1, s)[:, 0], drawn, plain)


wm_generate.Marks.emit = _emit_with_draft_key
'''

_WM_COIN_FROM_DRAW = '''
import dataclasses
from dflash2rt.watermark import generate as wm_generate
from dflash2rt.watermark.values import keyed_uniforms


def _verify_coin_from_draw(wm, logits, sel, sampling, noise, has_fp64=None):
    """verify_marked whose acceptance coin is the draft token's own keyed value (subkey A at
    its context), the value its Gumbel-max draw won with, instead of subkey C's coin."""
    marks = wm.marks(sel.draft)
    g = sel.draft.shape[1]
    u = keyed_uniforms(wm.key.draft, marks.ctx[:, :g], sel.draft)
    noise = dataclasses.replace(noise, accept=torch.where(marks.fresh[:, :g], u, noise.accept))
    return ops_verify.verify(logits, sel.draft, sel.candidates, sel.q, sampling, noise, False,
                             has_fp64, marks=marks)


wm_generate.verify_marked = _verify_coin_from_draw
'''

_WM_ACCEPT_IGNORES_Q = '''
from dflash2rt.watermark import generate as wm_generate


def _verify_accept_without_q(wm, logits, sel, sampling, noise, has_fp64=None):
    """verify_marked whose keyed coins are divided by the draft token's q: the rule
    coin · q(d) < p(d) becomes coin < p(d) (accepts with probability p(d), not
    min(1, p(d) / q(d))); the keyed walk, residual and bonus draws are untouched."""
    marks = wm.marks(sel.draft)
    q_d = (sel.q * (sel.candidates == sel.draft.unsqueeze(-1))).sum(-1)
    keyed = marks.noise(noise)
    noise = dataclasses.replace(keyed, accept=keyed.accept / q_d.clamp(min=1e-30))
    return ops_verify.verify(logits, sel.draft, sel.candidates, sel.q, sampling, noise, False,
                             has_fp64, marks=marks)


wm_generate.verify_marked = _verify_accept_without_q
'''

MUTANTS = {
    # ops.sampling.target_probs keeps the token whose mass ahead equals top_p (`<=`): every
    # path through it (target_probs, sample_next, verify) keeps one token too many.
    "topp-boundary": (_TOPP_KEEPS_ONE_MORE, "    pass\n"),
    # An 8-bit acceptance mask: slots >= 8 read as rejected (greedy rows as a mismatch,
    # sampled rows as a failed coin), so no block accepts past slot 7.
    "accept-8-slots": ("", '''
    def verify(self, logits, draft, candidates, q, sampling, noise, check=True):'''
        + _SHAPES_OK + '''
        late = torch.arange(g, device=draft.device) >= 8
        top = logits[:, :g].argmax(-1)
        draft_seen = torch.where(late & sampling.greedy.view(-1, 1),
                                 (top + 1) % logits.shape[2], draft)
        coin = torch.where(late, torch.inf, noise.accept).to(noise.accept.dtype)
        return super().verify(logits, draft_seen, candidates, q, sampling,
                              BlockNoise(noise.walk, coin, noise.residual, noise.bonus), check)
'''),
    # Greedy argmax scanned in chunks of 2048; a cross-chunk tie goes to the later chunk.
    "chunk-argmax-tie": (_CHUNKED_ARGMAX, '''
    def verify(self, logits, draft, candidates, q, sampling, noise, check=True):
        out = super().verify(logits, draft, candidates, q, sampling, noise, check)
        top = _chunked_argmax(logits)                                       # [R, γ+1]
        acc = torch.cumprod((draft == top[:, :draft.shape[1]]).long(), 1).sum(1)
        acc = torch.where(sampling.greedy, acc, out.accept_len)
        emitted = torch.where(sampling.greedy, top.gather(1, acc.view(-1, 1)).view(-1),
                              out.tokens.gather(1, acc.view(-1, 1)).view(-1))
        return VerifyOut(acc, assemble_tokens(draft, acc, emitted), out.bad, out.bad_q)
'''),
    # The residual / bonus inverse CDF scanned in chunks of 2048 without the running sum.
    "chunk-icdf-no-carry": (_CHUNKED_ICDF, '''
    def verify(self, logits, draft, candidates, q, sampling, noise, check=True):
        out = super().verify(logits, draft, candidates, q, sampling, noise, check)
        r, rows, v = logits.shape
        g, acc = rows - 1, out.accept_len
        p = target_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
        p_row = p.gather(1, acc.view(r, 1, 1).expand(r, 1, v)).squeeze(1).double()  # [R, V]
        slot = acc.clamp(max=g - 1).view(r, 1, 1)
        q_dense = torch.zeros(r, v, dtype=torch.float64, device=logits.device)
        q_dense.scatter_add_(1, candidates.gather(1, slot.expand(-1, 1, candidates.shape[2]))
                             .squeeze(1), q.gather(1, slot.expand(-1, 1, q.shape[2]))
                             .squeeze(1).double())
        rejected = acc < g
        resid = (p_row - torch.where(rejected.view(r, 1), q_dense, 0.0)).clamp(min=0.0)
        w = torch.where(resid.sum(1, keepdim=True) <= 0, p_row, resid)
        u = torch.where(rejected, noise.residual.gather(1, slot.view(r, 1)).view(r), noise.bonus)
        real = out.tokens.gather(1, acc.view(-1, 1)).view(-1)
        emitted = torch.where(sampling.greedy | out.bad | out.bad_q, real,
                              _chunked_inverse_cdf(w, u))
        return VerifyOut(acc, assemble_tokens(draft, acc, emitted), out.bad, out.bad_q)
'''),
    # The conv's group index taken within a 128-channel tile: wrong for channels >= 128.
    "conv-tile-group": ('''
def _conv(x, base, delta, block_size):
    taps, gs = check_conv_args(x, base, delta, block_size)
    n, h = x.shape
    group = (torch.arange(h, device=x.device) % TILE) // gs                # should be c // gs
    w = base.to(x.dtype) + delta.to(x.dtype)[:, :, group]                   # [N, Tk, H]
    row = (torch.arange(n, device=x.device) % block_size).view(n, 1)
    out = torch.zeros_like(x)
    for t in range(taps):
        shifted = torch.cat([x.new_zeros(t, h), x[:n - t]]) if t else x
        out = out + torch.where(row >= t, w[:, t] * shifted, 0)
    return out
''', '''
    def conv_prepare(self, x, base, delta, block_size):
        return _conv(x, base, delta, block_size)

    def conv_finish(self, h, a, base, delta, block_size):
        return h + _conv(a, base, delta, block_size)
'''),
    # u·q < p decided in float32 instead of the exact float64 product.
    "accept-in-float32": ("", '''
    def verify(self, logits, draft, candidates, q, sampling, noise, check=True):'''
        + _SHAPES_OK + '''
        p = target_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
        p_d = p[:, :g].gather(-1, draft.unsqueeze(-1)).squeeze(-1)
        q_d = torch.where(candidates == draft.unsqueeze(-1), q.double(), 0.0).sum(-1)
        ok = (noise.accept.float() * q_d.float()) < p_d.float()
        coin = torch.where(ok, -1.0, torch.inf).to(noise.accept.dtype)       # forced decisions
        return super().verify(logits, draft, candidates, q, sampling,
                              BlockNoise(noise.walk, coin, noise.residual, noise.bonus), check)
'''),
    # Adaptive speculation that peeks: the step's block size is chosen from the
    # current step's own slot-0 acceptance coin — the whole block when it is small (< 1/2, the
    # draft will likely be accepted), else a target-only step (accept 0, the token drawn from
    # target row 0 with the bonus coin, as ops.verify.sample_next does).
    "schedule-peeks-accept": ("", '''
    def verify(self, logits, draft, candidates, q, sampling, noise, check=True):'''
        + _SHAPES_OK + '''
        out = super().verify(logits, draft, candidates, q, sampling, noise, check)
        short = ~sampling.greedy & (noise.accept[:, 0] >= 0.5)                 # the peek
        token, _ = ops_verify.sample_next(logits[:, 0], sampling, noise.bonus)
        acc = torch.where(short, 0, out.accept_len)
        emitted = torch.where(short, token,
                              out.tokens.gather(1, out.accept_len.view(-1, 1)).view(-1))
        return VerifyOut(acc, assemble_tokens(draft, acc, emitted), out.bad, out.bad_q)
'''),
    # Logit processors: a penalty applied to every verify row with the pre-block (committed) counts,
    # not the counts after d_1..d_j.
    "procs-pre-block-counts": (_PROCS_PRE_BLOCK, "    pass\n"),
    # Logit processors: row 0's processing (its change to the logits) added to every verify row.
    "procs-row0-everywhere": (_PROCS_ROW0, "    pass\n"),
    # Watermark: the residual / bonus draws keyed by the draft's subkey A.
    "wm-one-key": (_WM_ONE_KEY, "    pass\n"),
    # Watermark: the acceptance coin reuses the draft draw's keyed value.
    "wm-coin-reuses-draw": (_WM_COIN_FROM_DRAW, "    pass\n"),
    # Watermark: the keyed acceptance compares the coin with p(d) alone (q(d) left out).
    "wm-accept-ignores-q": ("import dataclasses\n" + _WM_ACCEPT_IGNORES_Q, "    pass\n"),
    # Constraints: every verify row masked with row 0's constraint state (the committed one).
    "constraint-row0-everywhere": (_CONSTRAINT_ROW0, "    pass\n"),
    # The acceptance coin is read from the walk stream (it differs from the accept stream).
    "walk-as-accept": ("", '''
    def verify(self, logits, draft, candidates, q, sampling, noise, check=True):
        noise = BlockNoise(noise.walk, noise.walk, noise.residual, noise.bonus)
        return super().verify(logits, draft, candidates, q, sampling, noise, check)
'''),
}


def source(mutant: str, name: str, dtypes: str) -> str:
    prelude, body = MUTANTS[mutant]
    probe, tdtypes = DTYPES[dtypes]
    return BASE.format(prelude=prelude, body=body, name=name, probe=probe, dtypes=tdtypes)


def install(root: Path, name: str, text: str) -> None:
    """A real distribution (dist-info + ``dflash2rt.backends`` entry point) on ``root``."""
    module = "fixture_" + name.replace("-", "_")
    (root / f"{module}.py").write_text(text)
    dist = root / f"{module}-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[dflash2rt.backends]\n{name} = {module}\n")
