"""The server soak's client side over stand-ins (httpx's MockTransport for the server, a
scripted random source, a fake clock): the request mix and its thresholds, the checks of a
completed answer, what one request adds to the counts for each kind of answer (malformed,
plain, streamed, left mid-stream), and ``soak``'s totals, time limit, resident-memory samples
and the drain it waits for at the end; every expected value and message written out here."""

from __future__ import annotations

import asyncio
import io
import json
import os
import types

import httpx
import pytest

from dflash2rt.serve import soak as soak_mod

from fake_clock import Clock

NS = types.SimpleNamespace
MAX_TOKENS = [1, 2, 5, 12, 24, 48]
TEMPERATURES = [0.5, 0.8, 1.0]
PROMPTS = ["def add(a, b):", "import os\n", "class Stack:\n", "for i in range(10):",
           "# parse the arguments\n", "with open(path) as f:", "x = [", "return self."]
EXTRAS = [{}, {"top_k": 20}, {"top_p": 0.9}, {"min_p": 0.1}, {"presence_penalty": 0.5},
          {"repetition_penalty": 1.3}, {"stop": ["\n"]}, {"logit_bias": {"5": -10}},
          {"structured_outputs": {"regex": "[a-z ]{1,30}"}}]


class Script:
    """A ``random.Random`` stand-in: ``random()`` gives the listed numbers in turn,
    ``choice(seq)`` the item at the next listed index (what it was offered is kept),
    ``randrange(n)`` 4242."""

    def __init__(self, randoms: list[float], picks: list[int]) -> None:
        self.randoms, self.picks, self.offered, self.ranges = list(randoms), list(picks), [], []

    def random(self) -> float:
        return self.randoms.pop(0)

    def choice(self, seq):
        self.offered.append(list(seq))
        return seq[self.picks.pop(0)]

    def randrange(self, n: int) -> int:
        self.ranges.append(n)
        return 4242

    def used_up(self) -> bool:
        return not self.randoms and not self.picks


# ---- the request mix ------------------------------------------------------------------------

def test_a_plain_completion_sampled_with_a_regex_and_logprobs():
    rng = Script([0.5, 0.25, 0.1], [3, 0, 1, 8])
    assert soak_mod._request(rng, chat=False) == {
        "max_tokens": 12, "stream": False, "prompt": "def add(a, b):", "temperature": 0.8,
        "seed": 4242, "structured_outputs": {"regex": "[a-z ]{1,30}"}, "logprobs": 2}
    assert rng.offered == [MAX_TOKENS, PROMPTS, TEMPERATURES, EXTRAS]
    assert rng.ranges == [10 ** 6] and rng.used_up()


def test_a_streamed_greedy_chat_with_its_usage():
    rng = Script([0.49, 0.5, 0.2, 0.0], [0, 7, 0])
    assert soak_mod._request(rng, chat=True) == {
        "max_tokens": 1, "stream": True,
        "messages": [{"role": "user", "content": "return self."}], "temperature": 0,
        "stream_options": {"include_usage": True}}
    assert rng.offered == [MAX_TOKENS, PROMPTS, EXTRAS] and rng.used_up()


def test_a_streamed_chat_with_logprobs_and_no_usage():
    rng = Script([0.0, 0.9, 0.19, 0.5], [5, 2, 2])
    assert soak_mod._request(rng, chat=True) == {
        "max_tokens": 48, "stream": True,
        "messages": [{"role": "user", "content": "class Stack:\n"}], "temperature": 0,
        "top_p": 0.9, "logprobs": True, "top_logprobs": 2}
    assert rng.used_up()


# ---- the checks of a completed answer -------------------------------------------------------

def _answer(text, finish="length", tokens: int | None = 3, chat: bool = False) -> dict:
    choice = {"message": {"content": text}} if chat else {"text": text}
    return {"choices": [{**choice, "finish_reason": finish}],
            "usage": None if tokens is None else {"completion_tokens": tokens}}


