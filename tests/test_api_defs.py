"""``run``'s argument checks and result assembly against its docstring written anew, over a
scripted model pair, engine and decode: the SamplingParams it builds, each conflict alone, the
prompt and ``sampling_params`` domains edge by edge, metrics labels, tables shared per pair."""

from __future__ import annotations

import inspect
import re
import types

import numpy as np
import pytest
import torch

from dflash2rt import api
from dflash2rt import prompts as prompts_mod
from dflash2rt.engine.request import SamplingParams
from dflash2rt.engine.stats import RunStats
from dflash2rt.errors import ConflictingArgumentsError, InvalidInputError
from dflash2rt.watermark import WatermarkKey

from stub_constraint import Hook


class Tok:
    """Characters as token ids."""

    eos_token_ids = ()

    def encode(self, s):
        return [ord(c) for c in s]


def _pair(tokenizer=True, name="tiny"):
    return types.SimpleNamespace(tokenizer=Tok() if tokenizer else None, name=name,
                                 target=object(), draft=None)


class Script:
    """Stands in for resolve_model, Engine, generate_requests and write_metrics; records."""

    def __init__(self, monkeypatch, pair=None) -> None:
        self.pair = pair or _pair()
        self.resolved, self.engines, self.decodes, self.metrics = [], [], [], []
        self.stats = RunStats(mode="spec", backend="be-name", device="cpu", block_size=4)
        self.backend = types.SimpleNamespace(device="cpu")
        script = self

        class Engine:
            def __init__(self, pair, be, table=None):
                script.engines.append((pair, be, table))
                self.table, self.policy, self.step_check = table, "own policy", "unset"
                script.engine = self

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        def resolve(model, device, dtype, **kw):
            self.resolved.append((model, device, dtype, kw))
            return self.pair

        def decode(engine, prompt_ids, params, **kw):
            assert engine is self.engine
            self.decodes.append((prompt_ids, params, kw))
            outs = [types.SimpleNamespace(text="".join(map(chr, p))[::-1], token_ids=list(p))
                    for p in prompt_ids]
            return outs, self.stats

        monkeypatch.setattr(api, "resolve_model", resolve)
        monkeypatch.setattr(api, "Engine", Engine)
        monkeypatch.setattr(api, "generate_requests", decode)
        monkeypatch.setattr(api, "measured_table", lambda pair, dev: ("table", dev))
        monkeypatch.setattr(api, "backend_of", lambda b: self.backend)
        monkeypatch.setattr(api, "write_metrics",
                            lambda stats, path, labels: self.metrics.append((stats, path, labels)))


@pytest.fixture
def script(monkeypatch):
    return Script(monkeypatch)


# each sampling keyword of run, a value other than its default, and the SamplingParams field
KEYWORDS = [("max_new_tokens", 7, "max_new_tokens", 7), ("temperature", 0.5, "temperature", 0.5),
            ("top_p", 0.5, "top_p", 0.5), ("top_k", 3, "top_k", 3), ("seed", 9, "seed", 9),
            ("stop", "ab", "stop_strings", ("ab",)), ("stop", ["a", "b"], "stop_strings",
                                                        ("a", "b")),
            ("stop_token_ids", [5], "stop_token_ids", (5,)),
            ("include_stop_str_in_output", True, "include_stop_str_in_output", True),
            ("repetition_penalty", 1.5, "repetition_penalty", 1.5),
            ("frequency_penalty", 0.5, "frequency_penalty", 0.5),
            ("presence_penalty", 0.5, "presence_penalty", 0.5), ("min_p", 0.1, "min_p", 0.1),
            ("logit_bias", {3: 1.0}, "logit_bias", {3: 1.0}), ("logprobs", 2, "logprobs", 2),
            ("logprobs_mode", "processed", "logprobs_mode", "processed"),
            ("num_candidates", 2, "num_candidates", 2),
            ("verification", "block", "verification", "block")]


