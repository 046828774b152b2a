"""Every Triton kernel compiles to SPIR-V, as its wrapper launches it, for the XPU plugin's
targets — pvc (Data Center GPU Max 1550) and dg2 (Arc A770, no float64) — with Intel's Triton
and without an Intel GPU (dflash2rt.kernels.compile_check). On dg2 no compiled kernel may
declare the SPIR-V Float64 capability (such a device cannot build the module).

Intel's Triton installs the same import package as the PyPI triton, so it lives in its own
environment (backends/xpu/compile_env.sh makes out/venv-xpu). The compile runs in the python
named by DFLASH2RT_XPU_PYTHON, else out/venv-xpu/bin/python, else this interpreter when its
Triton has the intel backend; without any of these it skips, saying so."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from dflash2rt.kernels import compile_check

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("pvc", "dg2")
ENV_VAR = "DFLASH2RT_XPU_PYTHON"


def _has_intel_backend(python: str) -> bool:
    code = "from triton.backends import backends; assert 'intel' in backends"
    return subprocess.run([python, "-c", code], capture_output=True, timeout=120).returncode == 0


def _intel_python() -> str | None:
    if os.environ.get(ENV_VAR):
        return os.environ[ENV_VAR]        # named explicitly: used as is (a broken one fails)
    venv = ROOT / "out" / "venv-xpu" / "bin" / "python"
    if venv.exists():
        return str(venv)
    return sys.executable if _has_intel_backend(sys.executable) else None


def _spirv(*instructions: tuple[int, ...], big_endian: bool = False) -> bytes:
    """A SPIR-V module: the header, then each (opcode, operands...) as one instruction."""
    words = [compile_check._SPIRV_MAGIC, 0x00010500, 0, 64, 0]
    for op, *operands in instructions:
        words += [(1 + len(operands)) << 16 | op, *operands]
    return struct.pack(f"{'>' if big_endian else '<'}{len(words)}I", *words)


def test_spirv_capabilities_are_read_from_the_module_header():
    kernel, addresses, float64, int64 = 6, 4, 10, 11
    # OpCapability × 3, OpExtension "SPV_", OpMemoryModel: the capabilities end there, so the
    # one after it is not read
    body = ((17, addresses), (17, kernel), (17, float64), (10, 0x5F565053, 0), (14, 2, 2),
            (17, int64))
    assert compile_check.spirv_capabilities(_spirv(*body)) == {addresses, kernel, float64}
    assert compile_check.spirv_capabilities(_spirv(*body, big_endian=True)) == \
        {addresses, kernel, float64}
    assert float64 not in compile_check.spirv_capabilities(_spirv((17, kernel), (14, 2, 2)))
    with pytest.raises(ValueError, match="not a SPIR-V module"):
        compile_check.spirv_capabilities(b"\x7fELF" + bytes(32))


def test_the_xpu_targets_are_device_properties_and_dg2_has_no_float64():
    pytest.importorskip("dflash2rt_xpu", reason="the dflash2rt-xpu plugin is not installed "
                        "(pip install -e backends/xpu)")
    from dflash2rt_xpu.plugin import TRITON

    assert set(TRITON.compile_targets) == set(TARGETS)
    (pvc, pvc_warp), (dg2, dg2_warp) = (TRITON.compile_targets[t] for t in TARGETS)
    assert compile_check.has_fp64(pvc) and not compile_check.has_fp64(dg2)
    assert min(pvc["sub_group_sizes"]) == 16 and min(dg2["sub_group_sizes"]) == 8
    assert pvc_warp == dg2_warp == 32 and TRITON.tuning_for(32) is TRITON.tuning_for(None)


@pytest.mark.slow
def test_every_kernel_compiles_to_spirv_for_intel_targets():
    python = _intel_python()
    if python is None:
        pytest.skip("no Python with Intel's Triton (triton-xpu): run backends/xpu/compile_env.sh "
                    f"or set {ENV_VAR} to one")
    from dflash2rt.kernels.smoke import DTYPES, cases

    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    args = [python, "-m", "dflash2rt.kernels.compile_check", "--json"]
    for t in TARGETS:
        args += ["--target", t]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert proc.stdout, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)
    failed = [f"{r['case']} [{r['target']}]: {r['error']}" for r in rows if not r["ok"]]
    assert not failed and proc.returncode == 0, "\n".join(failed)
    kernels = compile_check.launched_kernels()        # (case, kernel): a case may launch two
    every = {(f"{c}-{d}", k) for d, dt in DTYPES.items() for c, (m, _) in cases(dt).items()
             for _, k in kernels[m]}
    nofp64 = {(f"{c}-{d}-nofp64", k) for d in DTYPES for c in ("select-sampled", "verify-sampled")
              for _, k in kernels[c.split("-")[0]]}
    by = {t: {(r["case"], r["kernel"]): r for r in rows if r["target"] == t} for t in TARGETS}
    assert set(by["pvc"]) == every | nofp64 and set(by["dg2"]) == every
    for t in TARGETS:
        assert len(by[t]) == sum(r["target"] == t for r in rows), t
        assert {r["tuning"] for r in by[t].values()} == {"xpu warp 32"}
        assert not any(r["narrow_index"] for r in by[t].values() if not r["skipped"]), t
    pvc, dg2 = by["pvc"], by["dg2"]
    # pvc has float64: every case is a kernel there, and the SPIR-V says which compute in it
    # (the keyed draws of the watermark and the sampled paths do; their "-nofp64" builds not).
    assert not any(r["skipped"] for r in pvc.values())
    assert all(isinstance(r["float64"], bool) for r in pvc.values())
    assert all(r["float64"] for (c, k), r in pvc.items()
               if "watermarked" in c and k != "_topk_kernel")
    assert not any(pvc[c]["float64"] or pvc[c]["f64"] for c in nofp64)
    # dg2 has none: every case compiles to a module without Float64 (the sampled select and
    # verify in their float32 formulation), except the watermarked ones, which refuse.
    assert not any(r["float64"] for r in dg2.values())
    assert {c for c, r in dg2.items() if r["skipped"]} == {c for c in every
                                                            if "watermarked" in c[0]}
    assert all("was not launched" in r["skipped"] and "float64" in r["skipped"]
               for r in dg2.values() if r["skipped"])