@pytest.mark.parametrize("text, finish, tokens, chat", [
    ("ok", "length", 3, False), ("", "stop", 0, False), ("ok", "stop", 1, True),
    ("ok", "length", None, False)])
def test_a_good_answer_passes(text, finish, tokens, chat):
    assert soak_mod._check({"max_tokens": 3}, _answer(text, finish, tokens, chat), chat) is None


def test_a_bad_answer_says_what_is_wrong():
    check = soak_mod._check
    bad = _answer(None)
    assert check({"max_tokens": 3}, bad, False) == f"bad choice {bad['choices'][0]!r}"
    bad = _answer("x" * 300, finish="abort")
    assert check({"max_tokens": 3}, bad, False) == f"bad choice {bad['choices'][0]!r}"[:211]
    assert check({"max_tokens": 3}, _answer("ok", finish=None, chat=True), True) == \
        "bad choice {'message': {'content': 'ok'}, 'finish_reason': None}"
    assert check({"max_tokens": 3}, _answer(3), False) == \
        "bad choice {'text': 3, 'finish_reason': 'length'}"
    for tokens in (4, -1):
        assert check({"max_tokens": 3}, _answer("ok", tokens=tokens), False) == \
            f"usage {{'completion_tokens': {tokens}}} beyond max_tokens 3"


@pytest.mark.parametrize("text, ok", [
    ("", True), ("abc def", True), ("a" * 30, True), ("a" * 31, False), ("ABC", False),
    ("ab1", False)])
def test_a_regex_answer_is_a_prefix_of_a_match(text, ok):
    body = {"max_tokens": 48, "structured_outputs": {"regex": "[a-z ]{1,30}"}}
    got = soak_mod._check(body, _answer(text), False)
    assert got == (None if ok else f"{text!r} breaks the regex [a-z ]{{1,30}}")
    assert soak_mod._check({"max_tokens": 48}, _answer(text), False) is None


# ---- one request ----------------------------------------------------------------------------

def _events(*chunks) -> bytes:
    return b"".join(b"data: " + (c if isinstance(c, bytes) else json.dumps(c).encode())
                    + b"\n\n" for c in chunks)


def _chunk(text: str | None, finish=None, tokens: int | None = None) -> dict:
    return {"choices": [] if text is None else [{"text": text, "finish_reason": finish}],
            "usage": None if tokens is None else {"completion_tokens": tokens}}


GOOD_STREAM = _events(_chunk("a"), _chunk("b", "length"), _chunk(None, tokens=2), b"[DONE]")


class Pulled:
    """A streamed body handed over one event at a time: ``pulled`` counts those read."""

    def __init__(self, body: bytes) -> None:
        self.parts, self.pulled = [p + b"\n\n" for p in body.split(b"\n\n") if p], 0

    async def __aiter__(self):
        for p in self.parts:
            self.pulled += 1
            yield p


def one(rng: Script, status: int = 200, content=b"", chat: bool = False) -> tuple:
    """``_one`` against a server answering ``status`` with ``content`` → (stats, requests
    seen as (method, path, body))."""
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.content))
        return httpx.Response(status, content=content)
    stats = {"completed": 0, "cancelled": 0, "malformed": 0, "failures": []}

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            await soak_mod._one(client, "http://srv/v1", rng, "m", chat, stats)
    asyncio.run(go())
    assert rng.used_up()
    return stats, seen


def _counts(stats: dict) -> tuple:
    return stats["completed"], stats["cancelled"], stats["malformed"], stats["failures"]


@pytest.mark.parametrize("status, body, ok", [
    (400, {"error": {"message": "bad"}}, True), (499, {"error": {"message": "bad"}}, True),
    (422, {"error": {"message": "bad", "type": "x"}}, True),
    (500, {"error": {"message": "bad"}}, False), (200, {"error": {"message": "bad"}}, False),
    (399, {"error": {"message": "bad"}}, False), (400, {"error": {"code": 1}}, False),
    (400, {"detail": "bad"}, False)])
