# ruff: noqa: E501 (real log lines are long)
"""Whole families of fatal lines the detector used to miss, answered with no catalogue at all (only
fatal.py and the structure): Windows loader and SEH failures, C++ aborts and failed internal asserts,
CUDA errors given only by number, the kernel driver and nvidia-smi finding no GPU, absl/XLA status
codes, CUTLASS status strings, messages quoted in prose or split over two lines, logs in other
languages, warnings that are the only trace of a build without the GPU, and wrong results instead
of exceptions. Lines written here by hand from the messages those tools print (none is copied from a
corpus case). Each must never be answered with silence; where the class is clear it is checked, and
none of them may be blamed on SM12x unless the log names SM12x."""

from __future__ import annotations

import pytest

from sm120patch.triage import fatal
from sm120patch.triage.classes import classify_line
from sm120patch.triage.diagnose import diagnose
from sm120patch.triage.prefilter import Prefilter

# (class the structure must give, or None when only "not silent" is asserted; the log)
FAMILIES = [
    # Windows: loader, SEH, faulthandler, paging file
    ("environment", "OSError: [WinError 126] The specified module could not be found. Error loading \"C:\\env\\torch\\lib\\cufft64_11.dll\"\n"),
    ("environment", "ImportError: DLL load failed while importing _flash: The specified procedure could not be found.\n"),
    ("environment", "Could not load library cublasLt64_12.dll. Error code 193\n"),
    ("environment", "Unable to load libcudnn_cnn.so.9: cannot open file\n"),
    ("out-of-memory", "OSError: [WinError 1455] The paging file is too small for this operation to complete\n"),
    (None, "Windows fatal exception: access violation\n\nThread 0x00001a2c (most recent call first):\n"),
    (None, "Process finished with exit code -1073741819 (0xc0000005)\n"),
    (None, "Exception Code: 0xC0000409\n"),
    # C++ aborts and internal asserts
    (None, "libc++abi: terminating due to uncaught exception of type std::runtime_error: bad state\n"),
    (None, "Abort trap: 6\n"),
    (None, "received signal SIGSEGV, Segmentation fault.\n"),
    ("other", "!(t.is_cuda()) INTERNAL ASSERT FAILED at \"/src/aten/src/ATen/native/Foo.cpp\":88, please report a bug to PyTorch.\n"),
    (None, "Exception raised from run at /src/csrc/engine.cpp:120 (most recent call first):\n"),
    # CUDA errors by number, in any case
    ("kernel-fault", "Error in step 3: cuda error: 700 (cudaDeviceSynchronize)\n"),
    ("binary-lacks-arch", "CUDA Error 209 at kernels.cu:41\n"),
    ("kernel-fault", "cudaMemcpy failed: CUDA failure 715\n"),
    ("resource-limit", "launch failed with CUDA error code: 701\n"),
    ("toolchain-lacks-arch", "module load: CUresult 222\n"),
    # the kernel driver, nvidia-smi, containers
    ("environment", "NVRM: GPU 0000:41:00.0: RmInitAdapter failed! (0x61:0x0:1234)\n"),
    ("environment", "NVRM: This PCI I/O region assigned to your NVIDIA device is invalid: requires a reboot\n"),
    ("environment", "No NVIDIA GPUs found\n"),
    ("environment", "No CUDA devices detected\n"),
    ("environment", "docker: Error response from daemon: could not select device driver \"\" with capabilities: [[gpu]].\n"),
    # status codes, status strings, runtimes
    (None, "INTERNAL: Failed to launch the kernel on stream 0\n"),
    (None, "UNIMPLEMENTED: the op has no GPU implementation\n"),
    (None, "GEMM status: Error Invalid Problem\n"),
    (None, "2025-02-01 10:00:00.1 [E:onnxruntime:, sequential_executor.cc:516 ExecuteKernel] Non-zero status code returned while running Conv node.\n"),
    ("toolchain-lacks-arch", "numba.cuda.cudadrv.error.NvvmSupportError: GPU compute capability 12.0 is not supported\n"),
    ("toolchain-lacks-arch", "RuntimeError: PassManager::run failed\n"),
    # builds; a tool or host compiler missing is the environment, even when nvcc says it
    ("environment", "'nvcc' is not recognized as an internal or external command,\n"),
    ("environment", "bash: ptxas: command not found\n"),
    ("environment", "nvcc fatal   : Cannot find compiler 'cl.exe' in PATH\n"),
    (None, "*** Check failure stack trace: ***\n"),
    (None, "ninja: build stopped: subcommand failed.\n"),
    (None, "make[2]: *** [CMakeFiles/ext.dir/build.make:76: ext.o] Error 1\n"),
    # quoted in prose, split over two lines
    (None, '"Error Internal"\n'),
    ("resource-limit", "tvm.error.InternalError: Launch of kernel main_kernel failed: requested\ndynamic shared memory of 200 KB per block\n"),
    # other languages
    (None, "推理失败，请检查日志\n"),
    ("out-of-memory", "CUDA 显存不足，请减小批大小\n"),
    ("environment", "OSError: [WinError 126] 找不到指定的模块。\n"),
    (None, "运行时发生异常\n"),
    (None, "エラーが発生しました: モデルを読み込めません\n"),
    (None, "모델 로드 실패\n"),
    (None, "Fehler beim Laden des Modells\n"),
    (None, "Ошибка: не удалось загрузить модель\n"),
    ("arch-path-unsupported", "错误: 当前 GPU 架构 sm_120 不支持该算子\n"),
    # wrong results instead of exceptions
    (None, "step 120: loss=nan, lr=1e-4\n"),
    (None, "The output images are all black\n"),
    (None, "NaNs detected in the attention output\n"),
    (None, '{"id": "cmpl-1", "choices": [{"text": "!!!!!!!!!!!!!!!!!!!!!!!!"}]}\n'),
    (None, "Generated: <unk><unk><unk><unk><unk><unk>\n"),
    # the compiler's own source refusing the arch: a toolchain, not a path in the program
    ("toolchain-lacks-arch", "python: /src/lib/Conversion/TritonGPUToLLVM/DotOpToLLVM.cpp:90: Assertion `false && \"Unsupported compute capability\"' failed.\n"),
    # a kernel that says which archs it is for, and one built for others
    ("arch-path-unsupported", "kernel fused_attn_fwd is for sm_90a, but the device is sm_120\n"),
    ("binary-lacks-arch", "Error: module compiled for sm_80-sm_90, but running on sm_120\n"),
    # a platform refusal without an arch named
    ("arch-path-unsupported", "ValueError: The selected backend is not valid for the current device\n"),
    # no GPU for the program, a library at another version than the build, an extension without the arch
    ("environment", ">>> torch.cuda.is_available()  # returned False on the new box\nCUDA available: False\n"),
    ("environment", "E0101 10:00:00.1 1 dnn.cc:9] Loaded runtime cuDNN library: 8.6.0 but source was compiled with: 9.3.0.\n"),
    ("binary-lacks-arch", "RuntimeError: Could not find a compatible fooext build for compute capability 12.0\n"),
    # only a warning, but nothing can run on the GPU after it; nvidia-smi's ERR! fields; a paste that lost its newlines
    ("environment", "/env/torch/cuda/__init__.py:99: UserWarning: CUDA initialization: Found no NVIDIA driver on your system.\n"),
    (None, "| N/A   ERR!  P0   ERR! / 450W |  0MiB / 32607MiB |  ERR!  Default |\n"),
    (None, '  File "run.py", line 9, in <module>    main()ValueError: bad config\n'),
    # a build without the arch, a compiler that does not know it, a GPU a library refuses (a path, not a build)
    ("binary-lacks-arch", "RuntimeError: No CUDA kernel for arch sm_120 in this build\n"),
    ("binary-lacks-arch", "/env/fooext/__init__.py:9: UserWarning: fooext was built for a lower compute capability (80) than this GPU's (120)\n"),
    ("toolchain-lacks-arch", "RuntimeError: Internal Triton PTX codegen error\n"),
    ("toolchain-lacks-arch", "tvm.error.InternalError: Unknown target sm_120\n"),
    ("arch-path-unsupported", "RuntimeError: This GPU (sm_120) is not supported by FooAttention\n"),
    # a kernel named for an arch that the build left out; a requirement "GPUs with capability X" is not the device
    ("binary-lacks-arch", "AssertionError: SM90 kernels are not available. Use GPUs with compute capability 9.0.\n"),
    # pasted into a forum or scraped from a page: escaped underscores, HTML entities, full-width colons
    ("arch-path-unsupported", "RuntimeError: kernel is not supported on sm\\_120\n"),
    ("arch-path-unsupported", "Feature &#39;.tile::gather4&#39; not supported on .target &#39;sm_120a&#39;\n"),
    (None, "RuntimeError\uff1a something went wrong\n"),
    # a requirement written after the capability is not the device either
    ("arch-path-unsupported", "RuntimeError: Device compute capability 8.9 or higher required for FP8 execution.\n"),
    # an assert on the capability
    ("arch-path-unsupported", "    assert is_sm90_supported(), 'needs Hopper'\nAssertionError\n"),
    ("arch-path-unsupported", "Check failed: cc_major >= 9 (12 vs. 9)\n"),
]


