"""``LLM``'s own logic against its documented contract, on a scripted engine and tokenizer: vLLM's
output shapes (ranks counted anew, sums in dyadic values), chat prompts rendered by hand, each
closed / missing-part check alone, the template cache and ``close``."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from dflash2rt import llm as llm_mod
from dflash2rt.engine.request import RequestOutput, SamplingParams
from dflash2rt.errors import DFlash2Error, InvalidInputError
from dflash2rt.watermark import WatermarkKey

TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
BOS = 1


def by_hand(messages, add_generation_prompt=True) -> str:
    text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
    return text + ("<assistant>" if add_generation_prompt else "")


class Tok:
    """Bytes as ids; a BOS id in front unless ``add_special_tokens=False``."""

    def encode(self, text, add_special_tokens=True):
        return ([BOS] if add_special_tokens else []) + list(text.encode())

    def decode(self, ids):
        return "".join(f"<{i}>" for i in ids)


class Engine:
    """Records each call; a request's output is its prompt's length, then 7."""

    def __init__(self):
        self.calls, self.closed = [], 0

    def generate(self, requests, **kw):
        self.calls.append(([(r.prompt_ids, r.params) for r in requests], kw))
        outs = [RequestOutput(tuple(r.prompt_ids), [len(r.prompt_ids), 7], f"t{i}", "length")
                for i, r in enumerate(requests)]
        return outs, ("stats", len(self.calls))

    def close(self):
        self.closed += 1


def bare(tokenizer=Tok(), source_dir=None, engine=None):
    """An ``LLM`` without a model: a scripted engine, a pair with ``tokenizer``."""
    m = llm_mod.LLM.__new__(llm_mod.LLM)
    m.backend = None
    m.engine = Engine() if engine is None else engine
    m.pair = SimpleNamespace(tokenizer=tokenizer, target=SimpleNamespace(source_dir=source_dir))
    m.last_stats, m._templates = None, {}
    return m


def ids(text):
    return list(text.encode())


# ---- _llm_output: vLLM's shapes ---------------------------------------------------------------

def rank_of(top, k):
    """1 for the most likely alternative: one more than the count of strictly likelier ones."""
    return 1 + sum(1 for v in top.values() if v > top[k])


def test_output_without_logprobs_is_vllms_shape():
    out = RequestOutput((4, 5, 6), [9, 8], "ab", "stop_string")
    for i, prompt, want in ((0, "hello", "hello"), (3, [4, 5, 6], None), (12, (4, 5, 6), None)):
        o = llm_mod._llm_output(i, prompt, out, Tok())
        assert (o.request_id, o.prompt, o.prompt_token_ids, o.finished) == \
            (str(i), want, [4, 5, 6], True)
        assert len(o.outputs) == 1
        c = o.outputs[0]
        assert (c.index, c.text, c.token_ids, c.finish_reason) == (0, "ab", [9, 8], "stop_string")
        assert c.logprobs is None and c.cumulative_logprob is None and c.finished() is True
    assert llm_mod.LLMOutput("0", None, [], []).finished is True     # the default


TOKENS = [5, 9, 2, 4]
LPS = [-0.5, -2.0, -0.25, -0.125]
TOPS = [{1: -3.0, 5: -0.5, 7: -1.5},             # the token second by insertion, first by value
        {3: -1.25, 7: -0.75, 1: -1.0},           # the token (9) is not among them
        {2: -0.25},
        {6: -0.0625, 4: -0.125, 8: -4.0}]        # the token second by value


@pytest.mark.parametrize("tokenizer", [Tok(), None])
def test_logprobs_entries_ranks_and_sum_against_counts(tokenizer):
    out = RequestOutput((3,), list(TOKENS), "x", "length", list(LPS), [dict(t) for t in TOPS])
    c = llm_mod._llm_output(0, [3], out, tokenizer).outputs[0]
    assert c.cumulative_logprob == -2.875 == sum(LPS)
    assert len(c.logprobs) == len(TOKENS)
    for t, lp, top, entry in zip(TOKENS, LPS, TOPS, c.logprobs):
        assert list(entry)[0] == t                                   # the token first
        assert set(entry) == {t} | set(top)
        assert entry[t].logprob == lp
        assert entry[t].rank == (rank_of(top, t) if t in top else None)
        for k in top:
            if k != t:
                assert (entry[k].logprob, entry[k].rank) == (top[k], rank_of(top, k))
        for k, e in entry.items():
            assert e.decoded_token == (None if tokenizer is None else f"<{k}>")
    # the ranks written out
    assert [{k: e.rank for k, e in entry.items()} for entry in c.logprobs] == [
        {5: 1, 1: 3, 7: 2}, {9: None, 3: 3, 7: 1, 1: 2}, {2: 1}, {4: 2, 6: 1, 8: 3}]


# ---- generate ---------------------------------------------------------------------------------

def test_generate_passes_each_argument_and_keeps_the_stats():
    m = bare()
    sp = [SamplingParams(max_tokens=3), SamplingParams(max_tokens=5, temperature=0.5, seed=2)]
    cb = []
    outs = m.generate(["ab", [7, 8, 9]], sp, block_size=4, spec=False, on_tokens=cb.append)
    (reqs, kw), = m.engine.calls
    assert [p for p, _ in reqs] == [tuple([BOS] + ids("ab")), (7, 8, 9)]
    assert [q for _, q in reqs] == sp
    assert kw == dict(spec=False, block_size=4, on_tokens=cb.append, watermark=None)
    assert m.last_stats == ("stats", 1)
    assert [o.prompt for o in outs] == ["ab", None] and [o.request_id for o in outs] == ["0", "1"]
    assert [o.outputs[0].token_ids for o in outs] == [[3, 7], [3, 7]]
    m.generate("abc")                                               # the defaults
    (reqs, kw) = m.engine.calls[1]
    assert reqs == [((BOS, 97, 98, 99), SamplingParams())]
    assert kw == dict(spec=True, block_size=None, on_tokens=None, watermark=None)
    assert m.last_stats == ("stats", 2)


def test_generate_takes_vllms_prompt_dicts_as_what_they_hold():
    m = bare()
    outs = m.generate([{"prompt": "ab"}, {"prompt_token_ids": [7, 8]}, "c"])
    (reqs, _), = m.engine.calls
    assert [p for p, _ in reqs] == [tuple([BOS] + ids("ab")), (7, 8), (BOS, 99)]
    assert [o.prompt for o in outs] == ["ab", None, "c"]
    assert [o.prompt_token_ids for o in outs] == [[BOS, 97, 98], [7, 8], [BOS, 99]]
    [one] = m.generate({"prompt": "xy"})                            # one dict: one prompt
    assert one.prompt == "xy" and m.engine.calls[1][0][0][0] == (BOS, 120, 121)
    with pytest.raises(InvalidInputError, match=r"prompt 0 is a dict with keys \['text'\]"):
        m.generate([{"text": "a"}])
    assert len(m.engine.calls) == 2


@pytest.mark.parametrize("part", ["engine", "pair", "both"])
def test_a_closed_llm_refuses_each_call_whichever_part_is_gone(part):
    m = bare()
    if part in ("engine", "both"):
        m.engine = None
    if part in ("pair", "both"):
        m.pair = None
    with pytest.raises(DFlash2Error, match="this LLM is closed"):
        m.generate(["a"])
    with pytest.raises(DFlash2Error, match="this LLM is closed"):
        m.chat([{"role": "user", "content": "x"}], chat_template=TEMPLATE)


def test_closed_pair_refuses_the_tokenizer_and_the_constraint():
    m = bare()
    m.pair = None
    assert m.tokenizer is None
    for call in (m.get_tokenizer, lambda: m.regex_constraint("a+")):
        with pytest.raises(DFlash2Error, match="this LLM is closed"):
            call()
    tok = Tok()
    assert bare(tok).tokenizer is tok and bare(tok).get_tokenizer() is tok


def test_close_closes_the_engine_once_and_exit_closes():
    eng = Engine()
    m = bare(engine=eng)
    m.close()
    m.close()
    assert eng.closed == 1 and m.engine is None and m.pair is None
    eng2 = Engine()
    with bare(engine=eng2) as m2:
        assert m2.engine is eng2
    assert eng2.closed == 1 and m2.engine is None


# ---- chat -------------------------------------------------------------------------------------

MSG = [{"role": "user", "content": "hi"}]


def prompts_sent(m, call=-1):
    return [list(p) for p, _ in m.engine.calls[call][0]]


def test_one_conversation_and_a_list_holding_one_are_both_one_prompt():
    for messages in (MSG, [MSG], (MSG,), [tuple(MSG)]):
        m = bare()
        outs = m.chat(messages, chat_template=TEMPLATE)
        assert len(outs) == 1 and outs[0].prompt == by_hand(MSG)
        assert prompts_sent(m) == [ids(by_hand(MSG))]               # no special tokens added
        assert outs[0].prompt_token_ids == ids(by_hand(MSG))
        assert m.engine.calls[-1][1] == dict(spec=True, block_size=None, on_tokens=None,
                                             watermark=None)


def test_many_conversations_in_order_with_their_params_and_the_generate_arguments():
    convs = [MSG, ({"role": "system", "content": "s"}, {"role": "user", "content": "q"}),
             [{"role": "user", "content": [{"type": "text", "text": "a"},
                                           {"type": "text", "text": "b"}]}]]
    joined = [MSG, list(convs[1]), [{"role": "user", "content": "ab"}]]
    texts = [by_hand(c) for c in joined]
    sps = [SamplingParams(max_tokens=k) for k in (1, 2, 3)]
    m = bare()
    key, cb = WatermarkKey(bytes(range(32))), [].append
    outs = m.chat(convs, sps, chat_template=TEMPLATE, block_size=8, spec=False, watermark=key,
                  on_tokens=cb)
    assert [o.prompt for o in outs] == texts and [o.request_id for o in outs] == ["0", "1", "2"]
    assert prompts_sent(m) == [ids(t) for t in texts]
    (reqs, kw), = m.engine.calls
    assert [q for _, q in reqs] == sps
    assert kw == dict(spec=False, block_size=8, on_tokens=cb, watermark=key)
    assert m.last_stats == ("stats", 1)
    m.chat(tuple(convs), chat_template=TEMPLATE, add_generation_prompt=False)
    assert prompts_sent(m) == [ids(by_hand(c, False)) for c in joined]


@pytest.mark.parametrize("value", ["yes", 1, 0, None, 1.0])
def test_add_generation_prompt_takes_booleans_only(value):
    m = bare()
    with pytest.raises(InvalidInputError, match="add_generation_prompt must be True or False"):
        m.chat(MSG, chat_template=TEMPLATE, add_generation_prompt=value)
    assert m.engine.calls == []


def test_errors_name_the_conversation_only_when_there_are_several():
    m = bare()
    bad = [{"role": "robot", "content": "x"}]
    with pytest.raises(InvalidInputError, match=r"^messages\[0\]\.role"):
        m.chat(bad, chat_template=TEMPLATE)
    with pytest.raises(InvalidInputError, match=r"^conversation 0: messages\[0\]\.role"):
        m.chat([bad], chat_template=TEMPLATE)
    with pytest.raises(InvalidInputError, match=r"^conversation 1: messages\[0\]\.role"):
        m.chat([MSG, bad], chat_template=TEMPLATE)
    empty = "{% if false %}x{% endif %}"
    with pytest.raises(InvalidInputError, match="^the chat template rendered the messages to no"):
        m.chat(MSG, chat_template=empty)
    with pytest.raises(InvalidInputError, match="^conversation 0: the chat template rendered"):
        m.chat([MSG, MSG], chat_template=empty)
    one = "{% if messages[0].content == 'hi' %}{% else %}x{% endif %}"   # hi renders nothing
    with pytest.raises(InvalidInputError, match="^conversation 1: the chat template rendered"):
        m.chat([[{"role": "user", "content": "a"}], MSG], chat_template=one)
    assert m.chat([{"role": "user", "content": "a"}], chat_template=one)[0].prompt == "x"
    assert len(m.engine.calls) == 1


def test_the_template_given_found_or_missing_and_the_tokenizer_missing(tmp_path):
    cfg = {"chat_template": TEMPLATE.replace("<assistant>", "<bot>"), "bos_token": "<s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    m = bare(source_dir=str(tmp_path))
    assert m.chat(MSG)[0].prompt == by_hand(MSG, False) + "<bot>"     # the model's own
    assert m.chat(MSG, chat_template=TEMPLATE)[0].prompt == by_hand(MSG)
    assert m.chat(MSG, chat_template="{{ bos_token }}!")[0].prompt == "<s>!"
    with pytest.raises(InvalidInputError, match="this model has no chat template"):
        bare(source_dir=None).chat(MSG)
    assert bare(source_dir=None).chat(MSG, chat_template=TEMPLATE)[0].prompt == by_hand(MSG)
    for given in (3, b"{{ x }}", ["{{ x }}"]):
        with pytest.raises(InvalidInputError, match="chat_template must be a template or a"):
            m.chat(MSG, chat_template=given)
    with pytest.raises(InvalidInputError, match="this model has no tokenizer"):
        bare(tokenizer=None).chat(MSG, chat_template=TEMPLATE)


def test_templates_compile_once_per_source(monkeypatch):
    from dflash2rt.serve import chat as chat_mod

    made = []
    real = chat_mod.ChatTemplate

    def counting(source, specials):
        made.append(source)
        return real(source, specials)

    monkeypatch.setattr(chat_mod, "ChatTemplate", counting)
    m = bare()
    other = TEMPLATE + "."
    for t in (TEMPLATE, TEMPLATE, other, TEMPLATE, other):
        assert m.chat(MSG, chat_template=t)[0].prompt == by_hand(MSG) + ("." if t == other else "")
    assert made == [TEMPLATE, other]
