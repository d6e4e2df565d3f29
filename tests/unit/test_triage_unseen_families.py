# ruff: noqa: E501 (real log lines are long)
"""Families the fourth round of issue 23 added, for logs from projects the corpus has never seen: a kernel
library's own failure with no arch word, build scripts refusing an arch list or skipping kernels for want
of one, a check that names what it expected and got, messages wrapped over three lines, arch dispatch
tables without this GPU, the loader failing before main, and a compile target that is not the GPU. Lines
written here by hand from the shapes those tools print (none is copied from a corpus case); the catalogue
is off, so only fatal.py and the structure answer. None may be silent, each shows its class, and none may
say SM12x "yes" unless the log names SM12x."""

from __future__ import annotations

import pytest

from sm120patch.triage.classes import classify_line, library_in
from sm120patch.triage.diagnose import diagnose
from tests.unit.triage_lines import assert_prefilter_keeps

TB = 'Traceback (most recent call last):\n  File "/env/site-packages/{lib}/{mod}.py", line 41, in run\n    return self._impl(x)\n'

# (class the structure must give; the log)
FAMILIES = [
    # the loader gives up before main: a library the image needs is not there (a container without the driver's)
    ("environment", "/opt/app/bin/infer-server: error while loading shared libraries: libcudart.so.13: cannot open shared object file: No such file or directory\n"),
    ("environment", "dyld[4242]: Library not loaded: @rpath/libtorch_cuda.dylib\n"),
    ("environment", 'OSError: [WinError 1114] A dynamic link library (DLL) initialization routine failed. Error loading "C:\\env\\lib\\caffe2_nvrtc.dll"\n'),
    ("environment", "RuntimeError: torch._C._cuda_getDeviceCount() > 0 INTERNAL ASSERT FAILED at some/file.cpp:10\n"),
    # a check that says what it expected and what it got, with the arch it got
    ("arch-path-unsupported", "op check: expects the target in [sm_90a, sm_100a, sm_103a] but got sm_120a\n"),
    # a message wrapped at the terminal's width over three lines
    ("arch-path-unsupported", "RuntimeError: The fused expert runner cannot\nbe picked for this run because its kernel does not\nsupport the current GPU.\n"),
    # build scripts that refuse the arch list they were given, or list what they accept
    ("arch-path-unsupported", "RuntimeError: None of the GPU archs requested (12.0) are supported; this setup accepts 8.0, 8.6, 9.0\n"),
    ("arch-path-unsupported", "ValueError: Supported GPU architectures are 8.0 and 9.0 only\n"),
    ("arch-path-unsupported", "error: TORCH_CUDA_ARCH_LIST entry '12.1' is not supported by this project\n"),
    # a dispatch on the arch with no entry for this GPU: a missed key, or a name no branch set
    ("arch-path-unsupported", TB.format(lib="fooattn", mod="dispatch") + "KeyError: 'sm_121'\n"),
    ("arch-path-unsupported", '  File "build_ext.py", line 40, in <module>\n    flags.append(f"-gencode=arch=compute_{cc},code=sm_{cc}")\nNameError: name \'cc\' is not defined\n'),
    # a capability comparison is an arch; "not in" the accepted list is a refusal
    ("arch-path-unsupported", "RuntimeError: FooKernel is not supported: it needs compute capability >= 9 and < 10\n"),
    ("arch-path-unsupported", "ValueError: device capability 121 not in the accepted list\n"),
    # a kernel library fails with no arch word on a log whose GPU is SM12x (thin: the library and the GPU)
    ("arch-path-unsupported", "GPU 0: NVIDIA GeForce RTX 5080\n" + TB.format(lib="deep_ep", mod="buffer") + "RuntimeError: internal dispatch failed\n"),
    ("arch-path-unsupported", "GPU 0: NVIDIA RTX PRO 6000 Blackwell\n" + TB.format(lib="foo_kernels", mod="_ops") + "RuntimeError: Error in kernel setup\n"),
    # ... or names the kernel, with its arch, in the line below the error
    ("arch-path-unsupported", "RuntimeError: gemm runner error at runner.cu:200\n  (kernel: gemm_bf16_tile128_sm100a)\n"),
    # instructions of one arch family only in the failing line; CJK refusals of the GPU's architecture
    ("arch-path-unsupported", "RuntimeError: tcgen05 mma issue failed during kernel setup\n"),
    ("arch-path-unsupported", "运行错误：该显卡架构不受支持\n"),
    ("arch-path-unsupported", "RuntimeError: Unsupported CUDA capability 12.0 for this op\n"),
    # a capability written with an x; a kernel with no device code for the arch; the allocator's message re-raised
    ("arch-path-unsupported", "AssertionError: compute capability 10.x required for this FP4 path\n"),
    ("binary-lacks-arch", "foo.cu:88: ERROR: kernel gemv_q4 has no device code compatible with CUDA arch 1200\n"),
    ("out-of-memory", "!!! Exception during processing !!! Allocation on device\n"),
    # "no kernel" in any case, next to the capability as a tuple
    ("arch-path-unsupported", "RuntimeError: No kernel registered for device capability (12, 0)\n"),
    # the installed build does not fit the GPU
    ("binary-lacks-arch", "RuntimeError: this GPU is not compatible with the installed foolib build\n"),
    # a build that skipped kernels for want of an arch, when the log targets SM12x
    ("binary-lacks-arch", "-- CUDA target arches: 12.0a\n-- Not building fp4_gemm since no compatible archs were found\n"),
]


