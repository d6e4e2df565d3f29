# ruff: noqa: E501 (real log lines are long)
"""The classifier on other wordings of the failures the corpus holds: the same cause written the
way another library, framework or log format writes it (sm120, SM 12.0, (12, 1), "not implemented
for", cuBLAS/cuDNN status names, Xid lines, loguru/glog prefixes), with no catalogue signature at
all, so only the structure answers. Negatives: a driver that is not loaded, NCCL, OOM or a model
error on an RTX 5090 is never blamed on SM12x. Lines written here by hand, from the messages the
libraries print; none comes from a held-out corpus case."""

from __future__ import annotations

import pytest

from sm120patch.triage.diagnose import diagnose

G5090 = "Device 0: NVIDIA GeForce RTX 5090, compute capability 12.0\n"
CASES = [
    # (class, SM12x cause, log)
    # (class, sm12x expected (True: not 'no'; False: must not be 'yes'), log)
    (
        "binary-lacks-arch",
        True,
        "torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device\n",
    ),
    (
        "binary-lacks-arch",
        True,
        "CUDA failure 209: no kernel image is available for execution on the device ; GPU=0 ; hostname=x ; file=/onnxruntime/core/providers/cuda/cuda_call.cc ; line=129 ; expr=cudaLaunchKernel\n",
    ),
    (
        "binary-lacks-arch",
        True,
        "RuntimeError: parallel_for failed: cudaErrorNoKernelImageForDevice: no kernel image is available for execution on the device\n",
    ),
    (
        "binary-lacks-arch",
        True,
        "NVIDIA GeForce RTX 5070 Ti with CUDA capability sm_120 is not compatible with the current PyTorch installation.\nThe current PyTorch install supports CUDA capabilities sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90.\n",
    ),
    (
        "binary-lacks-arch",
        True,
        "UserWarning: Found GPU0 NVIDIA GeForce RTX 5080 which is of cuda capability 12.0.\n    PyTorch no longer supports this GPU because it is too old.\n    The minimum cuda capability supported by this library is 3.7.\n",
    ),
    (
        "binary-lacks-arch",
        True,
        "2025-03-01 10:00:00.000 E tensorflow/core/common_runtime: TensorFlow was not built with CUDA kernel binaries compatible with compute capability 12.0. CUDA kernels will be jit-compiled from PTX\nInternalError: Failed to launch kernel: CUDA_ERROR_INVALID_HANDLE\n",
    ),
    ("binary-lacks-arch", True, "Error named symbol not found at line 449 in file /src/csrc/ops.cu\n"),
    (
        "binary-lacks-arch",
        True,
        "[TRT] [E] 1: [defaultAllocator.cpp::allocate::20] Error Code 1: Cuda Runtime (no kernel image is available for execution on the device)\n",
    ),
    (
        "binary-lacks-arch",
        True,
        "RuntimeError: CUDA error: invalid device function\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n",
    ),
    (
        "binary-lacks-arch",
        True,
        "ggml_cuda_compute_forward: GET_ROWS failed\nCUDA error: no kernel image is available for execution on the device\n  current device: 0, in function ggml_cuda_compute_forward at ggml-cuda.cu:2300\n",
    ),
    ("binary-lacks-arch", True, "RuntimeError: CUBLAS_STATUS_ARCH_MISMATCH when calling `cublasCreate(handle)`\n"),
    ("binary-lacks-arch", True, "cuDNN error: CUDNN_STATUS_ARCH_MISMATCH\n"),
    (
        "binary-lacks-arch",
        True,
        "RuntimeError: The detected CUDA arch sm_120 is not in the list of architectures this extension was built for: 8.0;8.6;9.0\n",
    ),
    (
        "binary-lacks-arch",
        True,
        "Error: the prebuilt binary has no kernels for sm_120; rebuild with CMAKE_CUDA_ARCHITECTURES=120\n",
    ),
    # arch-path-unsupported
    ("arch-path-unsupported", True, "RuntimeError: Unsupported SM version: 120\n"),
    ("arch-path-unsupported", True, "AssertionError: DeepGEMM only supports SM90 and SM100\n"),
    ("arch-path-unsupported", True, "NotImplementedError: FP8 block-scaled GEMM is not implemented for SM120\n"),
    ("arch-path-unsupported", True, "ValueError: GPU with compute capability 12.0 is not supported by this kernel\n"),
    (
        "arch-path-unsupported",
        True,
        "[TensorRT-LLM][ERROR] Assertion failed: Unsupported SM version (/src/cpp/tensorrt_llm/kernels/x.cu:88)\n",
    ),
    (
        "arch-path-unsupported",
        True,
        "RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasGemmEx( handle, opa, opb, m, n, k, &falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, c, CUDA_R_16BF, ldc, CUDA_R_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP)`\n"
        + G5090,
    ),
    ("arch-path-unsupported", True, "RuntimeError: This kernel requires compute capability 9.0 or 10.0, got 12.0\n"),
    ("arch-path-unsupported", True, "RuntimeError: sm120 is not supported yet\n"),
    ("arch-path-unsupported", True, "Exception: Blackwell (sm_120) GPUs are not supported by this version of mamba\n"),
    ("arch-path-unsupported", True, "RuntimeError: FlashAttention-3 only supports Hopper GPUs\n" + G5090),
    ("arch-path-unsupported", True, "ValueError: Marlin kernels are not available on device capability (12, 0)\n"),
    ("arch-path-unsupported", True, "RuntimeError: No suitable kernel found for arch 120\n"),
    ("arch-path-unsupported", True, "ERROR: the CUTLASS MoE kernel does not support SM 12.0\n"),
    ("arch-path-unsupported", True, "torch._C._LinAlgError: unsupported on this GPU architecture (sm_121)\n"),
    ("arch-path-unsupported", True, "RuntimeError: TMA multicast is not available on GeForce Blackwell (RTX 50xx)\n"),
    ("arch-path-unsupported", True, "RuntimeError: Expected capability (10, 0) but got (12, 1)\n"),
    (
        "arch-path-unsupported",
        True,
        "NotImplementedError: mxfp4 MoE is not implemented for the current device (SM120)\n",
    ),
    # toolchain
    ("toolchain-lacks-arch", True, "ptxas fatal   : Value 'sm_120a' is not defined for option 'gpu-name'\n"),
    ("toolchain-lacks-arch", True, "nvcc fatal   : Unsupported gpu architecture 'compute_120'\n"),
    ("toolchain-lacks-arch", True, "'sm_121a' is not a recognized processor for this target (ignoring processor)\n"),
    (
        "toolchain-lacks-arch",
        True,
        "CUDA error: the provided PTX was compiled with an unsupported toolchain.\n" + G5090,
    ),
    (
        "toolchain-lacks-arch",
        True,
        "RuntimeError: Internal Triton PTX codegen error: `ptxas` stderr:\nptxas fatal : Value 'sm_121a' is not defined for option 'gpu-name'\n",
    ),
    ("toolchain-lacks-arch", True, "nvrtc: error: invalid value for --gpu-architecture (-arch)\n" + G5090),
    (
        "toolchain-lacks-arch",
        True,
        'CMake Error at CMakeLists.txt:12 (project): CUDA_ARCHITECTURES is set to "120" but nvcc 12.4 does not support it\n',
    ),
    # resource
    (
        "resource-limit",
        True,
        "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 131072, Hardware limit: 101376. Reducing block sizes or `num_stages` may help.\n"
        + G5090,
    ),
    ("resource-limit", True, "RuntimeError: CUDA error: too many resources requested for launch\n" + G5090),
    (
        "resource-limit",
        True,
        "RuntimeError: Failed to set max dynamic shared memory size to 232448 on device with capability 12.0\n",
    ),
    # kernel faults
    ("kernel-fault", True, "RuntimeError: CUDA error: an illegal instruction was encountered\n" + G5090),
    (
        "kernel-fault",
        True,
        "NVRM: Xid (PCI:0000:01:00): 13, pid=1234, name=python, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Illegal Instruction Encoding\n",
    ),
    (
        "kernel-fault",
        True,
        "NVRM: Xid (PCI:0000:01:00): 31, pid=1234, name=python, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_00000000\n",
    ),
    ("kernel-fault", True, "RuntimeError: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx(...)`\n" + G5090),
    ("kernel-fault", True, "torch.AcceleratorError: CUDA error: unspecified launch failure\n" + G5090),
    # negatives: must not be 'yes'
    (
        "environment",
        False,
        G5090
        + "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n",
    ),
    (
        "environment",
        False,
        G5090
        + "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a driver from http://www.nvidia.com/Download/index.aspx\n",
    ),
    ("environment", False, G5090 + "RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu.\n"),
    (
        "environment",
        False,
        "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 570.133\n" + G5090,
    ),
    (
        "environment",
        False,
        G5090 + "RuntimeError: The NVIDIA driver on your system is too old (found version 12020).\n",
    ),
    (
        "environment",
        False,
        G5090
        + "nvidia-container-cli: initialization error: load library failed: libnvidia-ml.so.1: cannot open shared object file: no such file or directory: unknown\n",
    ),
    ("environment", False, G5090 + "CUDA error: CUDA-capable device(s) is/are busy or unavailable\n"),
    ("environment", False, G5090 + "RuntimeError: CUDA error: system not yet initialized\n"),
    (
        "environment",
        False,
        G5090
        + "NVRM: The NVIDIA probe routine failed for 1 device(s).\nNVRM: None of the NVIDIA devices were initialized.\n",
    ),
    (
        "environment",
        False,
        G5090
        + "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling NumCudaDevices() that might have already set an error? Error 802: system not yet initialized\n",
    ),
    (
        "out-of-memory",
        False,
        G5090
        + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 31.36 GiB\n",
    ),
    (
        "communication",
        False,
        G5090
        + "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled cuda error\n",
    ),
    (
        "other",
        False,
        G5090
        + "ValueError: The checkpoint you are trying to load has model type `qwen3` but Transformers does not recognize this architecture.\n",
    ),
    ("other", False, G5090 + "KeyError: 'model.layers.0.mlp.experts.w13_weight'\n"),
    ("other", False, G5090 + "Error: unknown architecture 'gemma3n'\n"),
    (
        "environment",
        False,
        G5090 + "RuntimeError: Unsupported model architecture: LlamaForCausalLMX is not supported for now\n",
    ),
]


