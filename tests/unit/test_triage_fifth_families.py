# ruff: noqa: E501 (real log lines are long)
"""Families the fifth round of issue 23 added, for logs from projects the corpus has never seen: a failing
line that names a GPU kernel operation (a GEMM, a MoE runner, an FP4 kernel) with no library named, no usable
backend left for the GPU, a feature that only FlashAttention 3 (a Hopper path) provides, shared memory that
could not be set however it is cased, a CUDA "invalid argument" raised from a kernel's own source, the
runtime's invalid-PTX error, a GPU that a CUDA version does not fully support yet, a build's arch in the
failing line, and the libraries Transformer Engine, CUDA.jl and FA3. Lines written here by hand from the
shapes those tools print (none is copied from a corpus case); the catalogue is off, so only fatal.py and the
structure answer. None may be silent, each shows its class, and none may say SM12x "yes" unless the log
names SM12x."""

from __future__ import annotations

import pytest

from sm120patch.triage.classes import classify_line, library_in
from sm120patch.triage.diagnose import diagnose
from tests.unit.triage_lines import assert_prefilter_keeps

# (class the structure must give; the log)
FAMILIES = [
    # a kernel operation failed, no library and no arch named: on an SM12x (or unnamed) GPU an arch path, thinly
    ("arch-path-unsupported", "RuntimeError: grouped GEMM launch did not complete\n"),
    ("arch-path-unsupported", "GPU 0: NVIDIA GeForce RTX 5070\nRuntimeError: MoE runner returned status 7\n"),
    ("arch-path-unsupported", "RuntimeError: failed to pick an NVFP4 tile shape\n"),
    # no backend left that can run on the GPU
    ("arch-path-unsupported", "RuntimeError: No usable attention backend was found for this model\n"),
    ("arch-path-unsupported", "RuntimeError: none of the registered kernels are available on sm121\n"),
    # a feature only FlashAttention 3 (Hopper) provides, or one that needs FlashMLA / DeepGEMM
    ("arch-path-unsupported", "AssertionError: sliding-window decode is only supported with FA3\n"),
    ("arch-path-unsupported", "ValueError: This attention layout requires FlashAttention-3\n"),
    ("arch-path-unsupported", "NotImplementedError: the MLA decode here needs FlashMLA\n"),
    # shared memory that could not be set or is too large, however cased
    ("resource-limit", "[kernels] ERROR: Unable to set the Dynamic Shared Memory attribute for conv_fwd\n"),
    ("resource-limit", "RuntimeError: requested Shared Memory is too large for tile 256x128\n"),
    # a CUDA call in a kernel's own source returned invalid argument (message split over two lines)
    ("resource-limit", "RuntimeError: /src/csrc/attn/paged_fwd.cu:377\n  in function launch_paged: CUDA Error: invalid argument\n"),
    # the runtime's name for PTX the driver cannot take: the binary carries no code this GPU runs
    ("binary-lacks-arch", "Fatal: CUDA failure: CUDA_ERROR_INVALID_PTX (a PTX JIT compilation failed) in op_matmul\n"),
    # a GPU a CUDA version does not (fully) support yet, then a bare failure
    ("toolchain-lacks-arch", "Warning: your GPU (compute capability 12.0) is not fully supported by CUDA 12.6.\nERROR: module load failed\n"),
    # the build's arch named in the failing line
    ("binary-lacks-arch", "kernel suite built for 90a: got an error from the runner: Error Internal\n"),
    # the driver could not load a kernel module the binary carries
    ("binary-lacks-arch", "RuntimeError: cuModuleLoadData(&mod, image) failed with CUDA_ERROR_UNKNOWN\n"),
    ("binary-lacks-arch", "ERROR: Failed to load the CUDA module for kernel 'blur_v'\n"),
    # the GPU itself said not to support what the code asks for
    ("arch-path-unsupported", "RuntimeError: this device does not support the bulk tensor copy needed by the kernel\n"),
    # the CUDA error code name for "invalid argument", from a kernel's own source
    ("resource-limit", "GPU 0: NVIDIA GeForce RTX 5090\nterminate called: kernels/attn_fwd.cuh:88: cudaErrorInvalidValue\n"),
    # no kernel, implementation or tactic to be found for the problem
    ("arch-path-unsupported", "RuntimeError: Unable to find a matmul kernel for this problem shape on the device\n"),
    ("arch-path-unsupported", "RuntimeError: fp8 blockwise implementation for the current device not found\n"),
    # a math library's bare failure is a kernel library's (thin); its allocation failure is memory
    ("arch-path-unsupported", "RuntimeError: cuBLASLt returned an unexpected status 15 from the heuristic query\n"),
    ("out-of-memory", "RuntimeError: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`\n"),
    # a failing line that lists the capabilities the path requires
    ("arch-path-unsupported", "NotImplementedError: fused_topk: Required capability: 90, 100 or 103\n"),
]


def _fatal(log: str, signatures: list | None = None) -> list[dict]:
    d = diagnose(log.splitlines(keepends=True), [], None, signatures=signatures).to_dict()
    assert not (d["exit_code"] == 0 and not [f for f in d["findings"] if f["fatal"]]), f"silent: {log!r}"
    return [f for f in d["findings"] if f["fatal"]]


