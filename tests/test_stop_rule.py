"""One stop-string rule everywhere: the text ends where the earliest stop string starts (ties:
the shortest), whatever order the strings are given in, the same in the API's text, the CLI's
streamed stdout and the tests' reference; ``include_stop_str_in_output`` keeps it; stops are
matched on the text as it reads after the prompt (a SentencePiece "▁x" token is " x" there)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dflash2rt
from dflash2rt.engine.request import SamplingParams
from dflash2rt.errors import SamplingParamsError
from dflash2rt.models.tokenizer import TextTokenizer

from test_stops import A, CA, EOS, VOCAB
from tiny_models import oracle_pair


def _tokenizer(words: dict[int, str], metaspace: bool = False) -> TextTokenizer:
    from tokenizers import Tokenizer, decoders, models

    vocab = [f"w{i}" for i in range(VOCAB)]
    for i, w in words.items():
        vocab[i] = w
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(vocab)}, unk_token="w0"))
    tok.decoder = decoders.Metaspace() if metaspace else decoders.Fuse()
    return TextTokenizer(tok, eos_token_ids=(EOS,), bos_token_id=None)


@pytest.fixture(scope="module")
def pair():
    p = oracle_pair(4, dtype=torch.float32)
    p.tokenizer = _tokenizer({CA[0]: "x", CA[1]: "abc", CA[2]: "d"})
    return p


@pytest.mark.parametrize("stops", [("bc", "ab"), ("ab", "bc"), ("abc", "b", "ab")])
def test_overlapping_stops_cut_at_the_earliest_whatever_their_order(pair, stops):
    res = dflash2rt.run(pair, "cpu", prompts=[list(A)], max_new_tokens=6, stop=stops,
                        block_size=4)
    assert res.texts == ["x"] and res.outputs[0].finish_reason == "stop_string"
    assert res.tokens == [[CA[0], CA[1]]]          # the token that completed the stop is kept
    kept = dflash2rt.run(pair, "cpu", prompts=[list(A)], max_new_tokens=6, stop=stops,
                         block_size=4, include_stop_str_in_output=True)
    assert kept.texts == ["xab"] and kept.tokens == res.tokens


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(text=st.text("abc", max_size=12),
       stops=st.lists(st.text("abc", min_size=1, max_size=3), min_size=1, max_size=4),
       include=st.booleans())
def test_the_cut_is_the_earliest_start_and_the_shortest_there(text, stops, include):
    """stop_cut against a scan of every position of the text."""
    from dflash2rt.engine.request import stop_cut

    want = None
    for k in range(len(text)):
        here = [s for s in stops if text.startswith(s, k)]
        if here:
            want = k + (min(map(len, here)) if include else 0)
            break
    assert stop_cut(text, stops, include) == want
    assert stop_cut(text, stops[::-1], include) == want            # whatever the order


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(tokens=st.lists(st.integers(0, 5), max_size=10), stop_ids=st.sets(st.integers(0, 5)),
       eos=st.sets(st.integers(0, 5), max_size=2), ignore_eos=st.booleans(),
       limit=st.integers(1, 8))
def test_a_stop_token_ends_the_output_before_the_length_does(tokens, stop_ids, eos,
                                                             ignore_eos, limit):
    """stop_at against a token-by-token scan: the first stop token (EOS unless ignored)
    within the limit ends the output without it; else the limit, once reached."""
    from dflash2rt.engine.request import stop_at

    params = SamplingParams(max_new_tokens=limit, stop_token_ids=tuple(sorted(stop_ids)),
                            ignore_eos=ignore_eos)
    stops = stop_ids | (set() if ignore_eos else eos)
    want = None
    for i, t in enumerate(tokens):
        if i == limit:
            want = (limit, "length")
            break
        if t in stops:
            want = (i, "stop_token")
            break
    else:
        if len(tokens) >= limit:
            want = (limit, "length")
    assert stop_at(tokens, params, tuple(eos)) == want


def test_the_rule_itself():
    from dflash2rt.engine.request import stop_cut

    assert stop_cut("xabc", ("bc", "ab")) == 1 and stop_cut("xabc", ("bc", "ab"), True) == 3
    assert stop_cut("xabc", ("abc", "ab"), True) == 3            # a tie: the shortest
    assert stop_cut("xabc", ("zz",)) is None and stop_cut("", ("a",)) is None
    with pytest.raises(SamplingParamsError, match="include_stop_str_in_output"):
        SamplingParams(include_stop_str_in_output=1)


@pytest.mark.parametrize("include", [False, True])
def test_cli_streaming_prints_exactly_the_api_text(pair, capsys, include):
    """The CLI's hold-back streams prompt + the API's text and nothing after it, fed the
    committed tokens one step at a time (the second step completes both stops at once)."""
    from dflash2rt.cli.run_progress import Progress

    res = dflash2rt.run(pair, "cpu", prompts=[list(A)], max_new_tokens=6, stop=("bc", "ab"),
                        block_size=4, include_stop_str_in_output=include)
    prog = Progress(pair.tokenizer, True, lambda: "P:", ["bc", "ab"], lambda: list(A), include)
    prog(0, [CA[0]])
    prog(0, [CA[1]])
    prog.finish(res.texts[0])
    assert capsys.readouterr().out == "P:" + res.texts[0] + "\n"


def test_stops_match_the_text_after_the_prompt():
    """With a SentencePiece decoder a "▁x" token reads "x" alone but " x" after the prompt:
    the stop " x" ends the request at that token, and the text is what follows the prompt."""
    from dflash2rt.engine.output import output_text

    tok = _tokenizer({CA[0]: "▁x", CA[1]: "▁y", A[-1]: "▁p"}, metaspace=True)
    assert tok.decode([CA[0]]) == "x" and output_text(tok, [A[-1]], [CA[0]]) == " x"
    p = oracle_pair(4, dtype=torch.float32)
    p.tokenizer = tok
    res = dflash2rt.run(p, "cpu", prompts=[list(A)], max_new_tokens=6, stop=(" x",),
                        block_size=4, include_stop_str_in_output=True)
    assert res.tokens == [[CA[0]]] and res.texts == [" x"]
    free = dflash2rt.run(p, "cpu", prompts=[list(A)], max_new_tokens=2, block_size=4)
    assert free.texts == [" x y"]