def test_no_keyword_gives_the_default_sampling_params_for_every_prompt(script):
    res = api.run("m", "be", prompts=["ab", [7, 8, 9]])
    (ids, params, kw), = script.decodes
    assert ids == [(97, 98), (7, 8, 9)] and params == [SamplingParams()] * 2
    assert params[0].logit_bias == {} and params[0].stop_strings == ()
    assert kw == dict(spec=True, block_size=None, on_tokens=None, watermark=None)
    assert res.texts == ["ba", "\t\x08\x07"] and res.tokens == [[97, 98], [7, 8, 9]]
    assert res.stats is script.stats and [o.token_ids for o in res.outputs] == res.tokens
    assert script.metrics == []
    assert script.engines == [(script.pair, script.backend, ("table", "cpu"))]
    assert script.resolved == [("m", "cpu", "auto", dict(draft=None, revision=None,
                                                         draft_revision=None))]


@pytest.mark.parametrize("kw, field, value", [(k[:2], k[2], k[3]) for k in KEYWORDS],
                         ids=[f"{k[0]}-{i}" for i, k in enumerate(KEYWORDS)])
def test_each_sampling_keyword_alone_sets_its_field(script, kw, field, value):
    api.run(prompts=["a"], **{kw[0]: kw[1]})
    (_, (params,), _), = script.decodes
    assert params == SamplingParams(**{field: value})
    assert getattr(params, field) == value


def test_the_constraint_keyword_sets_the_constraint(script):
    hook = Hook()
    api.run(prompts=["a", "b"], constraint=hook)
    (_, params, _), = script.decodes
    assert [p.constraint for p in params] == [hook, hook]


@pytest.mark.parametrize("name", sorted({k[0] for k in KEYWORDS} | {"constraint"}))
def test_any_sampling_keyword_with_sampling_params_is_a_conflict_even_at_its_default(
        script, name):
    defaults = {"max_new_tokens": 64, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0,
                "stop": (), "stop_token_ids": (), "include_stop_str_in_output": False,
                "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                "min_p": 0.0, "logit_bias": None, "logprobs": None, "logprobs_mode": "raw",
                "constraint": None, "num_candidates": None, "verification": "token"}
    with pytest.raises(ConflictingArgumentsError, match=rf": {name} given with sampling_"):
        api.run(prompts=["a"], sampling_params=SamplingParams(), **{name: defaults[name]})
    assert script.resolved == [] and script.decodes == []


def test_a_conflict_names_every_keyword_given_in_the_signatures_order(script):
    with pytest.raises(ConflictingArgumentsError, match=r": max_new_tokens, stop, logprobs given"):
        api.run(prompts=["a"], logprobs=1, stop="x", max_new_tokens=3,
                sampling_params=[SamplingParams()])


def test_sampling_params_are_used_as_given(script):
    a, b = SamplingParams(seed=1), SamplingParams(seed=2)
    api.run(prompts=["a", "b"], sampling_params=[a, b])
    api.run(prompts=["a", "b", "c"], sampling_params=a)
    api.run(prompts=["a"], sampling_params=(b,))
    got = [d[1] for d in script.decodes]
    assert [[id(p) for p in g] for g in got] == [[id(a), id(b)], [id(a)] * 3, [id(b)]]


def test_run_passes_its_decode_options_and_the_resolve_arguments(script):
    def on_tokens(i, toks):
        return None
    key = WatermarkKey(bytes(range(32)))
    api.run("m", prompts=[[1]], spec=False, block_size=3, on_tokens=on_tokens, watermark=key,
            draft="d", revision="r", draft_revision="dr", dtype="float32")
    (_, _, kw), = script.decodes
    assert kw == dict(spec=False, block_size=3, on_tokens=on_tokens, watermark=key)
    assert script.resolved == [("m", "cpu", "float32", dict(draft="d", revision="r",
                                                            draft_revision="dr"))]


def test_regex_and_constraint_together_are_refused(script, monkeypatch):
    monkeypatch.setattr(api, "regex_constraint", lambda pair, regex: Hook())
    with pytest.raises(InvalidInputError, match="give regex or constraint, not both"):
        api.run(prompts=["a"], regex="a+", constraint=Hook())
    assert script.decodes == []


