"""The run rung on real GPUs (marked `gpu`): skipped, with the reason, where the GPUs are not here.

What they need: NVIDIA GPUs (seen through NVML or nvidia-smi, never by importing torch here),
a Python with torch (CUDA) and FlashInfer importable (`SM120PATCH_GPU_PYTHON`, default python3),
and nvcc for FlashInfer's JIT. docs/gpu-validation.md shows what these runs printed on 2x H200.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter

import pytest

from sm120patch.arch import Arch
from sm120patch.catalogue.kernels import get_kernel
from sm120patch.probes import ProbeCache, Verdict, probe_kernel
from sm120patch.probes.environment.device import detect
from sm120patch.probes.environment.flashinfer import from_python
from sm120patch.probes.run.rung import check_run
from tests.conftest import needs_tool, requires

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def machine() -> tuple[Counter[Arch], str]:
    gpus = detect(with_torch=False).gpus
    requires(bool(gpus), "no NVIDIA GPU here (NVML and nvidia-smi found none)")
    needs_tool("nvcc", "FlashInfer's JIT on the GPU")
    python = os.environ.get("SM120PATCH_GPU_PYTHON") or shutil.which("python3") or "python3"
    return Counter(g.arch for g in gpus), python


def _fi(python: str):
    fi = from_python(python)
    requires(fi.found, f"{python} cannot import flashinfer ({fi.error}); set SM120PATCH_GPU_PYTHON")
    return fi


def _arch_with(machine: tuple[Counter[Arch], str], n: int) -> Arch:
    counts, _ = machine
    archs = [a for a, k in counts.items() if k >= n]
    have = {a.name: k for a, k in counts.items()}
    requires(bool(archs), f"needs {n} GPUs of one arch; this machine has {have}")
    return archs[0]


def reached_the_run_rung(v: Verdict) -> None:
    """GPUs of the arch are here, so a ladder that stops below `run` is a regression (a fail of
    the test), unless a lower rung showed that this FlashInfer has no such kernel for the arch
    (result `fail`: a fact about FlashInfer, not about sm120patch), which skips naming it."""
    if v.rung == "run":
        return
    if v.result == "fail":
        pytest.skip(f"this FlashInfer has no {v.kernel} for {v.arch}: the {v.rung} rung says {v.reason}")
    pytest.fail(f"GPUs of {v.arch} are here but the ladder stopped at the {v.rung} rung ({v.result}): {v.reason}")


def test_allreduce_fusion_runs_right_on_two_gpus(machine, tmp_path) -> None:
    arch = _arch_with(machine, 2)
    requires(arch.major in (9, 10, 12), f"{arch.name}: not an arch trtllm_comm is built for")
    v = probe_kernel("flashinfer:trtllm_comm", arch, _fi(machine[1]), "run", ProbeCache(tmp_path))
    reached_the_run_rung(v)
    assert v.result == "pass", v.reason
    run = v.evidence["run"]
    assert run["world_size"] == 2 and {c["rank"] for c in run["cases"]} == {0, 1}
    assert {c["mode"] for c in run["cases"]} == {"oneshot", "twoshot"}


def test_rmsnorm_runs_right(machine, tmp_path) -> None:
    arch = _arch_with(machine, 1)
    v = probe_kernel("flashinfer:norm", arch, _fi(machine[1]), "run", ProbeCache(tmp_path))
    assert (v.result, v.rung) == ("pass", "run"), v.reason


def test_fused_moe_runs_right(machine, tmp_path) -> None:
    """On SM90 the check builds its reduced bf16 module (30 of 181 units for 0.6.1: 300 s on 16 cores of
    an H200); the run rung is asked alone, since the build rung compiles the whole module's cubins."""
    arch = _arch_with(machine, 1)
    kernel = {9: "cutlass_fused_moe_sm90", 10: "cutlass_fused_moe_sm100", 12: "cutlass_fused_moe_sm120"}.get(arch.major)
    requires(kernel is not None, f"{arch.name}: no CUTLASS fused-MoE module in the catalogue")
    requires(
        arch.major == 9 or os.environ.get("SM120PATCH_GPU_MOE") == "1",
        f"set SM120PATCH_GPU_MOE=1: on {arch.name} the check builds FlashInfer's whole fused-MoE module "
        "(NVFP4 too), about 180 objects",
    )
    step = check_run(get_kernel(f"flashinfer:{kernel}"), arch, _fi(machine[1]), tmp_path)
    assert step.result == "pass", step.reason
    if arch.major == 9:
        assert "reduced to bf16" in step.reason and "not built" in step.reason
