"""Advice that reads past the fault line and names what to act on (issue 32 item 1), on hand-written lines: the
kernel a debugger names below a fault gives it its library (and that library's workaround); a failing op's kind
names the backend flag of that kind when the log shows none set; a kernel fault under a serving framework gets the
run without CUDA graphs; a cuBLAS/cuDNN refusal names that library; a PyTorch without the arch in an app's own
environment names the app. Each with a counter-case that must not get it."""

from __future__ import annotations

import pytest

from sm120patch.triage.advice import add_advice
from sm120patch.triage.diagnose import AFTER_LINES, diagnose

G5090 = "[2026-01-02 10:00:00] GPU 0: NVIDIA GeForce RTX 5090 (compute capability 12.0)\n"
H100 = "[2026-01-02 10:00:00] GPU 0: NVIDIA H100 80GB HBM3 (compute capability 9.0)\n"


def _advised(log: str) -> list:
    result = add_advice(diagnose(log.splitlines(keepends=True), [], None), [], None)
    assert result.causes, result.render()
    return result.causes


def _text(log: str) -> str:
    causes = _advised(log)
    return "\n".join([f.next_step for f in causes] + [n for f in causes for n in f.notes])


GDB_FAULT = (
    "CUDA Exception: Warp Illegal Address\n"
    "The exception was triggered at PC 0x7fffd2a0 (fattn-mma-f16.cuh:812)\n"
    "kernel: void flash_attn_ext_f16<128, 128, 64, 1, false, true>(char const*, char const*)\n"
)


def test_the_kernel_named_below_a_fault_is_its_library_and_brings_its_workaround() -> None:
    causes = _advised(GDB_FAULT)
    assert causes[0].details.get("library") == "llama.cpp/ggml", causes[0].details
    assert any("flash_attn_ext_f16" in a for a in causes[0].after), causes[0].after
    text = _text(GDB_FAULT)
    assert "-fa off" in text, text
    assert "upgrade llama.cpp" in text and "upgrade llama " not in text, text
    # a fault is not a shared-memory limit: the row for that does not come with it
    assert "more shared memory" not in text, text


def test_a_fault_with_nothing_named_below_it_names_no_library() -> None:
    log = "CUDA Exception: Warp Illegal Address\nGridDim (64,1,1)  BlockDim (32,4,1)\n"
    text = _text(log)
    assert "the library in the traceback" in text and "-fa off" not in text, text


def test_lines_after_a_fault_are_bounded() -> None:
    log = "CUDA Exception: Warp Illegal Address\n" + "".join(f"line {i}\n" for i in range(40))
    causes = _advised(log)
    assert causes[0].after == tuple(f"line {i}" for i in range(AFTER_LINES)), causes[0].after


def test_a_moe_kernel_that_needs_more_shared_memory_names_the_moe_backend_flags() -> None:
    log = G5090 + "RuntimeError: MoE grouped GEMM requires 102400 bytes shared memory but device supports 101376\n"
    text = _text(log)
    assert "--moe-runner-backend triton" in text and "--moe-backend triton" in text, text
    assert "--attention-backend" not in text, text


def test_an_attention_kernel_on_an_old_path_names_the_attention_backend_flags() -> None:
    log = (
        G5090
        + "Traceback (most recent call last):\n"
        + '  File "/x/site-packages/frobnicator/attention/fmha.py", line 12, in fmha_forward\n'
        + "RuntimeError: fmha kernel is only supported on sm_90 and sm_100\n"
    )
    text = _text(log)
    assert "--attention-backend triton" in text and "TRITON_ATTN" in text, text
    assert "--moe-runner-backend triton" not in text, text


def test_a_flag_the_log_shows_set_wins_over_the_op_kind() -> None:
    log = (
        G5090
        + "server_args=ServerArgs(attention_backend='fa3', moe_runner_backend='auto')\n"
        + "RuntimeError: FlashAttention only supports Hopper GPUs or newer.\n"
    )
    text = _text(log)
    assert "another --attention-backend than fa3" in text, text


FAULT = "RuntimeError: CUDA error: an illegal memory access was encountered\n"
VLLM_BANNER = "INFO 01-02 10:00:00 [core.py:1] vLLM engine (v0.11.0) starting\n"
SGLANG_BANNER = "[2026-01-02 10:00:00 TP0] Load weight begin. avail mem=93.10 GB\n"


@pytest.mark.parametrize(
    ("log", "named", "not_named"),
    [
        (VLLM_BANNER + FAULT, "--enforce-eager", "--disable-cuda-graph"),
        (SGLANG_BANNER + FAULT, "--disable-cuda-graph", "--enforce-eager"),
        ("Capturing cuda graph batches (bs=8)\n" + FAULT, "--enforce-eager", None),
    ],
    ids=["under-vllm", "under-sglang", "during-graph-capture"],
)
def test_a_kernel_fault_in_a_server_or_graph_capture_gets_the_run_without_graphs(
    log: str, named: str, not_named: str | None
) -> None:
    """In the flags of the server that wrote the log; both servers' flags when the log is neither's."""
    text = _text(log)
    assert named in text, text
    if not_named is None:
        assert "--disable-cuda-graph" in text, text
    else:
        assert not_named not in text, text


@pytest.mark.parametrize(
    ("banner", "named", "not_named"),
    [
        (SGLANG_BANNER, "--moe-runner-backend triton", "--moe-backend triton"),
        (VLLM_BANNER, "--moe-backend triton", "--moe-runner-backend"),
    ],
    ids=["sglang", "vllm"],
)
def test_the_backend_flag_is_the_one_of_the_server_that_wrote_the_log(banner: str, named: str, not_named: str) -> None:
    log = G5090 + banner + "RuntimeError: MoE grouped GEMM requires 102400 bytes shared memory but device has 101376\n"
    text = _text(log)
    assert named in text and not_named not in text, text


