"""Three wordings read as what they are (issue 32, after held-out 12 was opened), on hand-written lines with a
counter-case each: PyTorch's warning that a 12.1 GPU is past its build's 12.0 is a warning (that build's sm_120 code
runs on 12.1), so the error after it is the cause; a build that says which CUDA the GPU's capability needs is a
toolkit too old for the GPU; a CUDA that did not start under PyTorch (its "CUDA initialization" UserWarning, error
803) is a driver mismatch, whatever level it is logged at."""

from __future__ import annotations

from sm120patch.triage.advice import add_advice
from sm120patch.triage.diagnose import diagnose


def _run(log: str):
    return add_advice(diagnose(log.splitlines(keepends=True), [], None), [], None)


def _warning(arch: str, top: str) -> str:
    return (
        "/venv/lib/python3.12/site-packages/torch/cuda/__init__.py:283: UserWarning:\n"
        f"    Found GPU0 NVIDIA GB10 which is of cuda capability {arch}.\n"
        "    Minimum and Maximum cuda capability supported by this version of PyTorch is\n"
        f"    (8.0) - ({top})\n"
    )


def test_a_12_1_gpu_past_a_12_0_build_is_a_warning_and_the_error_after_it_is_the_cause() -> None:
    log = _warning("12.1", "12.0") + (
        "Traceback (most recent call last):\n"
        '  File "/home/u/SomeKernels/setup.py", line 70, in <module>\n'
        '    raise RuntimeError("Unsupported GPU")\n'
        "RuntimeError: Unsupported GPU\n"
    )
    d = _run(log)
    (cause,) = d.causes
    assert (cause.line_no, cause.cls, cause.sm12x) == (8, "arch-path-unsupported", "yes"), d.render()
    assert any("build script" in n and "setup.py" in n for n in cause.notes), cause.notes
    warning = next(f for f in d.findings if f.signature == "torch-capability-outside-build")
    assert not warning.fatal and "SM121 runs sm_120 kernels" in " ".join(warning.notes)


def test_the_warning_alone_is_a_healthy_log() -> None:
    d = _run(_warning("12.1", "12.0") + "Loading checkpoint shards: 100%\n")
    assert not d.causes and d.exit_code == 0, d.render()


def test_a_gpu_past_a_build_that_stops_at_9_0_is_still_the_failure() -> None:
    """Counter-case: a 12.0 GPU under a build that stops at 9.0 has no code it can run: fatal as before."""
    d = _run(_warning("12.0", "9.0").replace("GB10", "GeForce RTX 5090"))
    (cause,) = d.causes
    assert cause.fatal and cause.signature == "torch-capability-outside-build" and cause.cls == "binary-lacks-arch"


def test_a_build_that_names_the_cuda_the_capability_needs_is_a_toolkit_too_old() -> None:
    for line in (
        "RuntimeError: CUDA 12.8 or higher is required for compute capability 12.0.",
        "RuntimeError: sm_120 requires CUDA >= 12.8 to build these kernels",
    ):
        log = 'Detect GPUs with compute capabilities: {"12.0"}\n' + line + "\n"
        d = _run(log)
        (cause,) = d.causes
        assert cause.cls == "toolchain-lacks-arch" and cause.sm12x == "yes", d.render()
        assert "CUDA >= 12.8" in cause.next_step


def test_a_build_script_that_finds_an_old_cuda_is_not_called_a_script_without_the_gpu() -> None:
    log = (
        "Traceback (most recent call last):\n"
        '  File "/src/SageAttention/setup.py", line 95, in <module>\n'
        "    raise RuntimeError(\n"
        "RuntimeError: CUDA 12.8 or higher is required for compute capability 12.0.\n"
    )
    (cause,) = _run(log).causes
    notes = " ".join(cause.notes)
    assert "CUDA_HOME" in notes and "has no case for this GPU" not in notes, notes


def test_a_framework_needing_a_newer_cuda_in_general_is_not_an_arch_toolkit_problem() -> None:
    """Counter-case: no capability or arch after 'required': a version requirement of the package, not the GPU's."""
    d = _run("RuntimeError: CUDA 12.1 or higher is required by vLLM; found 11.8\n")
    assert all(f.cls != "toolchain-lacks-arch" for f in d.causes), d.render()


def test_cuda_that_did_not_start_under_pytorch_is_a_driver_mismatch() -> None:
    log = (
        "/venv/lib/python3.11/site-packages/torch/cuda/__init__.py:138: UserWarning: CUDA initialization: "
        "Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
        "NumCudaDevices() that might have already set an error? Error 803: system has unsupported display driver / "
        "cuda driver combination (Triggered internally at ../c10/cuda/CUDAFunctions.cpp:108.)\n"
        "  return torch._C._cuda_getDeviceCount() > 0\n"
        "no CUDA environ\n"
    )
    d = _run(log)
    (cause,) = d.causes
    assert (cause.signature, cause.cls, cause.sm12x) == ("cuda-driver-mismatch", "environment", "no"), d.render()
    assert "reboot" in cause.next_step and "LD_LIBRARY_PATH" in cause.next_step


def test_a_pytorch_warning_without_a_cuda_failure_stays_a_warning() -> None:
    """Counter-case: PyTorch's other UserWarnings (a deprecation under torch/cuda) are not a CUDA that failed."""
    log = (
        "/venv/lib/python3.11/site-packages/torch/cuda/__init__.py:61: FutureWarning: The pynvml package is "
        "deprecated. Please install nvidia-ml-py instead.\n"
    )
    d = _run(log)
    assert not d.causes and d.exit_code == 0, d.render()