def test_regex_constrains_every_request(script, monkeypatch):
    auto = Hook()
    made = []
    monkeypatch.setattr(api, "regex_constraint", lambda pair, rx: made.append((pair, rx)) or auto)
    api.run(prompts=["a", "b"], regex="a+", seed=3)
    (_, params, _), = script.decodes
    assert made == [(script.pair, "a+")]
    assert params == [SamplingParams(seed=3, constraint=auto)] * 2
    assert all(p.constraint is auto for p in params)
    api.run(prompts=["a"], max_new_tokens=2)                    # no regex: no constraint
    assert script.decodes[1][1][0].constraint is None


def test_regex_needs_a_tokenizer():
    pair = types.SimpleNamespace(tokenizer=None)
    with pytest.raises(InvalidInputError, match="regex needs a tokenizer"):
        api.regex_constraint(pair, "a")


def test_metrics_are_written_with_the_models_and_the_backends_names(script, tmp_path):
    api.run(prompts=["a"], metrics=tmp_path / "run.prom")
    (stats, path, labels), = script.metrics
    assert stats is script.stats and path == tmp_path / "run.prom"
    assert labels == {"model_name": "tiny", "backend": "be-name"}
    script.pair.name = ""
    api.run(prompts=["a"], metrics=str(tmp_path / "b.prom"))
    assert script.metrics[1][1:] == (tmp_path / "b.prom", {"backend": "be-name"})


def test_a_bad_metrics_path_is_refused_before_the_model_is_resolved(script, tmp_path):
    with pytest.raises(InvalidInputError, match="is a directory"):
        api.run(prompts=["a"], metrics=tmp_path)
    assert script.resolved == []


@pytest.mark.parametrize("tp", [0, -1, 1.0, 2.5, True, False, "1", None])
def test_tp_must_be_a_positive_integer(tp, script):
    with pytest.raises(InvalidInputError, match=f"tp must be a positive integer, got {tp!r}"):
        api.run(prompts=["a"], tp=tp)
    assert script.resolved == []


def test_tp_one_runs_here_and_more_ranks_go_to_the_tensor_parallel_path(script, monkeypatch):
    sent = []
    monkeypatch.setattr(api, "_run_tp", lambda a: sent.append(a) or "tp result")
    assert api.run(prompts=["a"], tp=1).tokens == [[97]] and sent == []
    assert api.run(prompts=["a"], tp=np.int64(1)).tokens == [[97]] and sent == []
    assert api.run(prompts=["a"], tp=2) == "tp result" and sent[0]["tp"] == 2
    assert sent[0]["tp_check"] is False and sent[0]["prompts"] == ["a"]
    assert api.run(prompts=["a"], tp=np.int32(3), tp_check=True) == "tp result"
    assert sent[1]["tp_check"] is True and len(script.decodes) == 2


def _enc(prompts, tokenizer=True):
    return prompts_mod.encode_prompts(_pair(tokenizer), prompts)


def test_prompts_encode_as_the_docstring_says():
    assert _enc("ab") == [(97, 98)]
    assert _enc(["a", [1, 2], (3,), np.array([4, 5]), torch.tensor([6])]) == \
        [(97,), (1, 2), (3,), (4, 5), (6,)]
    assert _enc(("x",)) == [(120,)]
    assert _enc([[np.int64(7), 8]]) == [(7, 8)] and type(_enc([[np.int64(7)]])[0][0]) is int
    assert _enc([[]]) == [()]
    assert _enc([[1]], tokenizer=False) == [(1,)]


@pytest.mark.parametrize("prompts, match", [
    ([], "no prompts given"),
    ((), "no prompts given"),
    (None, "prompts must be a string or a list"),
    (5, "prompts must be a string or a list"),
    ({"a"}, "prompts must be a string or a list"),
    (b"ab", "prompts must be a string or a list"),
    (["a", 5], "prompt 1 is int 5"),
    (["a", b"ab"], "prompt 1 is bytes"),
    ([[1], [2, 2.0]], "prompt 1: token ids must be integers, got 2.0"),
    ([[True]], "prompt 0: token ids must be integers, got True"),
    ([[1, "2"]], "prompt 0: token ids must be integers, got '2'"),
    (["a", ""], "prompt 1 is empty"),
    (["ok", "x\ud800"], r"prompt 1 is not valid Unicode text \(surrogates not allowed at "
                        r"position 1"),
])
def test_each_bad_prompt_is_refused_alone(prompts, match):
    with pytest.raises(InvalidInputError, match=match):
        _enc(prompts)