def _fatal(log: str) -> list[dict]:
    d = diagnose(log.splitlines(keepends=True), [], None, signatures=[]).to_dict()
    assert not (d["exit_code"] == 0 and not [f for f in d["findings"] if f["fatal"]]), f"silent: {log!r}"
    return [f for f in d["findings"] if f["fatal"]]


@pytest.mark.parametrize(("cls", "log"), FAMILIES, ids=lambda x: x if isinstance(x, str) and len(x) < 3 else None)
def test_a_fatal_family_is_never_silent_and_shows_its_class(cls: str | None, log: str) -> None:
    found = _fatal(log)
    if cls is not None:
        assert cls in {f["class"] for f in found}, (log, found)
    sm12x_named = any(t in log for t in ("sm_120", "sm\\_120", "12.0", "(12 vs"))
    assert sm12x_named or all(f["sm12x"] != "yes" for f in found), (log, found)


@pytest.mark.parametrize(("cls", "log"), FAMILIES)
def test_the_prefilter_keeps_every_family(cls: str | None, log: str) -> None:
    assert diagnose(log.splitlines(True), [], None).to_dict() == diagnose(
        log.splitlines(True), [], None, prefilter=False
    ).to_dict()


def test_a_warning_that_the_package_lacks_the_gpu_answers_a_wrong_result() -> None:
    """No exception at all: the package warned that it does not support the GPU's capability, and the
    numbers came out wrong. The warning is the answer, thinly (a build without the arch)."""
    log = (
        "W0101 10:00:00.000000  1234 device.cc:50] The compute capability of this machine is 120, which is not "
        "supported by Foolib; install the corresponding wheel for your GPU.\n"
        "result: [0. 0. 0.]\n"
    )
    (f,) = _fatal(log)
    assert (f["class"], f["evidence"]) == ("binary-lacks-arch", "thin") and f["sm12x"] == "maybe"


