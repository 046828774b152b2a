"""Stops cut an accepted run exactly where target-only decoding stops, on every backend.

The oracle pair accepts every greedy draft (block 8: the prefill's token, then 8 tokens a
step), so its known chain puts each stop at a chosen offset of an accepted block. One batch of
32 requests with mixed stops: a stop id at every offset of the first accepted block and into
the second, max_new_tokens inside a block and at its edges, a stop id just past
max_new_tokens, stop strings inside a token, across token and block boundaries, completed at
max_new_tokens or one past it, a stop string over byte-fallback tokens (a prefix's text is not
a prefix of the full text: "\\ufffd" becomes "é"), EOS and ignore_eos. Token ids, text and
finish reason must equal target-only decoding and a token-at-a-time reference."""

from __future__ import annotations

import pytest
import torch

from dflash2rt import get_backend
from dflash2rt.backend import TorchOpsBackend
from dflash2rt.engine.engine import Engine
from dflash2rt.engine.request import Request, SamplingParams
from dflash2rt.models.tokenizer import TextTokenizer

from backends import available
from fake_graphs import Rerun
from tiny_models import fixed_policy, oracle_pair, successor

VOCAB, EOS, BLOCK, N = 29, 12, 8, 30
A, B = (1, 2), (1,)                   # prompts in the two 14-cycles of x → 5x + 3 (mod 29)


def chain(prompt, n=N):
    out = [successor(prompt[-1], VOCAB)]
    while len(out) < n:
        out.append(successor(out[-1], VOCAB))
    return out


CA, CB = chain(A), chain(B)
assert EOS in CB[:7] and EOS not in CA


def tokenizer() -> TextTokenizer:
    """Two characters a token ("n0"), but tokens CA[3], CA[4] are the UTF-8 bytes of "é"
    (byte fallback: alone, CA[3] decodes to "\\ufffd")."""
    from tokenizers import Tokenizer, decoders, models

    words = [chr(97 + i % 26) + str(i // 26) for i in range(VOCAB)]
    words[CA[3]], words[CA[4]] = "<0xC3>", "<0xA9>"
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="a0"))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    return TextTokenizer(tok, eos_token_ids=(EOS,), bos_token_id=None)


TOK = tokenizer()


def _word(t):
    return TOK.decode([t])


def cases() -> list[tuple[str, tuple[int, ...], SamplingParams]]:
    p = lambda **kw: SamplingParams(**{"max_new_tokens": N, **kw})      # noqa: E731
    out = [(f"stop id at {i}", A, p(stop_token_ids=(CA[i],))) for i in range(14)]
    out += [(f"max_new {m}", A, p(max_new_tokens=m)) for m in (1, 5, 8, 9, 12)]
    out += [("stop id just past max_new", A, p(max_new_tokens=5, stop_token_ids=(CA[5],))),
            ("stop id on the last token", A, p(max_new_tokens=9, stop_token_ids=(CA[8],))),
            ("string across blocks", A, p(stop_strings=(_word(CA[8])[1] + _word(CA[9])[0],))),
            ("string over 3 tokens", A,
             p(stop_strings=(_word(CA[5])[1] + _word(CA[6]) + _word(CA[7])[0],))),
            ("string in a token", A, p(stop_strings=(_word(CA[10]),))),
            ("string on a partial byte", A, p(stop_strings=("\ufffd",))),
            ("string on a completed byte", A, p(stop_strings=("é",))),
            ("string at max_new", A, p(max_new_tokens=11, stop_strings=(_word(CA[10])[0],))),
            ("string past max_new", A, p(max_new_tokens=10, stop_strings=(_word(CA[10]),))),
            ("string before stop id", A, p(stop_token_ids=(CA[12],),
                                           stop_strings=("zz", _word(CA[11])[0]))),
            ("string never met", A, p(stop_strings=("zz",))),
            ("eos", B, p()),
            ("ignore_eos", B, p(max_new_tokens=13, ignore_eos=True))]
    assert len(out) == 32                                  # the largest graph bucket
    return out


# What the cases must show (token ids kept, finish reason), from the chain by hand.
EXPECTED = {"stop id just past max_new": (5, "length"), "stop id on the last token": (8, "stop_token"),
            "string across blocks": (10, "stop_string"), "string over 3 tokens": (8, "stop_string"),
            "string in a token": (11, "stop_string"),
            "string on a partial byte": (4, "stop_string"),
            "string on a completed byte": (5, "stop_string"),
            "string at max_new": (11, "stop_string"), "string past max_new": (10, "length"),
            "string before stop id": (12, "stop_string"), "string never met": (N, "length"), "eos": (CB.index(EOS), "stop_token"),
            "ignore_eos": (13, "length")}


