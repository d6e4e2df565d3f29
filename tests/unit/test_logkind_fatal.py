"""Fatal-line classes, framework and GPU detection, on real log lines (sources in comments)."""
# ruff: noqa: E501  (quoted log lines stay verbatim, one per line)

from __future__ import annotations

import pytest

from sm120patch.triage.diagnose import diagnose
from sm120patch.triage.fatal import classify, strip_prefix
from sm120patch.triage.logkind import LogKind


def kind(lines: list[str]) -> LogKind:
    k = LogKind()
    for i, line in enumerate(lines, 1):
        k.feed(i, line)
    return k


@pytest.mark.parametrize(
    ("line", "cls"),
    [
        # https://github.com/eugr/spark-vllm-docker/issues/143
        ("cudaErrorLaunchFailure: unspecified launch failure", "CUDA error"),
        # https://github.com/tinygrad/tinygrad/issues/7729
        ("ptxas fatal   : Ptx assembly aborted due to errors", "compiler error (ptxas/nvcc/LLVM)"),
        # https://github.com/NVIDIA/TensorRT-LLM/issues/699 (its title is the log line)
        (
            "[TensorRT-LLM][ERROR] Assertion failed: mNextBlocks.empty() (/home/jenkins/agent/workspace/LLM/main/L0_PostMerge/llm/cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp:160)",
            "TensorRT-LLM error",
        ),
        # https://github.com/vllm-project/vllm/issues/8204
        (
            ">   | [2024-09-05T00:38:34Z] ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 44319): [errno 98] address already in use",
            "server error",
        ),
        # https://github.com/vllm-project/vllm/issues/32109
        (
            "No compiled cutlass_scaled_mm for CUDA device capability: 120. Required capability: 90 or 100",
            "fatal message",
        ),
        # https://github.com/sgl-project/sglang/issues/37105
        (
            "[2026-09-21 06:49:24] Received sigquit from a child process. It usually means the child failed.",
            "process died",
        ),
        # https://github.com/vllm-project/vllm/issues/31480
        (
            "(Worker_TP4_EP4 pid=2532) ERROR 12-29 15:21:11 [multiproc_executor.py:751] ValueError: No valid attention backend found for cuda",
            "Python exception ValueError",
        ),
    ],
)
def test_fatal_lines_are_classified(line: str, cls: str) -> None:
    found = classify(line)
    assert found is not None and found.label == cls


@pytest.mark.parametrize(
    "line",
    [
        # https://github.com/vllm-project/vllm/issues/31936 (a warning on a healthy run)
        "WARNING 12-29 15:21:09 [custom_all_reduce.py:154] Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs. To silence this warning, specify disable_custom_all_reduce=True explicitly.",
        # https://github.com/sgl-project/sglang/issues/13061
        "[2025-11-11 15:55:06] WARNING model_config.py:707: mxfp4 quantization is not fully optimized yet. The speed can be slower than non-quantized models.",
        # https://github.com/dusty-nv/jetson-containers/issues/1118
        "[rank0]:[W528 11:36:41.374093261 ProcessGroupNCCL.cpp:1505] Warning: WARNING: destroy_process_group() was not called before program exit, which can leak resources.",
        # https://github.com/vllm-project/vllm/issues/32109 (a traceback frame under an ERROR prefix)
        '(EngineCore_DP0 pid=187525) ERROR 01-10 22:23:50 [core.py:936]   File "/kmmdata/vllm/vllm/vllm/v1/engine/core.py", line 692, in __init__',
        "INFO 07-24 08:25:45 pynccl.py:63] vLLM is using nccl==2.20.5",
    ],
)
def test_warnings_and_frames_are_not_fatal(line: str) -> None:
    assert classify(line) is None


def test_prefixes_are_peeled() -> None:
    # https://github.com/fishaudio/fish-speech/issues/907
    body, quiet = strip_prefix(
        "E0303 11:40:40.742000 713 site-packages/torch/_inductor/runtime/triton_heuristics.py:533] RuntimeError: Internal Triton PTX codegen error"
    )
    assert body == "RuntimeError: Internal Triton PTX codegen error" and not quiet


def test_framework_from_markers() -> None:
    assert kind(["(EngineCore_DP0 pid=60) ERROR 01-12 01:09:14 [core.py:708] boom"]).framework == "vllm"
    assert kind(["[2025-07-29 15:04:49 TP0] Init torch distributed begin."]).framework == "sglang"
    assert kind(["[TensorRT-LLM] TensorRT-LLM version: 0.18.0", "torch"]).framework == "tensorrt-llm"
    assert kind(["torch.OutOfMemoryError: CUDA out of memory."]).framework == "pytorch"
    assert kind(["nvcc fatal   : Unsupported gpu architecture 'compute_86'"]).framework is None