def test_a_tool_named_in_a_warning_counts_only_when_the_line_speaks_against_it() -> None:
    bad = "W0101 10:00:00.1 1 asm.cc:2] Falling back to the driver; ptxas does not support CC 10.3\n"
    (f,) = _fatal(bad)
    assert f["class"] == "toolchain-lacks-arch" and f["sm12x"] != "yes"
    healthy = "W0101 10:00:00.1 1 asm.cc:2] Used ptxas at /usr/local/cuda/bin/ptxas\n"
    d = diagnose([healthy], [], None, signatures=[])
    assert d.exit_code == 0 and not d.causes


def test_healthy_lines_with_the_new_words_stay_quiet() -> None:
    healthy = [
        "INFO 01-01 10:00:00 [loader.py:10] Loading weights took 3.1 s (nan-safe softmax enabled)\n",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  575.51.03\n",
        "WARNING 01-01 10:00:01 [layer.py:52] Xformers is not available, falling back.\n",
        "[2026-01-02 10:00:00 TP0] Decode batch. #running-req: 8, #token: 4096, token usage: 0.02, cuda graph: True\n",
        "The server is fired up and ready to roll!\n",
    ]
    d = diagnose(healthy, [], None)
    assert d.exit_code == 0 and not d.causes, d.render()


def test_classes_of_the_new_cues_on_single_lines() -> None:
    assert classify_line("AttributeError: 'NoneType' object has no attribute 'shape'") == (
        "other",
        "'NoneType' object has no attribute",
    )
    assert classify_line("AttributeError: module 'triton' has no attribute 'language'")[0] == "environment"
    assert classify_line("LLVM ERROR: Cannot select: intrinsic %llvm.nvvm.wgmma.fence.sync.aligned")[0] == (
        "arch-path-unsupported"
    )
    assert classify_line("ptxas error   : Feature 'cluster' requires .target sm_90 or higher")[0] == (
        "arch-path-unsupported"
    )
    assert fatal.classify('"Error Internal"') is not None
    assert fatal.classify("INFO 01-01 10:00:00 [x.py:1] loss=nan at warmup step") is None  # INFO never fatal


def test_a_requirement_names_no_device_and_a_cutlass_status_names_cutlass() -> None:
    from sm120patch.triage.logkind import LogKind

    kind = LogKind()
    kind.feed(1, "AssertionError: SM90 kernels are not available. Use GPUs with compute capability 9.0.")
    assert kind.gpu == "unknown"
    (f,) = _fatal("RuntimeError: gemm run failed: Error Internal\n")
    assert f["details"].get("library") == "cutlass" and f["sm12x"] != "yes"


def test_new_prefilter_words_are_lower_case() -> None:
    from sm120patch.triage.prefilter import KEYWORDS

    assert all(w == w.lower() for w in KEYWORDS)
    assert Prefilter().passes("推理失败") and Prefilter().passes("Fehler beim Laden")


def test_a_12_1_gpu_warned_against_a_build_up_to_12_0_is_not_proof_of_missing_kernels() -> None:
    """CUDA runs a cubin built for X.y on every X.z with z >= y: sm_120 code runs on a 12.1 GPU, so the
    PyTorch warning alone stays "maybe" even on a log that shows the GB10 (the range is not read: if the
    build really lacks the GPU, the "no kernel image" that follows says so); a 12.0 GPU is still "yes"."""

    def verdict(cap: str, gpu: str, top: str) -> str:
        lines = [
            f"UserWarning: Found GPU0 NVIDIA {gpu} which is of cuda capability {cap}.\n",
            f"    Minimum and Maximum cuda capability supported by this version of PyTorch is (7.0) - ({top})\n",
        ]
        (f,) = [f for f in diagnose(lines, [], None).findings if f.signature == "torch-capability-outside-build"]
        return f.sm12x

    assert verdict("12.1", "GB10", "12.0") == "maybe"
    assert verdict("12.0", "GeForce RTX 5090", "9.0") == "yes"
    assert verdict("6.1", "GeForce GTX 1080", "12.0") == "no"
