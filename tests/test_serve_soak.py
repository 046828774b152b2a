"""A short soak of the server (scripts/serve_soak.py runs the full one): concurrent clients with
mixed lengths and parameters, streamed and not, completions and chat, clients that leave
mid-stream and malformed requests: no 5xx, no hang, every answer well formed, nothing left
running afterwards."""

from __future__ import annotations

import asyncio

from dflash2rt.serve.soak import soak
from dflash2rt.serve import build_server
from dflash2rt.serve.live import LiveServer

TEMPLATE = "{% for m in messages %}{{ m.content }}\n{% endfor %}"


def test_short_soak():
    server = build_server("stdlib-code", "cpu", max_num_seqs=8, max_model_len=256,
                          max_queue=16, chat_template=TEMPLATE)
    with LiveServer(server) as live:
        res = asyncio.run(soak(live.base, "stdlib-code", total=120, clients=16, seed=1,
                               chat=True, time_limit=600, warm_up=20))
    assert res["failures"] == []
    assert res["completed"] > 50 and res["cancelled"] > 0 and res["malformed"] > 0
    assert res["sent"] == 120