@pytest.mark.parametrize(
    ("line", "gpu"),
    [
        (
            "NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current PyTorch installation.",
            "sm12x",
        ),
        ("GPU: NVIDIA RTX PRO 6000 Blackwell Server Edition × 4, compute_cap = 12.0", "sm12x"),
        ("GPU 0 Compute Capability: 12.1", "sm12x"),
        ("/tmp/.cache/flashinfer/0.6.6/120a/generated/single_decode.cu:100: RuntimeError", "sm12x"),
        ("[04/28/2024-15:57:10] [TRT-LLM] [I] Compute capability: (7, 5)", "other"),
        ("GPU 0,1: NVIDIA H20", "other"),
        ("GPU 0 Compute Capability: 9.0", "other"),
        (
            "The current PyTorch install supports CUDA capabilities sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90.",
            "unknown",
        ),
        ("Quadro RTX 6000", "other"),
        ("vllm 0.11.1 rc4 (triton on sm120a RTX6000)", "unknown"),
    ],
)
def test_gpu_evidence(line: str, gpu: str) -> None:
    assert kind([line]).gpu == gpu


def test_maybe_is_settled_by_the_gpu_the_log_shows() -> None:
    # The limit line: https://github.com/state-spaces/mamba/issues/387 (101376 is SM86, SM89 and SM12x alike).
    # GPU lines from environment dumps: https://github.com/sgl-project/sglang/issues/35354 (GB10) and
    # https://github.com/sgl-project/sglang/issues/2361 (H20); put together here, not one real log.
    smem = "triton.runtime.autotuner.OutOfResources: out of resource: shared memory, Required: 663808, Hardware limit: 101376. Reducing block sizes or `num_stages` may help."
    alone = diagnose([smem], [], None).findings[0]
    assert alone.sm12x == "maybe" and "compute_cap" in alone.check and "SM86" in alone.meaning
    on_gb10 = diagnose(["GPU 0: NVIDIA GB10\n", smem], [], None).findings[0]
    assert on_gb10.sm12x == "yes" and any("line 1" in n for n in on_gb10.notes)
    on_h20 = diagnose(["GPU 0,1: NVIDIA H20\n", smem], [], None).findings[0]
    assert on_h20.sm12x == "no" and not on_h20.check


def test_a_named_limit_of_another_gpu_is_never_sm12x() -> None:
    # https://github.com/FlashML-org/FreeToken/issues/246; the GB10 line as above (put together here)
    line = "[16:10:33] stdout/INFO  triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 98304, Hardware limit: 65536. Reducing block sizes or `num_stages` may help."
    f = diagnose(["GPU 0: NVIDIA GB10\n", line], [], None).findings[0]
    assert f.signature == "triton-smem-out-of-resource" and f.sm12x == "no" and "SM75" in f.meaning


def test_advice_follows_the_framework() -> None:
    # https://github.com/vllm-project/vllm/issues/27508 and https://github.com/sgl-project/sglang/issues/12496
    vllm_oom = "(EngineCore_DP0 pid=8884) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB. GPU 0 has a total capacity of 79.11 GiB of which 140.75 MiB is free."
    sglang_oom = "sglang-1  | torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 MiB. GPU 0 has a total capacity of 23.52 GiB of which 13.00 MiB is free."
    vllm = diagnose([vllm_oom], [], None)
    sglang = diagnose([sglang_oom], [], None)
    assert vllm.framework == "vllm" and "--gpu-memory-utilization" in vllm.findings[0].next_step
    assert "--mem-fraction-static" not in vllm.findings[0].next_step
    assert sglang.framework == "sglang" and "--mem-fraction-static" in sglang.findings[0].next_step
    assert "--gpu-memory-utilization" not in sglang.findings[0].next_step


def test_unnamed_fatal_line_exits_1_with_its_class_even_next_to_warnings() -> None:
    lines = [
        "[2025-11-11 15:55:06] WARNING server_args.py:949: Detected SM100 and MXFP4 quantization format for GPT-OSS model, enabling FlashInfer MXFP4 MOE kernel.\n",
        "cudaErrorLaunchFailure: unspecified launch failure\n",
    ]
    d = diagnose(lines, [], None)
    assert d.exit_code == 1 and not d.cause_found
    assert [(e.line_no, e.cls) for e in d.unnamed_errors] == [(2, "CUDA error")]
    assert "line 2 [generic: CUDA error]" in d.render()


def test_a_warning_line_is_never_a_fatal_cause() -> None:
    # https://github.com/vllm-project/vllm/issues/5501: logged at WARNING, the run went on
    line = "WARNING 06-13 11:42:20 _custom_ops.py:11] Failed to import from vllm._C with ImportError('/usr/local/lib/python3.8/dist-packages/vllm/_C.abi3.so: undefined symbol: _ZN5torch7LibraryC1ENS0_4KindESsSt8optionalIN3c1011DispatchKeyEEPKcj')"
    d = diagnose([line], [], None)
    assert d.exit_code == 0 and not d.findings and not d.unnamed_errors
