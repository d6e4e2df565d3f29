# ruff: noqa: E501 (real log lines are long)
"""Families the tenth round of issue 23 added (held-out 9 opened), for logs from projects the corpus has never
seen: a HOST SIGILL (`Illegal instruction`, the shell's report of a CPU-side ISA problem) is never a CUDA kernel
fault, even beside an SM12x device line, while CUDA's own illegal-instruction texts stay kernel faults; any CUDA
tool's `Value 'sm_N' is not defined for option 'gpu-architecture'` is a toolchain that lacks the arch ("yes" only
for an SM12x value); an engine-core startup failure with its root cause cut out says so thinly, and a class shown
in the worker lines above wins; a build that failed on a kernel source of another arch is that arch's path.
Lines written here by hand from the shapes those tools print (none is copied from a corpus case); the catalogue
is off, so only fatal.py and the structure answer."""

from __future__ import annotations

import pytest

from sm120patch.triage.diagnose import diagnose
from tests.unit.triage_lines import assert_prefilter_keeps

RTX5080 = "ggml_cuda_init: found 1 CUDA devices:\n  Device 0: NVIDIA GeForce RTX 5080, compute capability 12.0, VMM: yes\n"
SM120 = "Using device 0: NVIDIA GeForce RTX 5090 (sm_120)\n"


def _fatal(log: str, catalogue: bool = False) -> list[dict]:
    lines = log.splitlines(keepends=True)
    d = diagnose(lines, [], None, **({} if catalogue else {"signatures": []})).to_dict()
    assert d["exit_code"] == 1 or catalogue, f"not answered as a failure: {log!r} -> {d}"
    found = [f for f in d["findings"] if f["fatal"]]
    assert found, f"silent: {log!r} -> {d}"
    return found


HOST_SIGILL = [
    RTX5080 + "register_backend: registered backend CUDA (1 devices)\nIllegal instruction (core dumped)\n",
    RTX5080 + "Illegal instruction\n",
    SM120 + "./start.sh: line 7:  4242 Illegal instruction     ./bin/server --port 8080\n",
    SM120 + "zsh: illegal hardware instruction  python serve.py\n",
    SM120 + "Fatal Python error: Illegal instruction\n\nCurrent thread 0x00007f (most recent call first):\n",
]


@pytest.mark.parametrize("log", HOST_SIGILL)
def test_a_host_sigill_is_never_a_kernel_fault_on_sm12x(log: str) -> None:
    for catalogue in (False, True):
        found = _fatal(log, catalogue)
        assert all(f["sm12x"] != "yes" for f in found), found
        assert all(f["class"] != "kernel-fault" for f in found), found


CUDA_ILLEGAL = [
    SM120 + "RuntimeError: CUDA error: an illegal instruction was encountered\n",
    SM120 + "decode step failed: CUDA_ERROR_ILLEGAL_INSTRUCTION (715)\n",
    SM120 + "GPUassert: cudaErrorIllegalInstruction main.cu 88\n",
]


@pytest.mark.parametrize("log", CUDA_ILLEGAL)
def test_cuda_own_illegal_instruction_stays_a_kernel_fault(log: str) -> None:
    assert "kernel-fault" in {f["class"] for f in _fatal(log)}


TOOL_ARCH_VALUES = [
    ("yes", "cuobjdump fatal: Value 'sm_121' is not defined for option 'gpu-architecture'\n"),
    ("yes", "nvdisasm fatal   : Value 'sm_120a' is not defined for option 'gpu-name'\n"),
    ("yes", "fatal: Value 'compute_120' is not defined for option 'gpu-architecture'\n"),
    ("yes", "Value 'sm_120f' is not defined for option '--gpu-architecture'\nmake: *** [Makefile:12: all] Error 1\n"),
    ("not-yes", "fatbinary fatal   : Value 'sm_35' is not defined for option 'gpu-name'\n"),
]


@pytest.mark.parametrize(("sm12x", "log"), TOOL_ARCH_VALUES)
def test_any_cuda_tool_refusing_an_arch_value_is_a_toolchain_that_lacks_it(sm12x: str, log: str) -> None:
    found = _fatal(log)
    assert "toolchain-lacks-arch" in {f["class"] for f in found}, found
    verdicts = {f["sm12x"] for f in found if f["class"] == "toolchain-lacks-arch"}
    assert ("yes" in verdicts) if sm12x == "yes" else ("yes" not in verdicts), found


ENGINE_TAIL = (
    '  File "/srv/app/.venv/lib/python3.12/site-packages/vllm/v1/engine/core_client.py", line 40, in _wait\n'
    '    raise RuntimeError("Engine core initialization failed. "\n'
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
)


def test_an_engine_startup_tail_without_its_cause_says_so_thinly() -> None:
    found = _fatal(ENGINE_TAIL)
    assert all(f["sm12x"] != "yes" for f in found), found
    assert any("engine or worker process that died" in f["details"].get("cue", "") for f in found), found


def test_a_class_in_the_worker_lines_above_an_engine_tail_wins() -> None:
    log = (
        SM120
        + "(EngineCore_0 pid=9) ERROR torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device\n"
        + ENGINE_TAIL
    )
    found = _fatal(log)
    assert "binary-lacks-arch" in {f["class"] for f in found}, found


def test_a_build_that_failed_on_another_archs_kernel_source_is_that_archs_path() -> None:
    log = "#9 71.2   Error: Kernel compilation failed for csrc/attention/hopper/flash_fwd.cu: nvcc error:\n"
    found = _fatal(log)
    assert "arch-path-unsupported" in {f["class"] for f in found}, found
    assert all(f["sm12x"] != "yes" for f in found), found  # the GPU is not shown: thin


HEALTHY = [
    "note: the option 'gpu-architecture' accepts sm_120 since CUDA 12.8\nbuild finished\n",
    "INFO engine core initialization finished in 12.3 s\n",
]


@pytest.mark.parametrize("log", HEALTHY)
def test_healthy_lines_with_the_same_words_stay_healthy(log: str) -> None:
    d = diagnose(log.splitlines(keepends=True), [], None, signatures=[]).to_dict()
    assert d["exit_code"] == 0, (log, d["findings"])


@pytest.mark.parametrize("log", HOST_SIGILL + CUDA_ILLEGAL + [log for _, log in TOOL_ARCH_VALUES] + [ENGINE_TAIL])
def test_the_prefilter_keeps_every_tenth_round_family(log: str) -> None:
    assert_prefilter_keeps(log)


@pytest.mark.parametrize(
    ("log", "cls"),
    [
        (  # a kernel source named for the arch that the install does not carry: the package has no SM12x variant
            "RuntimeError: Assertion error (loader.hpp:40):\nFailed to open: /opt/venv/lib/python3.12/site-packages/"
            "deep_gemm/include/impls/sm121_fp4_gemm.cuh\n",
            "binary-lacks-arch",
        ),
        (  # the same check naming another arch's file on no GPU shown stays an arch path
            "RuntimeError: Assertion error (loader.hpp:40):\nunsupported: deep_gemm/include/impls/sm121_fp4_gemm.cuh\n",
            "arch-path-unsupported",
        ),
    ],
)
def test_a_missing_file_named_for_the_sm12x_arch_is_a_binary_without_it(log: str, cls: str) -> None:
    assert [f["class"] for f in _fatal(log)] == [cls]
