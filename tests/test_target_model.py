"""Float64 parity of the native target model with transformers: prefill, decode, block verify, taps."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="HF parity tests need transformers (installed by the dev extra)")

from _hf_tiny import CASES, hf_run, load_hf_oracle, write_checkpoint  # noqa: E402

from dflash2rt.models.hf_loader import load_target  # noqa: E402
from dflash2rt.models.kv_cache import KVCache  # noqa: E402
from dflash2rt.models.target import TargetModel  # noqa: E402

TOL = 1e-10  # float64 on both sides; only summation order differs
PROMPT_LENS = (7, 1, 5)  # ragged, includes a single-token prompt
MAX_LEN = 32
F64 = torch.float64


@pytest.fixture(scope="module", params=sorted(CASES))
def checkpoint(request, tmp_path_factory):
    return request.param, write_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def pair(checkpoint):
    case, path = checkpoint
    layers = CASES[case][1]["num_hidden_layers"]
    taps = (layers - 1, 0)  # unordered on purpose; the last layer's output is pre-final-norm
    model, cfg = load_target(path, dtype=F64, tap_layer_ids=taps)
    return model, load_hf_oracle(path), cfg


def _prompts(seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 97, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _close(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} vs {tuple(ref.shape)}"
    assert ours.dtype == ref.dtype == F64, f"{what}: dtype {ours.dtype} vs {ref.dtype}"
    err = (ours - ref).abs().max().item() if ours.numel() else 0.0
    assert err <= TOL, f"{what}: max |ours - HF| = {err:.3e} > {TOL:g}"


def _check_taps(model: TargetModel, taps: torch.Tensor, hidden: tuple[torch.Tensor, ...], what: str) -> None:
    """Tap of layer l == HF hidden_states[l + 1]; for the last layer HF reports it after the final norm."""
    last = model.cfg.num_hidden_layers - 1
    for i, layer in enumerate(model.tap_layer_ids):
        tap = taps[:, i]
        if layer == last:
            _close(model.final_norm(tap), hidden[layer + 1], f"{what} final_norm(tap {layer})")
        else:
            _close(tap, hidden[layer + 1], f"{what} tap {layer}")


def _prefill(model: TargetModel, prompts: list[list[int]]):
    r, t = len(prompts), max(map(len, prompts))
    ids = torch.zeros(r, t, dtype=torch.int64)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p)
    counts = torch.tensor([len(p) for p in prompts])  # right padding past each prompt
    cache = KVCache.empty(model.cfg.num_hidden_layers, r, MAX_LEN, model.cfg.num_key_value_heads,
                          model.cfg.head_dim, F64, "cpu")
    lens = torch.zeros(r, dtype=torch.int64)
    positions = torch.arange(t).expand(r, t).contiguous()
    out = model(ids, positions, cache, lens)         # writes every row's K/V; commit = new lens
    return out, cache, lens + counts


def _scribble_past(cache: KVCache, lens: torch.Tensor, seed: int) -> None:
    """Large finite garbage in every cache row at or past a request's length: rows there are
    scratch (padding, rejected drafts) and must never be read."""
    g = torch.Generator().manual_seed(seed)
    for buf in (*cache.k, *cache.v):
        past = torch.arange(buf.shape[1])[None, :] >= lens[:, None]          # [R, max_len]
        junk = torch.randn(buf.shape, generator=g, dtype=buf.dtype) * 1e3
        buf.copy_(torch.where(past[..., None, None], junk, buf))


@torch.no_grad()
def test_rope_inv_freq_bit_identical(pair):
    model, hf, _ = pair
    assert torch.equal(model.rope_inv_freq, hf.model.rotary_emb.inv_freq.float())
    assert model.attention_scaling == hf.model.rotary_emb.attention_scaling


@torch.no_grad()
def test_prefill_ragged_batch(pair):
    model, hf, _ = pair
    prompts = _prompts()
    out, _, _ = _prefill(model, prompts)
    for r, p in enumerate(prompts):
        logits, hidden = hf_run(hf, p)
        _close(out.logits[r, : len(p)], logits, f"prefill request {r}")
        _check_taps(model, out.taps[r, : len(p)], hidden, f"prefill request {r}")


@torch.no_grad()
def test_logits_at_gives_exactly_the_selected_rows(pair):
    """Prefill asks for the last prompt row's logits only; they equal that row of the full run
    (to rounding: a 1-row and a T-row matmul may block their sums differently)."""
    model, _, _ = pair
    prompts = _prompts()
    full, _, _ = _prefill(model, prompts)
    r, t = len(prompts), max(map(len, prompts))
    ids = torch.zeros(r, t, dtype=torch.int64)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p)
    counts = torch.tensor([len(p) for p in prompts])
    cache = KVCache.empty(model.cfg.num_hidden_layers, r, MAX_LEN, model.cfg.num_key_value_heads,
                          model.cfg.head_dim, F64, "cpu")
    out = model(ids, torch.arange(t).expand(r, t).contiguous(), cache,
                torch.zeros(r, dtype=torch.int64), logits_at=counts - 1)
    assert out.logits.shape == (r, 1, model.cfg.vocab_size)
    for i, n in enumerate(counts.tolist()):
        torch.testing.assert_close(out.logits[i, 0], full.logits[i, n - 1], rtol=0, atol=1e-12)
    assert torch.equal(out.taps, full.taps)


@torch.no_grad()
def test_full_forward_hides_invalid_rows_before_valid_ones(pair):
    """The cache-free forward (training): left padding — `valid`, not causality, must hide the
    padded rows; the result equals HF on the unpadded prompt."""
    model, hf, cfg = pair
    prompt = _prompts()[0]
    pad, n = 4, len(prompt)
    ids = torch.tensor([[0] * pad + prompt])  # [1, pad + n]
    valid = torch.arange(pad + n)[None, :] >= pad
    positions = (torch.arange(pad + n) - pad).clamp(min=0)[None, :]
    out = model.forward_full(ids, positions, valid)
    logits, hidden = hf_run(hf, prompt)
    _close(out.logits[0, pad:], logits, "left-padded prompt")
    _check_taps(model, out.taps[0, pad:], hidden, "left-padded prompt")


@torch.no_grad()
def test_decode_one_token_at_a_time(pair):
    model, hf, _ = pair
    seqs = _prompts()
    _, cache, lens = _prefill(model, seqs)
    g = torch.Generator().manual_seed(2)
    for step in range(4):
        tok = torch.randint(0, 97, (len(seqs), 1), generator=g)  # [R, 1]
        ctx = max(map(len, seqs)) if step % 2 else None  # a host bound on lens must not change results
        _scribble_past(cache, lens, step)
        out = model(tok, lens[:, None], cache, lens, ctx_len=ctx)
        for r in range(len(seqs)):
            seqs[r].append(int(tok[r, 0]))
            logits, hidden = hf_run(hf, seqs[r])
            _close(out.logits[r], logits[-1:], f"decode step {step} request {r}")
            _check_taps(model, out.taps[r], tuple(h[-1:] for h in hidden), f"decode step {step} request {r}")
        lens = lens + 1


@torch.no_grad()
def test_block_verify_then_partial_commit(pair):
    model, hf, _ = pair
    seqs = _prompts()
    _, cache, lens = _prefill(model, seqs)
    g = torch.Generator().manual_seed(3)
    t = 5
    block = torch.randint(0, 97, (len(seqs), t), generator=g)  # [R, T]
    valid = torch.arange(t)[None, :] < torch.tensor([[5], [3], [5]])  # request 1 padded after 3 rows
    out = model(block, lens[:, None] + torch.arange(t), cache, lens)
    for r, seq in enumerate(seqs):
        n = int(valid[r].sum())
        logits, hidden = hf_run(hf, seq + block[r, :n].tolist())
        _close(out.logits[r, :n], logits[-n:], f"verify request {r}")
        _check_taps(model, out.taps[r, :n], tuple(h[-n:] for h in hidden), f"verify request {r}")
    # Accept 2, 3 and 0 rows (committing is advancing the lengths): the rejected rows' K/V stay
    # in the cache past the new lengths and must leave no trace in the next forward.
    counts = torch.tensor([2, 3, 0])
    lens = lens + counts
    nxt = torch.randint(0, 97, (len(seqs), 1), generator=g)
    out = model(nxt, lens[:, None], cache, lens)
    for r, seq in enumerate(seqs):
        logits, _ = hf_run(hf, seq + block[r, : int(counts[r])].tolist() + [int(nxt[r, 0])])
        _close(out.logits[r], logits[-1:], f"after partial commit request {r}")


@torch.no_grad()
def test_float32_follows_unpatched_hf(checkpoint):
    """In float32 both sides keep the same float32 islands (norms, rope angles, softmax); only the
    attention kernels' summation order differs, so 1e-5 on logits of magnitude ~5 is generous."""
    import transformers

    _, path = checkpoint
    model, cfg = load_target(path, dtype=torch.float32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").float().eval()
    ids = torch.tensor([_prompts()[0] * 3])  # [1, 21]
    cache = KVCache.empty(cfg.num_hidden_layers, 1, MAX_LEN, cfg.num_key_value_heads, cfg.head_dim,
                          torch.float32, "cpu")
    out = model(ids, torch.arange(ids.shape[1])[None], cache, torch.zeros(1, dtype=torch.int64))
    err = (out.logits - hf(input_ids=ids).logits).abs().max().item()
    assert err <= 1e-5, f"float32 logits differ from HF eager by {err:.3e}"


@torch.no_grad()
def test_forward_never_reads_tensor_values_on_host(pair, monkeypatch):
    """No .item()/.tolist()/bool()/int() on tensors: the hot path must not sync device -> host."""
    model, _, _ = pair
    prompts = _prompts()
    r = len(prompts)
    cache = KVCache.empty(model.cfg.num_hidden_layers, r, MAX_LEN, model.cfg.num_key_value_heads,
                          model.cfg.head_dim, F64, "cpu")
    ids = torch.zeros(r, 5, dtype=torch.int64)
    lens = torch.tensor([3, 0, 9])

    def sync(*args, **kwargs):
        raise AssertionError("device->host sync on the hot path")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, sync)
    model(ids, lens[:, None] + torch.arange(5), cache, lens)
    model(ids, lens[:, None] + torch.arange(5), cache, lens, ctx_len=9)
