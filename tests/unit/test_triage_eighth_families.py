# ruff: noqa: E501 (real log lines are long)
"""Families the eighth round of issue 23 added, for logs from projects the corpus has never seen: a version
mismatch that names two installed components as incompatible, and a runtime with nothing registered for an op
(`No ... handler registered for ...`, `no kernel registered`, `... not registered`): both the environment, fatal;
a kernel source file of ANOTHER arch in the failing line (`.../hopper/...cuh`, `..._sm90.cuh`) on an SM12x GPU:
that arch's path was reached, which wins over the thin shared-memory reading of a refused attribute. The reverse:
a config search that found nothing fitting (`..._best=0`, `no feasible tile config`) before a bare abort: a
resource limit, thinly. The reverse: SGLang's `Killed N zombie processes` is cleanup, never a failure, and a process that died with no error text is
not told as "a check in <lib> failed". Lines written here by hand from the shapes those tools print (none is
copied from a corpus case); the catalogue is off, so only fatal.py and the structure answer."""

from __future__ import annotations

import pytest

from sm120patch.triage import fatal
from sm120patch.triage.diagnose import diagnose
from tests.unit.triage_lines import assert_prefilter_keeps, fatal_findings

RTX5090 = "Using device 0: NVIDIA GeForce RTX 5090\n"
H100 = "Using device 0: NVIDIA H100 80GB HBM3\n"

# (class the structure must give, or None for "any class, but never silent"; the log)
FAMILIES = [
    # two installed components named incompatible; nothing registered for an op
    (
        "environment",
        "UserWarning: plugin fastlib-cuda version 2.1.0 is installed, but it is not compatible with the installed corelib version 2.0.3\n",
    ),
    ("environment", "fastlib-cuda 2.1 is not compatible with the installed corelib version 2.0\n"),
    ("environment", "No FFI handler registered for my_custom_op_ffi\n"),
    ("environment", "RuntimeError: no kernel registered for op 'fused_rope' on backend CUDA\n"),
    ("environment", "E0101 12:00:00.000 42 dispatch.cc:88] No CUDA implementation registered for scatter_add\n"),
    ("environment", "operator mylib::gemm_fp4 not registered\n" + "INFO waiting\n" * 4),
    # a config search that found nothing fitting, in the lines before a bare abort
    ("resource-limit", "tile_n_best=0\n/src/kern/gemm_tiles.cuh:88: fatal error\n"),
    ("resource-limit", "[gemm] no feasible tile config for M=4096 N=4096 K=512\nAborted (core dumped)\n"),
    # a kernel source file of another arch in the failing line, on an SM12x GPU
    (
        "arch-path-unsupported",
        RTX5090
        + "CUDA Error: invalid argument (invalid argument) /src/include/kern/attention/hopper/prefill.cuh: line 41 at function cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)\n",
    ),
    ("arch-path-unsupported", RTX5090 + "CUDA error: invalid argument at /build/csrc/gemm/fp8_gemm_sm100.cu:220\n"),
]


@pytest.mark.parametrize(("cls", "log"), FAMILIES)
def test_an_eighth_round_family_is_never_silent_and_shows_its_class(cls: str | None, log: str) -> None:
    found = fatal_findings(log)
    if cls is not None:
        assert cls in {f["class"] for f in found}, (log, found)


@pytest.mark.parametrize(("cls", "log"), FAMILIES)
def test_the_prefilter_keeps_every_eighth_round_family(cls: str | None, log: str) -> None:
    assert_prefilter_keeps(log, cls)


def test_an_environment_mismatch_is_never_blamed_on_sm12x() -> None:
    for log in (RTX5090 + "No FFI handler registered for my_custom_op_ffi\n", FAMILIES[0][1]):
        assert all(f["sm12x"] != "yes" for f in fatal_findings(log)), log


def test_another_archs_kernel_on_another_gpu_is_not_blamed_on_sm12x() -> None:
    log = H100 + "CUDA error: invalid argument at /build/csrc/gemm/fp8_gemm_sm100.cu:220\n"
    assert all(f["sm12x"] != "yes" for f in fatal_findings(log))


def test_the_sm12x_arch_path_of_another_arch_says_so() -> None:
    found = fatal_findings(FAMILIES[8][1])
    assert ("arch-path-unsupported", "yes") in {(f["class"], f["sm12x"]) for f in found}, found


def test_a_cleanup_count_of_killed_processes_is_not_fatal() -> None:
    assert fatal.classify("[2026-01-02 10:00:00] Killed 0 zombie processes") is None
    assert fatal.classify("Killed 3 child processes") is None
    assert fatal.classify("Killed") is not None
    assert fatal.classify("worker exited; Killed") is not None


def test_a_healthy_sglang_log_ending_on_the_cleanup_exits_0() -> None:
    log = (
        "[2026-01-02 10:00:00] server_args=ServerArgs(model_path='m', attention_backend='flashinfer', tp_size=1)\n"
        "[2026-01-02 10:00:05] The server is fired up and ready to roll!\n"
        "[2026-01-02 10:05:00] Received sigterm, shutting down\n"
        "[2026-01-02 10:05:01] Killed 0 zombie processes\n"
    )
    d = diagnose(log.splitlines(keepends=True), [], None).to_dict()
    assert d["exit_code"] == 0, d["findings"]


def test_a_bare_process_death_is_not_told_as_a_failed_check() -> None:
    log = (
        "[2026-01-02 10:00:00] server_args=ServerArgs(model_path='m', attention_backend='flashinfer', tp_size=1)\n"
        '  File "/usr/lib/python3/site-packages/flashinfer/prefill.py", line 120, in run\n'
        "Killed\n"
    )
    d = diagnose(log.splitlines(keepends=True), [], None, signatures=[]).to_dict()
    assert d["exit_code"] == 1
    assert "a check in" not in str(d["findings"]), d["findings"]
    assert any("process died" in f["details"].get("cue", "") for f in d["findings"]), d["findings"]


HEALTHY = [
    "plugin fastlib-cuda version 2.1.0 is installed and compatible with the installed corelib version 2.1.0\n",
    "Registered 12 handlers for custom ops\n",
    "INFO: kernel fused_rope registered for backend CUDA\n",
    "Killed 0 zombie processes\n",
    "autotune: tile_n_best=0 (default kept)\nserving\n",
    "loading /src/include/kern/attention/hopper/prefill.cuh from cache\n",
]


@pytest.mark.parametrize("log", HEALTHY)
def test_healthy_lines_with_the_same_words_stay_healthy(log: str) -> None:
    d = diagnose(log.splitlines(keepends=True), [], None, signatures=[]).to_dict()
    assert d["exit_code"] == 0, (log, d["findings"])