def test_a_malformed_request_wants_a_4xx_in_openais_error_shape(status, body, ok):
    text = json.dumps(body)
    stats, seen = one(Script([0.05], [4]), status, text.encode())
    assert seen == [("POST", "/v1/completions", soak_mod.MALFORMED[4])]
    assert _counts(stats) == (0, 0, 1, [] if ok else [f"malformed → {status} {text}"])


def test_a_malformed_requests_failure_keeps_200_characters_of_the_answer():
    text = json.dumps({"error": {"message": "x" * 300}})
    stats, _ = one(Script([0.0], [0]), 500, text.encode())
    assert stats["failures"] == [f"malformed → 500 {text[:200]}"]


def test_a_plain_completion_is_checked():
    # kind 0.1: a well-formed request; not streamed, greedy, no extra, no logprobs
    rng = lambda: Script([0.1, 0.5, 0.5, 0.5], [3, 0, 0])      # noqa: E731
    want = {"model": "m", "max_tokens": 12, "stream": False, "prompt": "def add(a, b):",
            "temperature": 0}
    stats, seen = one(rng(), 200, json.dumps(_answer("ab", tokens=12)).encode())
    assert _counts(stats) == (1, 0, 0, [])
    ((method, path, body),) = seen
    assert (method, path, json.loads(body)) == ("POST", "/v1/completions", want)
    stats, _ = one(rng(), 200, json.dumps(_answer("ab", tokens=13)).encode())
    assert _counts(stats) == (0, 0, 0, ["usage {'completion_tokens': 13} beyond max_tokens 12"])
    stats, _ = one(rng(), 503, b"x" * 300)
    assert _counts(stats) == (0, 0, 0, ["503: " + "x" * 200])


def test_a_plain_chat_goes_to_chat_completions():
    stats, seen = one(Script([0.3, 0.5, 0.5, 0.5], [3, 1, 0]), 200,
                      json.dumps(_answer("ab", tokens=2, chat=True)).encode(), chat=True)
    assert _counts(stats) == (1, 0, 0, [])
    assert seen[0][1] == "/v1/chat/completions"
    assert json.loads(seen[0][2])["messages"] == [{"role": "user", "content": "import os\n"}]


def _streamed(kind: float, usage: bool = True) -> Script:
    """A streamed greedy request for 2 tokens, its usage asked for or not."""
    return Script([kind, 0.0, 0.5, 0.5, 0.0 if usage else 0.5], [1, 0, 0])


def test_a_streamed_completion_ends_in_done_with_its_usage():
    stats, seen = one(_streamed(0.25), 200, GOOD_STREAM)      # 0.25: the client stays
    assert _counts(stats) == (1, 0, 0, [])
    assert json.loads(seen[0][2])["stream_options"] == {"include_usage": True}
    over = _events(_chunk("a"), _chunk("b", "length"), _chunk(None, tokens=3), b"[DONE]")
    stats, _ = one(_streamed(0.5), 200, over)
    assert stats["failures"] == ["usage {'completion_tokens': 3} beyond max_tokens 2"]
    empty = _events(_chunk("", "stop"), _chunk(None, tokens=0), b"[DONE]")
    stats, _ = one(_streamed(0.5), 200, empty)             # no token at all: still an answer
    assert _counts(stats) == (1, 0, 0, [])
    no_usage = _events(_chunk("a"), _chunk("b", "stop"), b"[DONE]")
    stats, _ = one(_streamed(0.5, usage=False), 200, no_usage)
    assert _counts(stats) == (1, 0, 0, [])


