"""``run`` / ``LLM``'s non-sampling arguments against their documented domains, each bad value
alone: a typed error naming the argument, raised before a model is loaded or decoded."""

from __future__ import annotations

import pytest
import torch

import dflash2rt
from dflash2rt.backend import Backend
from dflash2rt.errors import InvalidInputError
from dflash2rt.models import resolve as resolve_mod
from dflash2rt.models.pair import DTYPE_NAMES, check_dtype

PROMPT = ["def f(x):"]
# vLLM's dtype strings and the torch dtype each names
NAMES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
         "float16": torch.float16, "half": torch.float16, "float64": torch.float64}


@pytest.fixture
def no_load(monkeypatch):
    """Fail the test if a checkpoint is read."""
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the argument was checked")
    monkeypatch.setattr(resolve_mod, "_load", refuse)
    monkeypatch.setattr(resolve_mod.hub, "locate_pair", refuse)


def test_dtype_names_are_vllms():
    assert DTYPE_NAMES == NAMES
    for name, dtype in NAMES.items():
        assert check_dtype(name) is dtype
    assert check_dtype("auto") == "auto"
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64,
                  torch.float8_e4m3fn):
        assert check_dtype(dtype) is dtype


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool,
                                   torch.complex64, "int8", "Auto", "FLOAT32", "fp32", "bf16",
                                   "", None, 32, 1.0, torch.float32.__class__])
def test_a_dtype_outside_the_domain_is_refused_before_loading(dtype, no_load):
    with pytest.raises(InvalidInputError, match="dtype must be 'auto', a floating-point torch "
                                                "dtype or one of 'bfloat16'"):
        check_dtype(dtype)
    with pytest.raises(InvalidInputError, match="dtype must be"):
        dflash2rt.run(backend="cpu", prompts=PROMPT, dtype=dtype, max_new_tokens=2)
    with pytest.raises(InvalidInputError, match="dtype must be"):
        dflash2rt.LLM(backend="cpu", dtype=dtype)


def test_a_dtype_string_loads_what_it_names():
    by_name = dflash2rt.run(backend="cpu", prompts=PROMPT, dtype="bfloat16", max_new_tokens=6)
    by_dtype = dflash2rt.run(backend="cpu", prompts=PROMPT, dtype=torch.bfloat16,
                             max_new_tokens=6)
    assert by_name.tokens == by_dtype.tokens
    with dflash2rt.LLM(backend="cpu", dtype="float") as llm:
        assert llm.pair.dtype == torch.float32


def test_a_floating_dtype_the_backend_does_not_run_is_its_error():
    with pytest.raises(InvalidInputError, match="backend 'cpu' does not run torch.float16"):
        dflash2rt.run(backend="cpu", prompts=PROMPT, dtype="half", max_new_tokens=2)


@pytest.mark.parametrize("backend", [3, 1.5, object(), ["cpu"], ("cpu",), b"cpu", Backend,
                                     {"name": "cpu"}])
def test_a_backend_that_is_neither_a_name_nor_a_backend_is_refused(backend, no_load):
    for call in (lambda: dflash2rt.run(backend=backend, prompts=PROMPT, max_new_tokens=2),
                 lambda: dflash2rt.LLM(backend=backend)):
        with pytest.raises(InvalidInputError, match="backend must be a name .* got "):
            call()


@pytest.mark.parametrize("value", ["yes", 1, 0, None, 1.0])
def test_tp_check_takes_booleans_only(value, no_load):
    with pytest.raises(InvalidInputError, match=f"tp_check must be True or False, got "
                                                f"{value!r}"):
        dflash2rt.run(backend="cpu", prompts=PROMPT, tp_check=value, max_new_tokens=2)


def test_tp_check_false_and_true_run_at_one_rank():
    a = dflash2rt.run(backend="cpu", prompts=PROMPT, tp_check=False, max_new_tokens=4)
    b = dflash2rt.run(backend="cpu", prompts=PROMPT, tp_check=True, max_new_tokens=4)
    assert a.tokens == b.tokens


def test_a_checkpoints_identity_is_its_top_level_files(tmp_path):
    from dflash2rt.models.resolve import _files_identity

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"12345")
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "other.bin").write_bytes(b"x")
    (tmp_path / "dangling").symlink_to(tmp_path / "absent")
    ident = _files_identity(str(tmp_path), None)
    assert [(p, size) for p, size, _ in ident] == [
        (str(tmp_path / "config.json"), 2), (str(tmp_path / "model.safetensors"), 5)]


def test_a_draft_at_the_filesystem_root_is_a_checkpoint_error():
    from dflash2rt.errors import CheckpointError

    with pytest.raises(CheckpointError, match="config.json not found"):
        dflash2rt.LLM(backend="cpu", draft="/")


# ---- block_size against the target's context -------------------------------------------------

def test_block_size_at_most_the_targets_context():
    """A block longer than the target's max_position_embeddings is refused before any cache is
    made (a block of 10**5 had the step's attention take the machine's memory); the context
    itself is a valid block."""
    from dflash2rt.engine.engine import Engine
    from dflash2rt.engine.request import Request, SamplingParams, block_size_or_default
    from dflash2rt import get_backend
    from tiny_models import tiny_pair

    assert block_size_or_default(512, 8, 512) == 512
    assert block_size_or_default(None, 8, 4) == 8          # the default is not checked here
    assert block_size_or_default(10**6, 8) == 10**6        # no context given: no bound
    for bad in (513, 10**5):
        with pytest.raises(InvalidInputError, match="at most 512.*max_position_embeddings"):
            block_size_or_default(bad, 8, 512)
    pair = tiny_pair()                                     # max_position_embeddings 512
    engine = Engine(pair, get_backend("cpu"))
    made = []
    engine.runner.start = lambda *a, **k: made.append(a)   # no cache may be made
    req = [Request((1, 2, 3), SamplingParams(max_new_tokens=2))]
    for spec in (True, False):
        with pytest.raises(InvalidInputError, match="at most 512"):
            engine.generate(req, spec=spec, block_size=513)
    assert made == []


def test_server_refuses_a_block_past_the_context():
    pytest.importorskip("fastapi", reason="the server needs dflash2rt[serve]")
    from dflash2rt.serve import build_server
    with pytest.raises(InvalidInputError, match="at most 1024"):
        build_server("stdlib-code", "cpu", block_size=1025)
