"""An OpenAI-compatible server with continuous batching (docs/serving.md).

``build_server`` loads a model pair and makes the ``Server`` (the engine loop and what each
request is checked against); ``create_app`` its FastAPI application; ``run_server`` serves it
with uvicorn until SIGINT / SIGTERM, which drain the requests in flight (up to
``drain_timeout`` seconds) and exit. Needs the ``serve`` extra: ``pip install
'dflash2rt[serve]'``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError, MissingExtraError

DEFAULT_SLOTS = 16
DEFAULT_QUEUE = 256


def _require_extra() -> None:
    try:
        import fastapi  # noqa: F401
        import jinja2  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise MissingExtraError(f"serving needs fastapi, uvicorn and jinja2 ({exc.name} is "
                                "missing): pip install 'dflash2rt[serve]'") from exc


def build_server(model: Any = "stdlib-code", backend: Any = None, *, draft: Any = None,
                 revision: str | None = None, draft_revision: str | None = None,
                 dtype: Any = "auto", spec: bool = True, block_size: int | str | None = None,
                 max_num_seqs: int = DEFAULT_SLOTS, max_model_len: int | None = None,
                 max_queue: int = DEFAULT_QUEUE, kv_cache_gib: float | None = None,
                 served_model_name: list[str] | None = None, chat_template: str | None = None,
                 api_key: str | None = None, stream_interval: int = 1) -> Any:
    """The ``Server`` of a model pair (``model``, ``draft``, ``revision``, ``draft_revision``,
    ``dtype``: as ``dflash2rt.run``'s). ``block_size``: every step's block (None: the draft's
    default), or "auto": adaptive (``serve/blocks.py``); ``spec=False``: target-only.
    ``max_num_seqs``: the largest batch; ``kv_cache_gib``: a budget for the KV caches, which
    lowers the batch to what fits (an error when not even one request does);
    ``max_model_len``: prompt + output tokens per request (None: the target's context);
    ``max_queue``: requests waiting beyond the batch before 503s; ``served_model_name``: the
    names requests may give (None: the model's); ``chat_template``: a file or a template
    (None: the model's own, if any); ``api_key``: what the /v1 routes require;
    ``stream_interval``: tokens a streamed chunk gathers (``Server``'s)."""
    _require_extra()
    check_options(max_num_seqs, max_model_len, max_queue, kv_cache_gib, served_model_name,
                  api_key, stream_interval)
    from ..api import backend_of, measured_table, resolve_model
    from ..engine.engine import Engine
    from ..engine.request import block_size_or_default
    from ..models import hub
    from ..models.pair import ModelPair
    from .chat import ChatTemplate, find_template, special_tokens
    from .server import Server

    be = backend_of(backend)
    pair = resolve_model(model, be.device, dtype, draft=draft, revision=revision,
                         draft_revision=draft_revision)
    target_dir = None
    if not isinstance(model, ModelPair):
        target_dir = Path(hub.locate_pair(model, draft, revision, draft_revision)[0].path)
    if spec:
        if pair.draft is None:
            raise InvalidInputError("this model has no draft: serve it with --no-spec")
        block = None if block_size == "auto" else \
            block_size_or_default(block_size, pair.draft.cfg.block_size,
                                  pair.target.cfg.max_position_embeddings)
        if block is not None and block < 2:
            raise InvalidInputError(f"block_size must be >= 2 with speculation (or 'auto'), "
                                    f"got {block}")
    elif block_size is not None:
        raise InvalidInputError("block_size applies to speculative decoding: drop block_size "
                                "or serve with speculation (no --no-spec)")
    else:
        block = 1
    context = pair.target.cfg.max_position_embeddings
    max_model_len = context if max_model_len is None else max_model_len
    if not 2 <= max_model_len <= context:
        raise InvalidInputError(f"max_model_len must lie in [2, {context}] (the target's "
                                f"max_position_embeddings), got {max_model_len}")
    room = pair.draft.cfg.block_size * 2 if block is None else block    # adaptive: up to 2x
    slots = _slots(pair, max_num_seqs, max_model_len + room + 1, spec, kv_cache_gib)
    names = tuple(served_model_name or [pair.name or str(model)])
    source = find_template(target_dir, chat_template)
    template = None if source is None else ChatTemplate(source, special_tokens(target_dir))
    engine = Engine(pair, be, table=measured_table(pair, be.device))
    return Server(engine, names, block, slots, max_model_len, max_queue, template, api_key,
                  stream_interval)


def check_options(max_num_seqs: Any, max_model_len: Any, max_queue: Any, kv_cache_gib: Any,
                  served_model_name: Any, api_key: Any, stream_interval: Any) -> None:
    """``build_server``'s options, checked before any model loads: each a typed error naming
    it (an empty API key is refused rather than read as no key: the server would be open)."""
    from ..engine.request import check_count

    check_count("max_num_seqs", max_num_seqs, 1)
    if max_model_len is not None:
        check_count("max_model_len", max_model_len, 2)
    check_count("max_queue", max_queue, 0)
    check_count("stream_interval", stream_interval, 1)
    if kv_cache_gib is not None and (isinstance(kv_cache_gib, bool)
                                     or not isinstance(kv_cache_gib, (int, float))
                                     or not _finite(kv_cache_gib) or kv_cache_gib <= 0):
        raise InvalidInputError(f"kv_cache_gib must be a number of GiB > 0, got {kv_cache_gib!r}")
    if served_model_name is not None and (
            not isinstance(served_model_name, (list, tuple)) or not served_model_name
            or any(not isinstance(n, str) or not n.strip() for n in served_model_name)):
        raise InvalidInputError(f"served_model_name must be a list of non-empty names, got "
                                f"{served_model_name!r}")
    if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
        raise InvalidInputError(f"api_key must be a non-empty string (None: no key), got "
                                f"{api_key!r}; an empty key would leave the server open")


def _finite(x: int | float) -> bool:
    """``math.isfinite``; False for an int too large for a float (not an OverflowError)."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def check_drain_timeout(drain_timeout: Any) -> None:
    if isinstance(drain_timeout, bool) or not isinstance(drain_timeout, (int, float)) \
            or not _finite(drain_timeout) or drain_timeout < 0:
        raise InvalidInputError(f"drain_timeout must be a number of seconds >= 0, got "
                                f"{drain_timeout!r}")


def _slots(pair: Any, max_num_seqs: int, rows: int, spec: bool,
           kv_cache_gib: float | None) -> int:
    """The batch size: ``max_num_seqs``, lowered to what ``kv_cache_gib`` holds; checked
    against the device's free memory (a ResourceError naming the flags to lower)."""
    from ..engine.memory import cache_bytes
    from ..models.memory import check_fits

    a = pair.target.cfg
    per = cache_bytes(a.num_hidden_layers, 1, rows, a.num_key_value_heads, a.head_dim,
                      pair.dtype)
    if spec:
        d = pair.draft.cfg.arch
        per += cache_bytes(d.num_hidden_layers, 1, rows, d.num_key_value_heads, d.head_dim,
                           pair.dtype)
        per += rows * d.hidden_size * pair.dtype.itemsize
    slots = max_num_seqs
    if kv_cache_gib is not None:
        # a budget of the whole batch or more keeps it (a product past 1e308 is inf, not NaN)
        fit = slots if kv_cache_gib * 2**30 >= slots * per else int(kv_cache_gib * 2**30 // per)
        if fit < 1:
            raise InvalidInputError(f"kv_cache_gib={kv_cache_gib} holds no request of "
                                    f"{rows} rows ({per / 2**30:.3f} GiB each): raise it or "
                                    "lower max_model_len")
        slots = min(slots, fit)
    check_fits(slots * per, pair.device, f"the server's KV caches ({slots} requests x {rows} "
               "rows)", "--max-num-seqs, --max-model-len or --kv-cache-gib")
    return slots


def check_port(port: Any) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidInputError(f"port must be an integer in [0, 65535], got {port!r}")


def run_server(server: Any, host: str = "127.0.0.1", port: int = 8000,
               drain_timeout: float = 30.0, log_level: str = "info") -> None:
    """Serve until SIGINT / SIGTERM; in-flight requests get ``drain_timeout`` seconds, then
    this returns. The engine loop runs in this thread (``Scheduler.run_here``: the thread that
    loaded the models keeps the CPU's torch work) and uvicorn in another; a signal tells
    uvicorn to stop taking requests and drain, after which its shutdown closes the loop. A
    failed engine loop is raised here."""
    import signal
    import threading

    import uvicorn

    from .app import create_app

    check_port(port)
    check_drain_timeout(drain_timeout)
    config = uvicorn.Config(create_app(server), host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=drain_timeout, lifespan="on")
    http = uvicorn.Server(config)
    failed: list[BaseException] = []
    stopped: list[int] = []

    def serve_http() -> None:
        try:
            http.run()
        except BaseException as exc:   # noqa: BLE001 - uvicorn exits (SystemExit) on a failed bind
            failed.append(exc)
        finally:                    # whatever ended the HTTP side (a port in use too) ends the loop
            server.close(0)

    def stop(signum: int, frame: object) -> None:
        stopped.append(signum)
        http.should_exit = True

    main = threading.current_thread() is threading.main_thread()
    before = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)} \
        if main else {}
    server.scheduler.loop_in_caller()
    thread = threading.Thread(target=serve_http, name="dflash2rt-http", daemon=True)
    try:
        thread.start()
        server.scheduler.run_here()
        http.should_exit = True
        thread.join(min(drain_timeout + 10, threading.TIMEOUT_MAX))
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    if server.scheduler.failed is not None:
        raise server.scheduler.failed
    if not http.started and not stopped:
        why = next((f": {type(e).__name__}: {e}" for e in failed
                    if not isinstance(e, SystemExit)), " (uvicorn logged why above)")
        raise InvalidInputError(f"the server could not listen on http://{host}:{port}{why}; "
                                f"choose another --host / --port")