def test_a_streamed_answer_that_ends_badly_is_a_failure():
    cut = _events(_chunk("a"), _chunk("b"), _chunk("c", "length"))
    stats, _ = one(_streamed(0.5), 200, cut)
    last = json.dumps(_chunk("c", "length"))
    assert _counts(stats) == (0, 0, 0, [f"stream ended without [DONE]: {last!r}"[:229]])
    open_ended = _events(_chunk("a"), _chunk("b"), _chunk(None, tokens=2), b"[DONE]")
    stats, _ = one(_streamed(0.5), 200, open_ended)
    assert stats["failures"] == [f"stream ended with {_chunk('b')!r}"]
    stats, _ = one(_streamed(0.5), 429, b"y" * 300)
    assert _counts(stats) == (0, 0, 0, ["429: " + repr(b"y" * 200)])


def test_a_client_that_leaves_mid_stream_reads_two_events():
    body = Pulled(GOOD_STREAM)
    stats, _ = one(_streamed(0.2), 200, body)
    assert _counts(stats) == (0, 1, 0, []) and body.pulled == 2
    body = Pulled(GOOD_STREAM)
    stats, _ = one(_streamed(0.25), 200, body)                 # from 0.25 it stays
    assert _counts(stats) == (1, 0, 0, []) and body.pulled == 4


# ---- the soak -------------------------------------------------------------------------------

class Server:
    """A well-behaved server: malformed bodies get a 400 in OpenAI's shape, the rest their
    ``max_tokens`` of "a" (a prefix of any regex here), streamed when asked; /metrics reports
    the listed (running, waiting) pairs in turn, the last one from then on. ``raise_exc``:
    what every POST raises instead. Each POST moves the fake clock on one second."""

    def __init__(self, drain=((0.0, 0.0),), raise_exc: Exception | None = None) -> None:
        self.drain, self.raise_exc, self.posts, self.metrics = list(drain), raise_exc, [], 0
        self.clock = Clock(1000.0)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            assert request.url.path == "/metrics"
            running, waiting = self.drain[min(self.metrics, len(self.drain) - 1)]
            self.metrics += 1
            return httpx.Response(200, text=(
                "# HELP dflash2rt:num_requests_running x\n"
                f'dflash2rt:num_requests_running{{model_name="m 1"}} {running}\n'
                f'dflash2rt:num_requests_waiting{{model_name="m"}} {waiting}\n'
                "dflash2rt:num_requests_swapped 7.0\n"))
        self.clock.now += 1.0
        self.posts.append((request.url.path, request.content))
        if self.raise_exc is not None:
            raise self.raise_exc
        if request.content in soak_mod.MALFORMED:
            return httpx.Response(400, json={"error": {"message": "bad request"}})
        body = json.loads(request.content)
        n, chat = body["max_tokens"], request.url.path.endswith("/chat/completions")
        if not body["stream"]:
            return httpx.Response(200, json=_answer("a" * n, tokens=n, chat=chat))
        pieces = [_chunk("a", "length" if i == n - 1 else None) for i in range(n)]
        if body.get("stream_options"):
            pieces.append(_chunk(None, tokens=n))
        return httpx.Response(200, content=_events(*pieces, b"[DONE]"))


@pytest.fixture
def rig(monkeypatch):
    """``soak`` against a ``Server`` on a fake clock, with counted RSS samples (111, 222, ...)
    and sleeps recorded instead of slept."""
    box = NS(sleeps=[], rss=[])

    def make(server: Server) -> Server:
        box.server = server

        def client(timeout):
            assert timeout == 120.0
            return httpx.AsyncClient(transport=httpx.MockTransport(server), timeout=timeout)

        async def sleep(s):
            box.sleeps.append(s)

        def rss():
            box.rss.append(111 * (len(box.rss) + 1))
            return box.rss[-1]
        monkeypatch.setattr(soak_mod, "httpx", NS(AsyncClient=client,
                                                  HTTPError=httpx.HTTPError))
        monkeypatch.setattr(soak_mod, "asyncio", NS(gather=asyncio.gather, sleep=sleep))
        monkeypatch.setattr(soak_mod, "time", NS(monotonic=server.clock))
        monkeypatch.setattr(soak_mod, "rss_bytes", rss)
        return server
    box.make = make
    return box