def reference(tokens, params: SamplingParams, eos=(EOS,)) -> tuple[list[int], str, str]:
    """Target-only decoding's stop rule, one token at a time: (token ids, text, reason)."""
    stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos))
    kept: list[int] = []
    for t in tokens:
        if t in stops:
            return kept, TOK.decode(kept), "stop_token"
        kept.append(t)
        text = TOK.decode(kept)
        hits = [text.index(s) for s in params.stop_strings if s in text]
        if hits:
            return kept, text[:min(hits)], "stop_string"
        if len(kept) == params.max_new_tokens:
            return kept, text, "length"
    raise AssertionError("the reference needs a longer free run")


def backend(name: str):
    if name == "graphs":
        be = TorchOpsBackend("cpu-graphs", "cpu", (torch.float32, torch.float64))
        be.graph_adapter = Rerun()
        return be
    return available(name)


@pytest.fixture(scope="module")
def pair():
    p = oracle_pair(BLOCK, dtype=torch.float32)
    p.tokenizer = TOK
    return p


def _outputs(outs):
    return [(o.token_ids, o.text, o.finish_reason) for o in outs]


def _requests(temperature=0.0, free=False):
    """The cases as requests; ``free``: without stops (ignore_eos, max_new_tokens N)."""
    reqs = []
    for i, (_, prompt, params) in enumerate(cases()):
        if free:
            params = SamplingParams(max_new_tokens=N, ignore_eos=True)
        reqs.append(Request(prompt, SamplingParams(**{**params.__dict__,
                                                      "temperature": temperature, "seed": 7}),
                            key=i))
    return reqs


def test_the_cases_stop_where_intended():
    for name, prompt, params in cases():
        ids, _, reason = reference(CA if prompt == A else CB, params)
        if name.startswith("stop id at "):
            assert (len(ids), reason) == (int(name.split()[-1]), "stop_token"), name
        elif name.startswith("max_new "):
            assert (len(ids), reason) == (int(name.split()[-1]), "length"), name
        else:
            assert (len(ids), reason) == EXPECTED[name], name


@pytest.mark.parametrize("name", ["cpu", "cpu-nofp64", pytest.param("triton-interpret", marks=pytest.mark.slow),
                                  "graphs"])
def test_greedy_spec_cuts_exactly_like_target_only(pair, name):
    """The triton interpreter runs the speculative decode only (its 30 target-only steps take
    minutes there): the target-only cut is host code, the same on every backend."""
    engine = Engine(pair, backend(name))
    spec, stats = engine.generate(_requests(), block_size=BLOCK)
    want = [reference(CA if q.prompt_ids == A else CB, q.params) for q in _requests()]
    if name != "triton-interpret":
        target, _ = engine.generate(_requests(), spec=False)
        assert _outputs(target) == want
    assert _outputs(spec) == want
    assert stats.accept_hist[BLOCK - 1] > 0 and stats.steps <= 4     # whole blocks accepted


def test_adaptive_greedy_cuts_exactly_like_target_only(pair):
    engine = Engine(pair, get_backend("cpu"))
    engine.policy = fixed_policy(BLOCK)          # not the machine's timings: large blocks
    spec, stats = engine.generate(_requests())
    assert stats.adaptive and max(stats.block_sizes) >= BLOCK   # 2 x BLOCK is a candidate too
    assert _outputs(spec) == [reference(CA if q.prompt_ids == A else CB, q.params)
                              for q in _requests()]


@pytest.mark.parametrize("name", ["cpu", "graphs"])
def test_sampled_stops_cut_the_free_run(pair, name):
    """T = 1, fixed block: a request's tokens do not depend on its stops or its batch, so each
    stopped output is the stop-free run cut by the token-at-a-time rule."""
    engine = Engine(pair, backend(name))
    for spec in (True, False):
        free, _ = engine.generate(_requests(1.0, free=True), block_size=BLOCK, spec=spec)
        got, _ = engine.generate(_requests(1.0), block_size=BLOCK, spec=spec)
        want = [reference(f.token_ids, q.params) for f, q in zip(free, _requests(1.0))]
        assert _outputs(got) == want
        assert len({tuple(f.token_ids) for f in free[:30]}) > 1
