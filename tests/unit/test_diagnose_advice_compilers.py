"""Advice for the compilers that are not the CUDA toolkit on PATH (issue 32 item 1), on hand-written lines: a module
compiled at run time (CuPy's kernel cache, NVRTC) that has no code for the GPU is a compiler older than the GPU, not a
wheel without the arch; CMake's FindCUDA arch table (CUDA_SELECT_NVCC_ARCH_FLAGS) is the project's own file; XLA
emits PTX from the LLVM its TensorFlow/jaxlib build bundles; an app's launcher that says the device does not support
its torch/CUDA is a build without the arch. Each with a counter-case that must not get it."""

from __future__ import annotations

from sm120patch.triage.advice import add_advice
from sm120patch.triage.diagnose import diagnose

G5080 = "GPU 0: NVIDIA GeForce RTX 5080 (compute capability 12.0)\n"

RUNTIME_COMPILED = (
    "Traceback (most recent call last):\n"
    '  File "/opt/env/lib/python3.12/site-packages/mylib/kernels.py", line 40, in run\n'
    "    mod = _compile_with_cache_cuda(source, options)\n"
    '  File "/opt/env/lib/python3.12/site-packages/mylib/compiler.py", line 90, in _compile_with_cache_cuda\n'
    "    mod.load(cubin)\n"
    "mylib.DriverError: CUDA_ERROR_NO_BINARY_FOR_GPU: no kernel image is available for execution on the device\n"
)
PREBUILT = (
    "Traceback (most recent call last):\n"
    '  File "/opt/env/lib/python3.12/site-packages/mylib/ops.py", line 12, in forward\n'
    "    return _C.fused_op(x)\n"
    "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
)


def _causes(log: str) -> list:
    result = add_advice(diagnose(log.splitlines(keepends=True), [], None), [], None)
    assert result.causes, result.render()
    return result.causes


def _text(log: str) -> str:
    causes = _causes(log)
    return "\n".join([f.next_step for f in causes] + [n for f in causes for n in f.notes])


def test_a_module_compiled_at_run_time_without_code_for_the_gpu_names_the_runtime_compiler() -> None:
    text = _text(G5080 + RUNTIME_COMPILED)
    assert "compiled at run time (_compile_with_cache_cuda)" in text, text
    assert "nvidia-cuda-nvrtc-cu12>=12.8" in text and "kernel_cache" in text, text


def test_a_prebuilt_extension_without_code_for_the_gpu_does_not_blame_a_runtime_compiler() -> None:
    text = _text(G5080 + PREBUILT)
    assert "compiled at run time" not in text and "nvrtc" not in text.lower(), text


def test_a_runtime_compiled_cubin_the_driver_refuses_is_a_compiler_that_lacks_the_arch() -> None:
    # no error line: the frames end at the load of what the run-time compiler built
    log = G5080 + RUNTIME_COMPILED.rsplit("mylib.DriverError", 1)[0]
    causes = _causes(log)
    assert causes[0].cls == "toolchain-lacks-arch", [(f.cls, f.details) for f in causes]
    assert "compiled at run time" in causes[0].details.get("cue", ""), causes[0].details


def test_the_load_of_a_shipped_cubin_stays_a_binary_without_the_arch() -> None:
    log = (
        G5080 + "Traceback (most recent call last):\n"
        '  File "/opt/env/lib/python3.12/site-packages/mylib/loader.py", line 7, in load\n'
        "    mod.load(cubin)\n"
    )
    causes = _causes(log)
    assert causes[0].cls == "binary-lacks-arch", [(f.cls, f.details) for f in causes]


def test_cmakes_arch_table_is_the_projects_file_not_the_toolkit() -> None:
    log = (
        '-- Found CUDA: /usr/local/cuda (found version "13.0")\n'
        "CMake Error at cmake/select_compute_arch.cmake:200 (message):\n"
        "  Unknown CUDA Architecture Name 12.1 in CUDA_SELECT_NVCC_ARCH_FLAGS\n"
    )
    text = _text(log)
    assert "CUDA_SELECT_NVCC_ARCH_FLAGS" in text and "main/master branch" in text, text
    assert "CMAKE_CUDA_ARCHITECTURES=120" in text, text


def test_a_compiler_that_lacks_the_arch_elsewhere_gets_no_cmake_table_advice() -> None:
    log = G5080 + "ptxas fatal   : Value 'sm_120a' is not defined for option 'gpu-name'\n"
    text = _text(log)
    assert "CUDA_SELECT_NVCC_ARCH_FLAGS" not in text and "XLA" not in text, text


def test_xla_emitting_ptx_too_old_for_the_arch_names_a_tensorflow_or_jaxlib_build_for_it() -> None:
    log = (
        "2026-01-02 10:00:00.1: I external/local_xla/xla/stream_executor/cuda/cuda_executor.cc:1001] "
        "TensorFlow device: NVIDIA GeForce RTX 5070, compute capability 12.0\n"
        "LLVM ERROR: PTX version 8.4 does not support target 'sm_120'. Minimum required PTX version is 8.7.\n"
    )
    text = _text(log)
    assert "XLA compiles" in text and "TF_CUDA_COMPUTE_CAPABILITIES" in text and "jax[cuda12]" in text, text


def test_a_triton_ptxas_that_lacks_the_arch_gets_no_xla_advice() -> None:
    log = (
        G5080 + "triton.runtime.errors.PTXASError: PTXAS error: Internal Triton PTX codegen error\n"
        "ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'\n"
    )
    assert "XLA" not in _text(log)


def test_a_launcher_saying_the_device_does_not_support_its_torch_build_is_a_build_without_the_arch() -> None:
    log = "RuntimeError: Your card does not support the installed build of PyTorch/CUDA. Get another build.\n"
    causes = _causes(log)
    assert causes[0].cls == "binary-lacks-arch", [(f.cls, f.details) for f in causes]


def test_a_device_that_does_not_support_a_feature_is_not_a_build_without_the_arch() -> None:
    log = "RuntimeError: This device does not support bfloat16 atomics\n"
    causes = _causes(log)
    assert causes[0].cls != "binary-lacks-arch", [(f.cls, f.details) for f in causes]