def run(**kw) -> dict:
    args = {"base": "http://srv", "model": "m", "total": 60, "clients": 4, "seed": 1,
            "chat": True, "time_limit": 1e6, "warm_up": 10, **kw}
    return asyncio.run(soak_mod.soak(**args))


def test_the_soak_sends_its_total_and_accounts_for_every_request(rig):
    server = rig.make(Server(drain=((1.0, 2.0), (0.0, 1.0), (0.0, 0.0))))
    got = run()
    assert got["sent"] == 60 and len(server.posts) == 60 and got["failures"] == []
    assert got["completed"] + got["cancelled"] + got["malformed"] == 60
    assert min(got["completed"], got["cancelled"], got["malformed"]) > 0
    paths = {p for p, _ in server.posts}
    assert paths == {"/v1/completions", "/v1/chat/completions"}
    assert got["rss_warm"] == 111 and got["rss_end"] == 222 and rig.rss == [111, 222]
    assert server.metrics == 3 and rig.sleeps == [0.1, 0.1]
    assert got["wall_s"] == 60.0
    again = rig.make(Server())
    assert run() == {**got, "rss_warm": 333, "rss_end": 444}
    assert again.posts == server.posts                        # the seed fixes the requests


def test_without_chat_every_request_is_a_completion(rig):
    server = rig.make(Server())
    got = run(chat=False, total=30, warm_up=1)
    assert {p for p, _ in server.posts} == {"/v1/completions"} and got["failures"] == []
    assert got["rss_warm"] == 111 and server.metrics == 1 and rig.sleeps == []


def test_a_warm_up_beyond_the_total_takes_no_warm_sample(rig):
    rig.make(Server())
    got = run(total=5, warm_up=6)
    assert got["rss_warm"] == 0 and got["rss_end"] == 111 and rig.rss == [111]


@pytest.mark.parametrize("limit, sent", [(2.5, 3), (3.0, 4)])
def test_the_time_limit_stops_the_clients(rig, limit, sent):
    server = rig.make(Server())
    got = run(total=10, clients=1, time_limit=limit)
    assert got["sent"] == sent == len(server.posts)
    assert got["failures"] == ["time limit reached: the soak did not finish"]
    assert got["wall_s"] == sent


@pytest.mark.parametrize("exc, says", [
    (httpx.ConnectError("refused"), "ConnectError: refused"),
    (KeyError("usage"), "KeyError: 'usage'"),
    (ValueError("not json"), "ValueError: not json")])
def test_a_request_that_raises_is_a_failure_and_the_soak_goes_on(rig, exc, says):
    server = rig.make(Server(raise_exc=exc))
    got = run(total=3, clients=1)
    assert got["failures"] == [says] * 3 and len(server.posts) == 3
    assert got["completed"] == got["cancelled"] == 0


def test_requests_left_running_at_the_end_are_a_failure(rig):
    server = rig.make(Server(drain=((1.5, 0.5),)))
    got = run(total=4)
    assert server.metrics == 200 and rig.sleeps == [0.1] * 200
    assert got["failures"] == ["2.0 requests still running or waiting at the end"]


def test_the_resident_memory_is_read_off_proc(monkeypatch):
    monkeypatch.setattr(soak_mod, "open", lambda path: io.StringIO("1000 37 5 1 0 20 0\n"),
                        raising=False)
    assert soak_mod.rss_bytes() == 37 * os.sysconf("SC_PAGE_SIZE")

    def missing(path):
        raise FileNotFoundError(path)
    monkeypatch.setattr(soak_mod, "open", missing, raising=False)
    assert soak_mod.rss_bytes() == 0