def test_vllm_prompt_dicts_encode_as_what_they_hold():
    assert _enc({"prompt": "ab"}) == [(97, 98)]
    assert _enc({"prompt_token_ids": [5, 6]}) == [(5, 6)]
    assert _enc(["a", {"prompt": "b"}, {"prompt_token_ids": (1,)}, [2]]) == \
        [(97,), (98,), (1,), (2,)]
    assert _enc([{"prompt_token_ids": [1]}], tokenizer=False) == [(1,)]
    assert prompts_mod.prompt_list({"prompt": "x"}) == ["x"]
    assert prompts_mod.prompt_list(["y", {"prompt_token_ids": [3]}, [4]]) == ["y", [3], [4]]


@pytest.mark.parametrize("prompt, shown", [
    ({}, "[]"), ({"prompt": "a", "prompt_token_ids": [1]}, "['prompt', 'prompt_token_ids']"),
    ({"prompt": "a", "multi_modal_data": {}}, "['multi_modal_data', 'prompt']"),
    ({"text": "a"}, "['text']"), ({"prompt": 5}, "['prompt']"),
    ({"prompt": ["a"]}, "['prompt']"), ({"prompt_token_ids": "12"}, "['prompt_token_ids']"),
    ({"prompt_token_ids": None}, "['prompt_token_ids']"), ({1: "a"}, "['1']"),
])
def test_a_bad_prompt_dict_is_refused_naming_its_keys(prompt, shown):
    with pytest.raises(InvalidInputError, match=re.escape(f"prompt 1 is a dict with keys {shown}")):
        _enc(["a", prompt])
    with pytest.raises(InvalidInputError, match="'prompt' .* or 'prompt_token_ids'"):
        _enc(prompt)


def test_prompt_dicts_are_checked_as_the_prompts_they_hold():
    with pytest.raises(InvalidInputError, match="prompt 0 is empty"):
        _enc({"prompt": ""})
    with pytest.raises(InvalidInputError, match="prompt 1: token ids must be integers, got 'x'"):
        _enc(["a", {"prompt_token_ids": ["x"]}])


def test_text_prompts_need_a_tokenizer():
    with pytest.raises(InvalidInputError, match="text prompts need a tokenizer"):
        _enc(["a"], tokenizer=False)


def test_params_list_domain():
    a, b = SamplingParams(seed=1), SamplingParams(seed=2)
    assert api.params_list(None, 3) == [SamplingParams()] * 3
    assert api.params_list(a, 2) == [a, a] and api.params_list(a, 1)[0] is a
    assert api.params_list((a, b), 2) == [a, b] and api.params_list([b], 1) == [b]
    assert isinstance(api.params_list((a,), 1), list)
    with pytest.raises(InvalidInputError, match="sampling_params has 1 entries for 2 prompts:"):
        api.params_list([a], 2)
    with pytest.raises(InvalidInputError, match="sampling_params has 2 entries for 1 prompt:"):
        api.params_list([a, b], 1)
    with pytest.raises(InvalidInputError, match="sampling_params has 3 entries for 2 prompts"):
        api.params_list([a, b, a], 2)
    with pytest.raises(InvalidInputError, match=r"sampling_params\[1\] is dict, not a"):
        api.params_list([a, {}, 3], 3)
    with pytest.raises(InvalidInputError, match=r"sampling_params\[0\] is int"):
        api.params_list([3], 1)
    for bad in ({"seed": 1}, "a", iter([a])):
        with pytest.raises(InvalidInputError, match="sampling_params must be a dflash2rt"):
            api.params_list(bad, 1)


def test_constrained_keeps_shared_params_shared_and_names_the_first_five_clashes():
    a, b = SamplingParams(seed=1), SamplingParams(seed=2)
    auto = Hook()
    got = api._constrained([a, b, a, b, b], auto)
    assert got == [SamplingParams(seed=s, constraint=auto) for s in (1, 2, 1, 2, 2)]
    assert got[0] is got[2] and got[1] is got[3] is got[4] and got[0] is not got[1]
    assert a.constraint is None
    own = SamplingParams(constraint=Hook())
    params = [a, own, a] + [own] * 6
    with pytest.raises(ConflictingArgumentsError,
                       match=r"sampling_params \[1, 3, 4, 5, 6\] carry a constraint"):
        api._constrained(params, auto)
    with pytest.raises(ConflictingArgumentsError, match=r"sampling_params \[0\] carry"):
        api._constrained([own], auto)


