"""The server's options, refused by name before any model loads: a batch, context or queue that
is not a count, a KV budget that is not a positive number of GiB, an empty served name, an empty
API key (read as no key, it would leave the server open), a drain timeout that is not a number
of seconds."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from dflash2rt.cli import main  # noqa: E402
from dflash2rt.errors import InvalidInputError  # noqa: E402
from dflash2rt.serve import check_drain_timeout, check_options  # noqa: E402

GOOD = dict(max_num_seqs=16, max_model_len=None, max_queue=256, kv_cache_gib=None,
            served_model_name=None, api_key=None, stream_interval=1)


def test_the_defaults_and_edges_pass():
    check_options(**GOOD)
    check_options(**{**GOOD, "max_num_seqs": 1, "max_model_len": 2, "max_queue": 0,
                     "kv_cache_gib": 1e-9, "served_model_name": ["a", "b"], "api_key": "k",
                     "stream_interval": 1})
    check_options(**{**GOOD, "kv_cache_gib": 3, "served_model_name": ("x",)})
    for t in (0, 0.0, 30, 1e9):
        check_drain_timeout(t)


@pytest.mark.parametrize("name, value, match", [
    ("max_num_seqs", 0, "max_num_seqs must be an integer >= 1"),
    ("max_num_seqs", 2.5, "max_num_seqs must be an integer >= 1"),
    ("max_num_seqs", True, "max_num_seqs must be an integer >= 1"),
    ("max_model_len", 1, "max_model_len must be an integer >= 2"),
    ("max_model_len", 64.0, "max_model_len must be an integer >= 2"),
    ("max_queue", -1, "max_queue must be an integer >= 0"),
    ("max_queue", "8", "max_queue must be an integer >= 0"),
    ("stream_interval", 0, "stream_interval must be an integer >= 1"),
    ("stream_interval", 1.5, "stream_interval must be an integer >= 1"),
    ("kv_cache_gib", 0, "kv_cache_gib must be a number of GiB > 0"),
    ("kv_cache_gib", -1.0, "kv_cache_gib must be a number of GiB > 0"),
    ("kv_cache_gib", math.nan, "kv_cache_gib must be a number of GiB > 0"),
    ("kv_cache_gib", math.inf, "kv_cache_gib must be a number of GiB > 0"),
    ("kv_cache_gib", "1", "kv_cache_gib must be a number of GiB > 0"),
    ("served_model_name", [], "served_model_name must be a list of non-empty names"),
    ("served_model_name", [""], "served_model_name must be a list of non-empty names"),
    ("served_model_name", ["a", "  "], "served_model_name must be a list of non-empty names"),
    ("served_model_name", "name", "served_model_name must be a list of non-empty names"),
    ("served_model_name", [3], "served_model_name must be a list of non-empty names"),
    ("api_key", "", "api_key must be a non-empty string"),
    ("api_key", "   ", "api_key must be a non-empty string"),
    ("api_key", 123, "api_key must be a non-empty string"),
])
def test_each_bad_option_alone(name, value, match):
    with pytest.raises(InvalidInputError, match=match):
        check_options(**{**GOOD, name: value})


@pytest.mark.parametrize("t", [-1, -1e-9, math.nan, math.inf, "30", None, True])
def test_drain_timeout(t):
    with pytest.raises(InvalidInputError, match="drain_timeout must be a number of seconds"):
        check_drain_timeout(t)


@pytest.mark.parametrize("flags, match", [
    (["--api-key", ""], "api_key must be a non-empty string"),
    (["--served-model-name", ""], "served_model_name must be a list of non-empty names"),
    (["--kv-cache-gib", "nan"], "kv_cache_gib must be a number of GiB > 0"),
    (["--kv-cache-gib", "inf"], "kv_cache_gib must be a number of GiB > 0"),
    (["--kv-cache-gib", "-2"], "kv_cache_gib must be a number of GiB > 0"),
    (["--max-num-seqs", "0"], "max_num_seqs must be an integer >= 1"),
    (["--max-queue", "-1"], "max_queue must be an integer >= 0"),
    (["--drain-timeout", "-1"], "drain_timeout must be a number of seconds >= 0"),
    (["--drain-timeout", "nan"], "drain_timeout must be a number of seconds >= 0"),
])
def test_the_cli_refuses_before_loading_a_model(flags, match, monkeypatch, capsys):
    from dflash2rt import api

    def no_load(*a, **k):
        raise AssertionError("a model was loaded for options that should have been refused")
    monkeypatch.setattr(api, "resolve_model", no_load)
    assert main(["serve", "--port", "0", *flags]) == 2
    err = capsys.readouterr().err
    assert "InvalidInputError" in err and match in err


def test_an_unset_or_empty_environment_key_means_no_key(monkeypatch):
    """$DFLASH2RT_API_KEY empty is unset (as a shell's ``export K=``); only the flag given as an
    empty string is refused."""
    from dflash2rt import serve

    seen = {}

    def build(model, backend, **kw):
        seen.update(kw)
        raise InvalidInputError("stop here")
    monkeypatch.setattr(serve, "build_server", build)
    for env, flags, want in (("", [], None), ("k1", [], "k1"), ("k1", ["--api-key", "k2"], "k2")):
        monkeypatch.setenv("DFLASH2RT_API_KEY", env)
        assert main(["serve", "--port", "0", *flags]) == 2
        assert seen["api_key"] == want, (env, flags)