@pytest.mark.parametrize(
    ("banner", "named", "not_named"),
    [
        (SGLANG_BANNER, "--mem-fraction-static", "--gpu-memory-utilization"),
        (VLLM_BANNER, "--gpu-memory-utilization", "--mem-fraction-static"),
        ("", "--mem-fraction-static", None),
    ],
    ids=["sglang", "vllm", "neither"],
)
def test_out_of_memory_names_the_headroom_flag_of_the_server(banner: str, named: str, not_named: str | None) -> None:
    log = banner + "Something went wrong: out of memory on device 0 while growing the pool\n"
    result = add_advice(diagnose(log.splitlines(keepends=True), [], None), [], None)
    steps = [f.next_step for f in result.causes if f.cls == "out-of-memory"]
    assert steps, result.render()
    assert named in steps[0], steps
    if not_named is None:
        assert "--gpu-memory-utilization" in steps[0], steps
    else:
        assert not_named not in steps[0], steps


def test_a_kernel_fault_outside_a_server_gets_no_graph_advice() -> None:
    text = _text("CUDA Exception: Warp Illegal Address\n")
    assert "--enforce-eager" not in text, text


@pytest.mark.parametrize(
    ("line", "name", "wheel"),
    [
        ("RuntimeError: bmm_fp8_internal_cublaslt failed: CUBLAS_STATUS_NOT_SUPPORTED\n", "cuBLAS", "nvidia-cublas"),
        ("RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED in an sm_120 kernel\n", "cuDNN", "nvidia-cudnn"),
    ],
)
def test_a_math_library_refusal_names_that_library(line: str, name: str, wheel: str) -> None:
    text = _text(G5090 + line)
    assert f"upgrade {name}" in text and wheel in text, text


def test_a_pytorch_without_the_arch_in_an_apps_environment_names_the_app() -> None:
    log = (
        "/home/u/.local/share/pipx/venvs/frobnistack/lib/python3.12/site-packages/torch/cuda/__init__.py:235: "
        "UserWarning: \n"
        "NVIDIA GeForce RTX 5070 Ti with CUDA capability sm_120 is not compatible with the current PyTorch "
        "installation.\n"
        "The current PyTorch install supports CUDA capabilities sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90.\n"
    )
    text = _text(log)
    assert "upgrade frobnistack" in text and "whl/cu128" in text, text


def test_a_pytorch_without_the_arch_in_a_plain_site_gets_no_app() -> None:
    log = (
        "/usr/lib/python3/dist-packages/torch/cuda/__init__.py:235: UserWarning: \n"
        "NVIDIA GeForce RTX 5070 Ti with CUDA capability sm_120 is not compatible with the current PyTorch "
        "installation.\n"
    )
    text = _text(log)
    assert "own environment" not in text, text


def test_an_h100_fault_keeps_its_verdict_with_the_new_advice() -> None:
    """Advice never changes the verdict: an H100's fault is still not blamed on SM12x."""
    causes = _advised(H100 + GDB_FAULT)
    assert all(f.sm12x != "yes" for f in causes), [(f.signature, f.sm12x) for f in causes]


@pytest.mark.parametrize(
    ("frame", "named"),
    [
        ("/env/site-packages/paddle/base/framework.py", "upgrade PaddlePaddle (paddlepaddle-gpu)"),
        ("/env/site-packages/ctranslate2/models/whisper.py", "upgrade ctranslate2"),
        ("/env/site-packages/lmdeploy/turbomind/turbomind.py", "upgrade lmdeploy"),
    ],
    ids=["paddle", "ctranslate2", "lmdeploy"],
)
def test_another_compiled_runtime_is_named_for_its_upgrade(frame: str, named: str) -> None:
    log = (
        G5090
        + "Traceback (most recent call last):\n"
        + f'  File "{frame}", line 7, in run\n'
        + "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
    )
    text = _text(log)
    assert named in text and "another compiled runtime" not in text, text


def test_llama_cpp_kernels_get_llama_cpp_switches_not_a_servers_flags() -> None:
    """A llama.cpp attention kernel that needs more shared memory: flash attention off, in llama.cpp's (and
    Ollama's) words; a fault inside its CUDA graph: GGML_CUDA_DISABLE_GRAPHS. Never SGLang's or vLLM's flags."""
    smem = (
        G5090
        + "ggml_cuda_compute_forward: FLASH_ATTN_EXT failed\n"
        + "CUDA error: too many resources requested for launch\n"
        + "  current device: 0, in function ggml_cuda_flash_attn_ext at ggml/src/ggml-cuda/fattn.cu:312\n"
    )
    text = _text(smem)
    assert "-fa off" in text and "--attention-backend" not in text and "TRITON_ATTN" not in text, text
    # the class-level answer (no catalogue entry names the line) says the same in its next step
    assert_only = G5090 + "llama.cpp: fattn.cu:88: attention kernel requires 104000 bytes of shared memory\n"
    (cause,) = _advised(assert_only)
    assert cause.source == "structure" and "-fa off" in cause.next_step, cause.next_step
    assert "--attention-backend" not in cause.next_step, cause.next_step
    graph = (
        "ggml_backend_cuda_graph_compute: CUDA graph update failed\n"
        "CUDA error: an illegal memory access was encountered\n"
        "  current device: 0, in function ggml_backend_cuda_graph_compute at ggml/src/ggml-cuda/ggml-cuda.cu:2771\n"
    )
    text = _text(graph)
    assert "GGML_CUDA_DISABLE_GRAPHS=1" in text and "--enforce-eager" not in text, text