def test_the_measured_table_is_shared_per_target_draft_and_device(monkeypatch):
    monkeypatch.setattr(api, "_TABLES", api.weakref.WeakKeyDictionary())
    t, d, d2 = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    pair = types.SimpleNamespace(target=t, draft=d)
    one = api.measured_table(pair, "cpu")
    assert api.measured_table(types.SimpleNamespace(target=t, draft=d), "cpu") is one
    assert api.measured_table(pair, torch.device("cpu")) is one
    assert api.measured_table(pair, "cuda:0") is not one
    other = api.measured_table(types.SimpleNamespace(target=t, draft=d2), "cpu")
    alone = api.measured_table(types.SimpleNamespace(target=t, draft=None), "cpu")
    assert len({id(one), id(other), id(alone)}) == 3
    assert api.measured_table(types.SimpleNamespace(target=t, draft=None), "cpu") is alone
    assert api.measured_table(types.SimpleNamespace(target=d, draft=d), "cpu") is not one


def test_watermark_keys(tmp_path):
    key = WatermarkKey(bytes(range(32)))
    assert api.watermark_key(None) is None and api.watermark_key(key) is key
    path = tmp_path / "k.key"
    key.save(path)
    for given in (path, str(path)):
        assert api.watermark_key(given)._secret == key._secret
    for bad in (b"raw", 3, bytes(range(32))):
        with pytest.raises(InvalidInputError, match="watermark must be a WatermarkKey or the "
                                                    f"path of a key file, got "
                                                    f"{type(bad).__name__}"):
            api.watermark_key(bad)


def _out(logprobs=None, top=None, reason="length"):
    return types.SimpleNamespace(finish_reason=reason, logprobs=logprobs, top_logprobs=top)


def test_as_dict_without_logprobs_has_no_logprob_keys():
    stats = types.SimpleNamespace(as_dict=lambda: {"tau": 1.0})
    res = api.RunResult(["a", "b"], [[1], [2]], stats, [_out(), _out(reason="stop_token")])
    assert res.as_dict() == {"texts": ["a", "b"], "tokens": [[1], [2]], "stats": {"tau": 1.0},
                             "finish_reasons": ["length", "stop_token"]}


def test_as_dict_with_logprobs_in_any_output_writes_them_for_every_output():
    stats = types.SimpleNamespace(as_dict=lambda: {})
    outs = [_out(), _out([-0.5, -1.0], [{3: -0.5, 10: -2.0}, {4: -1.0}]), _out([-0.25])]
    d = api.RunResult(["", "", ""], [[], [3, 4], [5]], stats, outs).as_dict()
    assert d["logprobs"] == [None, [-0.5, -1.0], [-0.25]]
    assert d["top_logprobs"] == [None, [{"3": -0.5, "10": -2.0}, {"4": -1.0}], None]
    assert d["finish_reasons"] == ["length"] * 3


def test_a_default_reads_as_its_value():
    assert repr(api._Default(64)) == "64" and repr(api._Default("raw")) == "'raw'"
    assert repr(api._Default(())) == "()"


def test_backend_of_returns_a_backend_object_as_is():
    from dflash2rt import get_backend

    b = get_backend("cpu")
    assert api.backend_of(b) is b


def test_generate_requests_makes_one_request_per_prompt_in_order():
    seen = []
    engine = types.SimpleNamespace(generate=lambda reqs, **kw: seen.append((reqs, kw)) or "r")
    a, b = SamplingParams(seed=1), SamplingParams(seed=2)
    assert api.generate_requests(engine, [(1, 2), (3,)], [a, b], spec=False) == "r"
    (reqs, kw), = seen
    assert [(r.prompt_ids, r.params) for r in reqs] == [((1, 2), a), ((3,), b)]
    assert kw == {"spec": False}