NEGATIVES_MORE = [
    G5090 + "AssertionError: Torch not compiled with CUDA enabled\n",
    G5090
    + "RuntimeError: CUDA unknown error - this may be due to an incorrectly set up environment, e.g. changing env variable CUDA_VISIBLE_DEVICES after program start.\n",
]


def test_more_negatives_are_not_blamed_on_sm12x() -> None:
    for log in NEGATIVES_MORE:
        found = _fatal(log, None)
        assert found and all(f["class"] == "environment" and f["sm12x"] != "yes" for f in found), found


def _fatal(log: str, signatures: list | None) -> list[dict]:
    d = diagnose(log.splitlines(keepends=True), [], None, signatures=signatures).to_dict()
    assert d["exit_code"] == 1 or d["findings"], f"silent on {log!r}"
    return [f for f in d["findings"] if f["fatal"]]


@pytest.mark.parametrize(("cls", "sm12x", "log"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_structure_alone_names_the_class(cls: str, sm12x: bool, log: str) -> None:
    found = _fatal(log, [])
    if sm12x:
        assert any(f["class"] == cls and f["sm12x"] != "no" for f in found), found
    else:
        assert found and not any(f["sm12x"] == "yes" for f in found), found


@pytest.mark.parametrize(("cls", "sm12x", "log"), [c for c in CASES if not c[1]])
def test_with_the_catalogue_a_negative_is_never_blamed_on_sm12x(cls: str, sm12x: bool, log: str) -> None:
    assert not any(f["sm12x"] == "yes" for f in _fatal(log, None))


# The structure rules beyond single wordings (each line written here, none in the catalogue).
RULES = [
    (
        "resource-limit",
        "[TensorRT-LLM][ERROR] CUDA runtime error in cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448): invalid argument\n",
    ),
    ("arch-path-unsupported", "RuntimeError: No such operator _C::cutlass_scaled_mm_sm120\n"),
    ("arch-path-unsupported", "AttributeError: module 'sgl_kernel' has no attribute 'fp8_blockwise_scaled_mm_sm120'\n"),
    ("toolchain-lacks-arch", "RuntimeError: nvJitLink error: NVJITLINK_ERROR_PTX_COMPILE\n"),
    ("binary-lacks-arch", "RuntimeError: CUTLASS error: Error Arch Mismatch\n"),
    ("arch-path-unsupported", "RuntimeError: Unsupported dtype for this architecture\n"),
    ("resource-limit", "ptxas error   : Entry function '_fwd' uses too much shared data (0x1c000 bytes, 0xc000 max)\n"),
    ("kernel-fault", "CUDA Exception: Warp Illegal Address\n"),
    ("toolchain-lacks-arch", "clang: error: unsupported CUDA gpu architecture: sm_120\n"),
    (
        "arch-path-unsupported",
        "ValueError: type fp8e4nv not supported in this architecture. The supported fp8 dtypes are ('fp8e4b15', 'fp8e5')\n",
    ),
    ("arch-path-unsupported", "RuntimeError: FlashAttention-2 doesn't support sm_120 yet\n"),
    ("binary-lacks-arch", "RuntimeError: the fused MoE kernels for sm_120 are missing from this wheel\n"),
    (
        "binary-lacks-arch",
        "RuntimeError: cuDNN Frontend error: [cudnn_frontend] Error: No execution plans support the graph.\n",
    ),
    ("kernel-fault", "RuntimeError: CUDA error: the launch timed out and was terminated\n"),
    ("resource-limit", "RuntimeError: CUDA error: too many blocks in cooperative launch\n"),
    # the assembler knows the arch, the code uses a feature it lacks: an arch path, not an old toolchain
    (
        "arch-path-unsupported",
        "ptxas /tmp/x.ptx, line 9; error   : Instruction 'wgmma.mma_async' not supported on .target 'sm_120'\nptxas fatal   : Ptx assembly aborted due to errors\n",
    ),
    # a build that left an arch's kernels out
    (
        "arch-path-unsupported",
        "ImportError: /site-packages/foo/_ops.so: undefined symbol: _Z17grouped_gemm_sm100RN2at6TensorE\n",
    ),
    # an arch line just before a kernel fault names its cause
    (
        "arch-path-unsupported",
        "kernel dispatch: this tile config only runs on sm_90a\nRuntimeError: CUDA error: unspecified launch failure\n",
    ),
    # a bare exception with a kernel library's arch-specific frame below it (C++ style)
    (
        "arch-path-unsupported",
        "RuntimeError: Check failed: status == 0 (7 vs. 0)\n  at cutlass::gemm::kernel::GemmSm100::run(Params const&)\n",
    ),
    # a refusal word next to an arch token, in any wording
    ("arch-path-unsupported", "RuntimeError: fused rope cannot run here: SM 12.1 needs the portable path\n"),
]


@pytest.mark.parametrize(("cls", "log"), RULES, ids=[f"rule-{i}" for i in range(len(RULES))])
def test_structure_rules(cls: str, log: str) -> None:
    assert any(f["class"] == cls and f["sm12x"] != "no" for f in _fatal(log, [])), _fatal(log, [])


def test_an_arch_list_names_no_gpu_and_a_requirement_is_not_the_device() -> None:
    # a torch build's arch list mentions sm_120: on a Jetson that is no SM12x evidence
    log = "arch_list: ['sm_80', 'sm_90', 'sm_100', 'sm_120']\nRuntimeError: CUDA error: no kernel image is available\n"
    assert not any(f["sm12x"] == "yes" for f in _fatal(log, []))
    # "only supported on H100" is what the path needs; the RTX 5090 is the device
    log = G5090 + "RuntimeError: this MLA kernel is only supported on H100 and B200 (SM90/SM100)\n"
    assert any(f["class"] == "arch-path-unsupported" and f["sm12x"] == "yes" for f in _fatal(log, None))


def test_a_symptom_the_catalogue_names_does_not_hide_an_sm12x_arch_line() -> None:
    log = "ModuleNotFoundError: No module named 'deep_gemm'\nRuntimeError: fp8 block-scaled MoE is not implemented for SM120\n"
    got = {(f["class"], f["sm12x"]) for f in _fatal(log, None)}
    assert ("environment", "no") in got and ("arch-path-unsupported", "yes") in got
    # without an SM12x line, the symptom stays the only answer (a GPU shown is no arch cause)
    log = "ModuleNotFoundError: No module named 'deep_gemm'\nDevice 0: NVIDIA GeForce RTX 5090\n"
    assert {(f["class"], f["sm12x"]) for f in _fatal(log, None)} == {("environment", "no")}


def test_a_bare_check_in_a_kernel_library_is_a_thin_arch_path_unless_another_gpu_is_shown() -> None:
    log = 'File "/x/site-packages/flashinfer/decode.py", line 9, in run\nRuntimeError: Check failed: (ok) is false\n'
    (f,) = _fatal(log, [])
    assert (f["class"], f["sm12x"], f["evidence"]) == ("arch-path-unsupported", "maybe", "thin")
    (f,) = _fatal("GPU 0: NVIDIA H100 80GB HBM3\n" + log, [])
    assert f["class"] == "other"


@pytest.mark.parametrize(
    "line",
    [
        "`RuntimeError: flash_fwd failed`",  # quoted in a forum post
        "Bus error (core dumped)",
        "× python setup.py bdist_wheel did not run successfully.",
        "  exit code: 1",
    ],
)
def test_more_ways_a_log_says_it_failed_are_never_silent(line: str) -> None:
    assert diagnose([line + "\n"], [], None).exit_code == 1


def test_the_gpu_is_read_from_more_ways_of_writing_its_capability() -> None:
    for line in (
        "UserWarning: Found GPU0 NVIDIA X which is of compute capability (CC) 12.0.",
        "torch.cuda.get_device_capability() -> (12, 1)",
        "GPU: sm_120",
    ):
        assert diagnose([line + "\n"], [], None).gpu["gpu"] == "sm12x", line


def test_the_library_is_read_from_so_paths() -> None:
    from sm120patch.triage.classes import library_in

    assert library_in("OSError: /opt/x/libflashinfer.so: cannot open shared object file") == "flashinfer"
    assert library_in("  #3 0x7f3a in ggml_cuda_op() from libggml-cuda.so") == "llama.cpp/ggml"
    assert library_in("[TRT] [E] /usr/lib/x86_64-linux-gnu/libnvinfer.so.10: error") == "tensorrt"


def test_the_prefilter_keeps_every_line_these_rules_need() -> None:
    logs = [c[2] for c in CASES] + [r[1] for r in RULES] + NEGATIVES_MORE
    for log in logs:
        lines = log.splitlines(keepends=True)
        on = [(f.signature, f.cls, f.sm12x) for f in diagnose(lines, [], None).findings]
        off = [(f.signature, f.cls, f.sm12x) for f in diagnose(lines, [], None, prefilter=False).findings]
        assert on == off, log


def test_a_bare_crash_long_after_a_build_warned_it_lacks_the_gpu_is_answered_by_that_warning() -> None:
    warn = (
        "/x/torch/cuda/__init__.py:230: UserWarning: NVIDIA GeForce RTX 5090 with CUDA capability sm_120 "
        "is not compatible with the current PyTorch installation.\n"
    )
    log = (
        warn
        + "INFO loading weights\n" * 30
        + "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    (f,) = _fatal(log, [])
    assert (f["class"], f["evidence"]) == ("binary-lacks-arch", "thin") and f["sm12x"] != "no"