@pytest.mark.parametrize(("cls", "log"), FAMILIES)
def test_a_fifth_round_family_is_never_silent_and_shows_its_class(cls: str, log: str) -> None:
    found = _fatal(log, signatures=[])
    assert cls in {f["class"] for f in found}, (log, found)
    sm12x_named = any(t in log for t in ("sm121", "12.0"))
    assert sm12x_named or all(f["sm12x"] != "yes" for f in found), (log, found)


@pytest.mark.parametrize(("cls", "log"), FAMILIES)
def test_the_prefilter_keeps_every_fifth_round_family(cls: str, log: str) -> None:
    assert_prefilter_keeps(log, cls)


NONE_IN_CUTE = 'File "/env/site-packages/mykern/epilogue.py", line 90, in store\n    cpasync.make_tiled_copy(op)\nAttributeError: \'NoneType\' object has no attribute \'layout\'\n'


def test_a_value_left_none_in_a_kernel_library_is_a_thin_arch_path_on_sm12x_only() -> None:
    (f,) = _fatal(NONE_IN_CUTE, [])
    assert (f["class"], f["evidence"], f["sm12x"]) == ("arch-path-unsupported", "thin", "maybe")
    (f,) = _fatal("GPU 0: NVIDIA H100 80GB HBM3\n" + NONE_IN_CUTE, [])
    assert f["class"] == "other" and f["sm12x"] == "no"
    (f,) = _fatal("AttributeError: 'NoneType' object has no attribute 'layout'\n", [])
    assert f["class"] == "other"


def test_a_kernel_operation_failing_on_another_gpu_stays_other() -> None:
    (f,) = _fatal("GPU 0: NVIDIA H100 80GB HBM3\nRuntimeError: MoE runner returned status 7\n", [])
    assert f["class"] == "other" and f["sm12x"] == "no"


def test_invalid_argument_outside_a_kernel_source_is_not_a_resource_limit() -> None:
    # seventh round: a bare "CUDA error: invalid argument" with no GPU shown is a thin resource limit ("maybe",
    # never "yes"); with a call named outside a kernel's source it is not, and on another GPU it never is
    (f,) = _fatal("RuntimeError: CUDA error: invalid argument\n", [])
    assert (f["class"], f["evidence"], f["sm12x"]) == ("resource-limit", "thin", "maybe")
    (f,) = _fatal("RuntimeError: cudaMemcpyAsync(dst, src) failed: CUDA error: invalid argument (ptr was null)\n", [])
    assert f["class"] != "resource-limit"
    (f,) = _fatal("GPU 0: NVIDIA A100-SXM4-80GB\nRuntimeError: /src/op.cu:12 in launch: CUDA Error: invalid argument\n", [])
    assert f["class"] != "resource-limit" and f["sm12x"] == "no"


def test_a_required_capability_list_next_to_nothing_compiled_stays_the_build() -> None:
    got = classify_line("NotImplementedError: No compiled fused_topk for device capability: 120. Required capability: 90")
    assert got is not None and got[0] == "binary-lacks-arch"


def test_peer_access_the_device_does_not_support_stays_communication() -> None:
    found = _fatal("GPU 0: NVIDIA GeForce RTX 5090\nRuntimeError: this device does not support peer access to GPU 1\n", [])
    assert {f["class"] for f in found} == {"communication"} and all(f["sm12x"] != "yes" for f in found)


def test_healthy_lines_with_the_fifth_round_words_stay_quiet() -> None:
    healthy = [
        "Device 0: Total amount of Shared Memory per block: 49152 bytes\n",
        "INFO 01-01 10:00:00 [attn.py:1] Using FA3 backend for prefill; kernels built for 90a and 100a\n",
        "INFO 01-01 10:00:01 [moe.py:2] MoE backend: triton (grouped GEMM, FP8)\n",
        "[2026-01-02 10:00:00 TP0] Decode batch. #running-req: 8, #token: 4096, token usage: 0.02, cuda graph: True\n",
        "The server is fired up and ready to roll!\n",
    ]
    d = diagnose(healthy, [], None)
    assert d.exit_code == 0 and not d.causes, d.render()


def test_words_that_are_not_refusals_show_no_class() -> None:
    assert classify_line("loaded 12 GEMM configs for the MoE layer") is None
    assert classify_line("usable memory: 90.1 GiB") is None


def test_library_names_of_the_fifth_round() -> None:
    assert library_in('File "/env/site-packages/transformer_engine/pytorch/module/linear.py", line 9') == "transformer_engine"
    assert library_in("TransformerEngine/common/gemm/cublaslt_gemm.cu:120") == "transformer_engine"
    assert library_in("@ CUDA ~/.julia/packages/CUDA/abc/lib/cudadrv/module.jl:69") == "CUDA.jl"
    assert library_in("ImportError: cannot import FA3 kernels") == "flash_attn"
    assert library_in("    out = _sageattn_qk_int8(q, k, v)") == "sageattention"
    assert library_in('File "/env/site-packages/ctranslate2/models/whisper.py", line 3') == "ctranslate2"
    assert library_in("paddle/phi/kernels/gpu/matmul_kernel.cu:77") == "paddle"