@pytest.fixture
def tp_script(monkeypatch):
    """_run_tp's collaborators scripted: env_world, the shardability check, spawn, _run."""
    from dflash2rt.distributed import group, launch, rank_setup

    log = {"world": None, "checked": [], "spawned": [], "ran": []}
    monkeypatch.setattr(group, "env_world", lambda: log["world"])
    monkeypatch.setattr(rank_setup, "check_model_shardable", lambda a: log["checked"].append(a))
    monkeypatch.setattr(launch, "spawn",
                        lambda fn, tp, args: log["spawned"].append((fn, tp, args)) or "spawned")
    monkeypatch.setattr(api, "_run", lambda a, group=None: log["ran"].append((a, group)) or "ran")
    return log


def test_a_tp_run_spawns_its_ranks_with_picklable_arguments(tp_script):
    from dflash2rt import get_backend

    a = {"tp": 2, "backend": get_backend("cpu"), "on_tokens": None}
    assert api._run_tp(a) == "spawned"
    (fn, tp, (sent,)), = tp_script["spawned"]
    assert fn is api._run_spawned and tp == 2 and sent == {**a, "backend": "cpu"}
    assert tp_script["checked"] == [a] and tp_script["ran"] == []
    b = {"tp": 3, "backend": "cpu"}
    api._run_tp(b)
    assert tp_script["spawned"][1][2] == (b,)
    with pytest.raises(InvalidInputError, match="tp=2 spawns processes, which need picklable"):
        api._run_tp({"tp": 2, "backend": None, "on_tokens": lambda i, t: None})
    assert len(tp_script["spawned"]) == 2


def test_a_tp_run_inside_a_launched_group_runs_as_its_rank(tp_script):
    tp_script["world"] = (0, 2, 0)
    a = {"tp": 2, "backend": "cpu", "on_tokens": lambda i, t: None}
    assert api._run_tp(a) == "ran"
    assert tp_script["ran"] == [(a, 2)] and tp_script["spawned"] == [] == tp_script["checked"]
    assert api._run_spawned(a) == "ran" and tp_script["ran"][1] == (a, 2)


@pytest.mark.parametrize("is_main, check, draft", [(True, False, True), (True, True, True),
                                                   (False, False, True), (True, False, False)])
def test_a_ranks_run_sets_rank_zeros_policy_and_the_step_check(script, monkeypatch, is_main,
                                                               check, draft):
    from dflash2rt.distributed import consensus, rank_setup

    group = types.SimpleNamespace(is_main=is_main, check=check, world=2, backend="gloo")
    if draft:
        script.pair.draft = types.SimpleNamespace(cfg=types.SimpleNamespace(block_size=8))
    setups, rank_be = [], types.SimpleNamespace(device="cuda:1")

    def setup(a, be):
        setups.append((a["tp"], be))
        return rank_be, group, script.pair
    monkeypatch.setattr(rank_setup, "rank_setup", setup)
    monkeypatch.setattr(rank_setup, "heads_line", lambda pair, g: f"heads of {g.world}")
    monkeypatch.setattr(consensus, "RankZero", lambda g: ("rank zero", g))
    monkeypatch.setattr(consensus, "StepCheck", lambda g: ("step check", g))
    monkeypatch.setattr(api.AdaptivePolicy, "measured",
                        classmethod(lambda cls, block, table, agree: (block, table, agree)))

    def on_tokens(i, toks):
        return None
    a = {n: p.default for n, p in inspect.signature(api.run).parameters.items()}
    a.update(prompts=["ab"], backend="cpu", on_tokens=on_tokens, tp=2)
    res = api._run(a, group="2 ranks")
    assert setups == [(2, script.backend)] and script.resolved == []
    assert script.engines == [(script.pair, rank_be, ("table", "cuda:1"))]
    engine = script.engine
    assert engine.policy == ((8, ("table", "cuda:1"), ("rank zero", group)) if draft else
                             "own policy")
    assert engine.step_check == (("step check", group) if check else None)
    (_, _, kw), = script.decodes
    assert kw["on_tokens"] is (on_tokens if is_main else None)
    if not is_main:
        assert res is None
        return
    assert res.tokens == [[97, 98]]
    assert res.stats.tensor_parallel == (
        "tp=2 over gloo (target sharded by query head: heads of 2; vocabulary-parallel LM head; "
        "draft replicated" + ("; step hash check on" if check else "") + ")")