def _fatal(log: str, signatures: list | None = None) -> list[dict]:
    d = diagnose(log.splitlines(keepends=True), [], None, signatures=signatures).to_dict()
    assert not (d["exit_code"] == 0 and not [f for f in d["findings"] if f["fatal"]]), f"silent: {log!r}"
    return [f for f in d["findings"] if f["fatal"]]


@pytest.mark.parametrize(("cls", "log"), FAMILIES)
def test_an_unseen_family_is_never_silent_and_shows_its_class(cls: str, log: str) -> None:
    found = _fatal(log, signatures=[])
    assert cls in {f["class"] for f in found}, (log, found)
    sm12x_named = any(t in log for t in ("sm_120", "sm_121", "12.0", "12.1", " 121 ", "(12, 0)"))
    assert sm12x_named or all(f["sm12x"] != "yes" for f in found), (log, found)


@pytest.mark.parametrize(("cls", "log"), FAMILIES)
def test_the_prefilter_keeps_every_unseen_family(cls: str, log: str) -> None:
    assert_prefilter_keeps(log, cls)


def test_a_kernel_library_failure_with_no_arch_word_is_thin_and_never_yes() -> None:
    (f,) = _fatal("GPU 0: NVIDIA GeForce RTX 5080\n" + TB.format(lib="deep_ep", mod="buffer") + "RuntimeError: internal dispatch failed\n", [])
    assert (f["class"], f["evidence"], f["sm12x"]) == ("arch-path-unsupported", "thin", "maybe")
    assert f["details"]["library"] == "deep_ep"


def test_the_same_failure_on_a_gpu_shown_as_another_is_not_an_arch_path() -> None:
    (f,) = _fatal("GPU 0: NVIDIA H100 80GB HBM3\n" + TB.format(lib="deep_ep", mod="buffer") + "RuntimeError: internal dispatch failed\n", [])
    assert f["class"] == "other" and f["sm12x"] == "no"
    (f,) = _fatal("Device: AMD Instinct MI300X (gfx942)\nRuntimeError: kernel not supported on this architecture\n", [])
    assert f["class"] == "arch-path-unsupported" and f["sm12x"] == "no"


def test_kernels_a_build_skipped_for_another_gpu_leave_a_healthy_build_log_healthy() -> None:
    log = ["-- CUDA target arches: 9.0a\n", "-- Not building fp4_gemm since no compatible archs were found\n", "-- Build files have been written to: /src/build\n"]
    d = diagnose(log, [], None)
    assert d.exit_code == 0 and not d.causes, d.render()
    (f,) = _fatal("".join(["-- CUDA target arches: 12.1a\n", *log[1:]]))
    assert (f["class"], f["evidence"], f["sm12x"]) == ("binary-lacks-arch", "thin", "maybe")


def test_a_compile_target_in_a_build_list_is_not_the_gpu() -> None:
    """nvcc refusing compute_120 says the toolchain lacks the arch; whether the GPU is SM12x depends on what
    the log shows: alone "yes" (a build for the GPU it runs on), among a multi-arch target list "maybe", with
    another GPU shown "no"."""
    nvcc = "nvcc fatal   : Unsupported gpu architecture 'compute_120'\n"
    gencode = "nvcc -O3 -gencode arch=compute_120,code=sm_120 -gencode arch=compute_86,code=sm_86 -gencode arch=compute_80,code=sm_80 -c op.cu\n"

    def verdicts(lines: list[str]) -> set[str]:
        return {(f["class"], f["sm12x"]) for f in _fatal("".join(lines))}

    assert verdicts([nvcc]) == {("toolchain-lacks-arch", "yes")}
    assert verdicts([gencode, nvcc]) == {("toolchain-lacks-arch", "maybe")}
    assert verdicts(["GPU 0: NVIDIA A10G\n", gencode, nvcc]) == {("toolchain-lacks-arch", "no")}
    assert verdicts(["GPU 0: NVIDIA GeForce RTX 5090\n", gencode, nvcc]) == {("toolchain-lacks-arch", "yes")}
    assert {f["sm12x"] for f in _fatal(gencode + nvcc, signatures=[])} == {"maybe"}  # the structure says the same


def test_the_arch_a_check_got_is_the_gpu_even_after_an_arch_list() -> None:
    (f,) = _fatal("op check: expects the target in [sm_90a, sm_100a, sm_103a] but got sm_121a\n", [])
    assert f["sm12x"] == "yes"
    (f,) = _fatal("op check: expects the target in [sm_90a, sm_100a, sm_120a] but got sm_86\n", [])
    assert f["sm12x"] != "yes"


def test_healthy_lines_with_the_new_words_stay_quiet() -> None:
    healthy = [
        "INFO 01-01 10:00:00 [loader.py:1] expected 8 shards, but got 8 after the merge\n",
        "INFO 01-01 10:00:01 [ext.py:2] Loading /env/site-packages/foo_kernels/_C.so\n",
        "[2026-01-02 10:00:00 TP0] Decode batch. #running-req: 8, #token: 4096, token usage: 0.02, cuda graph: True\n",
        "The server is fired up and ready to roll!\n",
    ]
    d = diagnose(healthy, [], None)
    assert d.exit_code == 0 and not d.causes, d.render()


def test_library_names_of_new_projects_and_compiled_extensions() -> None:
    assert library_in('File "/env/site-packages/sageattention/core.py", line 9, in sageattn') == "sageattention"
    assert library_in("trtllm_batched_gemm_runner.cu:300") == "tensorrt_llm"
    assert library_in('File "/env/site-packages/myproj_cuda/ops.py", line 3') == "a compiled extension"
    assert library_in("torch._C._cuda_getDeviceCount()") is None  # torch's own extension is torch
    assert library_in("    assert x.is_cuda") is None
    assert classify_line("Not building foo as no compatible archs found")[0] == "binary-lacks-arch"


# runtimes and deployments the corpus has few of: never silent (the class is not asserted)
DIED = [
    "thread 'main' panicked at src/engine.rs:88:14:\ncalled `Result::unwrap()` on an `Err` value\n",
    "Unhandled exception. System.DllNotFoundException: Unable to load DLL 'cudnn64_9'\n",
    "Unhandled promise rejection: model worker exited\n",
    "Process exited with code -1073741819\n",
    "    Last State:     Terminated\n      Reason:       OOMKilled\n      Exit Code:    137\n",
    "pod/infer-0   0/1   CrashLoopBackOff   5 (30s ago)   4m\n",
    "CONTAINER ID   IMAGE   STATUS\n3f2a   infer   Exited (139) 2 minutes ago\n",
    "E0101 10:00:00.000000 4242 dnn.cc:9] cudnnCreate returned CUBLAS_STATUS_INVALID_VALUE\n",
]


@pytest.mark.parametrize("log", DIED)
def test_a_process_that_died_in_another_runtime_or_a_container_is_never_silent(log: str) -> None:
    found = _fatal(log, signatures=[])
    assert all(f["sm12x"] != "yes" for f in found), found
    assert_prefilter_keeps(log)


def test_an_oom_killed_container_is_out_of_memory() -> None:
    assert "out-of-memory" in {f["class"] for f in _fatal("      Reason:       OOMKilled\n", [])}


# the environment, however SM12x-looking the versions in it: a container's CUDA newer than the driver,
# packages built against another torch, a host compiler missing or too new (lines written by hand)
ENVIRONMENT = [
    "RuntimeError: CUDA error: forward compatibility was attempted on non supported HW\n",
    "cudaGetDeviceCount failed: CUDA error 804\n",
    "CUDA error: system has unsupported display driver / cuda driver combination\n",
    "Warning  FailedScheduling  0/3 nodes are available: 3 Insufficient nvidia.com/gpu.\n",
    "RuntimeError: operator torchvision::nms does not exist\n",
    "RuntimeError: Detected that PyTorch and torchvision were compiled with different CUDA major versions.\n",
    "RuntimeError: The detected CUDA version (12.1) mismatches the version that was used to compile PyTorch (12.8).\n",
    "RuntimeError: Failed to find C compiler. Please specify via CC environment variable.\n",
    "/usr/local/cuda/include/crt/host_config.h:143:2: error: #error -- unsupported GNU version! gcc versions later than 13 are not supported!\n",
    "OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root.\n",
    "/env/torch/cuda/__init__.py:9: UserWarning: CUDA initialization: The NVIDIA driver on your system is too old (found version 11040).\n",
]


@pytest.mark.parametrize("log", ENVIRONMENT)
def test_a_broken_environment_is_the_environment_never_sm12x(log: str) -> None:
    found = _fatal(log, signatures=[])
    assert "environment" in {f["class"] for f in found} and all(f["sm12x"] == "no" for f in found), found
    assert_prefilter_keeps(log, "environment")


def test_an_sm12x_arch_a_path_requires_is_not_the_device_another_arch_is_named_as() -> None:
    """"requires sm_100 or sm_120 (got sm_89)": the device is SM89, sm_120 only what the path wants; the
    same line with the device SM12x stays "yes"."""

    def verdicts(line: str) -> set[str]:
        return {f["sm12x"] for f in _fatal(line, signatures=[])}

    assert verdicts("RuntimeError: FP4 GEMM requires sm_100 or sm_120 (got sm_89)\n") == {"maybe"}
    assert verdicts("RuntimeError: kernel supports sm_120 only, current device is SM90\n") == {"maybe"}
    assert verdicts("ValueError: compute capability (8, 9) found, kernel requires sm_120\n") == {"no"}  # the GPU shown
    assert verdicts("RuntimeError: kernel supports sm_90 only, current device is sm_120\n") == {"yes"}
