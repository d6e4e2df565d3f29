"""The structural classifier on synthetic lines, one per cue: a fatal line no signature names is
answered with a cause class, the library, architectures, CUDA error and backend flag the log
shows, an SM12x verdict only as strong as the log, and a plain word when the evidence is thin.
(Lines written here on purpose: none is in the catalogue, so only the structure answers.)"""

from __future__ import annotations

import pytest

from sm120patch.triage import fatal
from sm120patch.triage.classes import CLASSES, SM12X_CLASSES, classify_line
from sm120patch.triage.diagnose import diagnose
from sm120patch.triage.signatures import load_signatures


def one(lines: list[str]):  # noqa: ANN201
    d = diagnose([line + "\n" for line in lines], [], None)
    fatal = [f for f in d.findings if f.fatal]
    assert len(fatal) == 1, d.render()
    return d, fatal[0]


@pytest.mark.parametrize(
    ("line", "cls"),
    [
        ("RuntimeError: ptxas exited with status 255 for kernel _fwd", "toolchain-lacks-arch"),
        ("error: NVRTC_ERROR_INVALID_OPTION: --gpu-architecture=compute_120a", "toolchain-lacks-arch"),
        ("RuntimeError: CUDA error: invalid device function", "binary-lacks-arch"),
        ("RuntimeError: cudaErrorNoKernelImageForDevice in fused_rope", "binary-lacks-arch"),
        ("RuntimeError: flash_fwd: operator wasn't built for this GPU", "binary-lacks-arch"),
        ("triton.runtime.errors.OutOfResources: Required: 200000 > 101376", "resource-limit"),
        ("RuntimeError: cudaErrorLaunchOutOfResources in moe_align", "resource-limit"),
        ("RuntimeError: CUDA error: misaligned address", "kernel-fault"),
        ("RuntimeError: CUDA error: unspecified launch failure", "kernel-fault"),
        ("ValueError: MLA decode kernel is SM100-only", "arch-path-unsupported"),
        ("NotImplementedError: fp4 gemm: unsupported compute capability 12.0", "arch-path-unsupported"),
        ("RuntimeError: cuBLAS failed with status CUBLAS_STATUS_NOT_SUPPORTED", "arch-path-unsupported"),
        ("AssertionError: only supported on Hopper and Blackwell datacenter GPUs", "arch-path-unsupported"),
        ("torch.OutOfMemoryError: allocation of 4 GiB failed", "out-of-memory"),
        ("torch.distributed.DistBackendError: watchdog timeout in all_reduce", "communication"),
        ("OSError: libcudart.so.13: cannot open shared object file", "environment"),
        ("RuntimeError: Expected is_sm90 || is_sm8x to be true, but got false.", "arch-path-unsupported"),
        ("RuntimeError: Unsupported CUDA architecture for this kernel", "arch-path-unsupported"),
        ("RuntimeError: GET was unable to find an engine to execute this computation", "binary-lacks-arch"),
        ("RuntimeError: Triton Error [CUDA]: device kernel image is invalid", "binary-lacks-arch"),
        ("NVRM: Xid (PCI:0000:01:00): 13, Graphics SM Warp Exception: Illegal Instruction Encoding", "kernel-fault"),
        ("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.", "other"),
        ("========= Invalid __global__ read of size 16 bytes", "kernel-fault"),
        (
            "E0305 20:23:38.890000 755 triton_heuristics.py:533] Triton compilation failed: triton_poi_0",
            "toolchain-lacks-arch",
        ),
        ("CMake Error at select_compute_arch.cmake:225: Unknown CUDA Architecture Name 9.0a", "toolchain-lacks-arch"),
    ],
)
def test_each_cue_gives_its_class(line: str, cls: str) -> None:
    assert cls in CLASSES
    got = classify_line(fatal.strip_prefix(line)[0])
    assert got is not None and got[0] == cls, got
    d, f = one(["Traceback (most recent call last):", line])
    assert (f.source, f.cls, f.evidence, d.exit_code) == ("structure", cls, "class", 1)
    assert f.signature == f"class:{cls}" and not d.cause_found


@pytest.mark.parametrize(
    ("frame", "library"),
    [
        ('  File "/usr/lib/python3/site-packages/flashinfer/decode.py", line 10, in run', "flashinfer"),
        ('  File "/usr/lib/python3/site-packages/sgl_kernel/gemm.py", line 10, in fp8_mm', "sgl_kernel"),
        ('  File "/usr/lib/python3/site-packages/vllm/_custom_ops.py", line 10, in scaled_mm', "vllm._C"),
        ('  File "/usr/lib/python3/site-packages/triton/compiler/compiler.py", line 10, in compile', "triton"),
        ('  File "/usr/lib/python3/site-packages/deep_gemm/jit/compiler.py", line 10, in build', "deep_gemm"),
        ('  File "/usr/lib/python3/site-packages/cutlass/cute/compile.py", line 10, in compile', "cutlass"),
        ('  File "/usr/lib/python3/site-packages/xformers/ops/fmha/__init__.py", line 10, in attn', "xformers"),
        ('  File "/usr/lib/python3/site-packages/flash_attn/flash_attn_interface.py", line 10, in fwd', "flash_attn"),
        ('  File "/usr/lib/python3/site-packages/bitsandbytes/functional.py", line 10, in dequant', "bitsandbytes"),
        ('  File "/usr/lib/python3/site-packages/torch/nn/functional.py", line 10, in linear', "torch"),
    ],
)
def test_library_comes_from_the_traceback_frames(frame: str, library: str) -> None:
    _, f = one(["Traceback (most recent call last):", frame, "RuntimeError: CUDA error: misaligned address"])
    assert f.details["library"] == library and library in f.meaning and library in f.next_step


def test_kernel_library_wins_over_the_framework_frames_around_it() -> None:
    _, f = one(
        [
            '  File "/x/vllm/model_executor/layers/fused_moe/layer.py", line 1, in forward',
            '  File "/x/flashinfer/fused_moe/core.py", line 2, in cutlass_fused_moe',
            '  File "/x/torch/_ops.py", line 3, in __call__',
            "RuntimeError: CUDA error: misaligned address",
        ]
    )
    assert f.details["library"] == "flashinfer"


def test_arch_tokens_and_the_flag_that_picked_the_path() -> None:
    d, f = one(
        [
            "server_args=ServerArgs(model_path='m', attention_backend='trtllm_mha', moe_runner_backend='auto')",
            '  File "/x/flashinfer/prefill.py", line 5, in trtllm_batch_context_with_kv_cache',
            "ValueError: this kernel is SM100-only (compiled for sm_100a)",
        ]
    )
    assert f.cls == "arch-path-unsupported"
    assert f.details["flag"] == "--attention-backend trtllm_mha" and "sm_100a" in f.details["archs"]
    assert "A path in flashinfer written for" in f.meaning and "SM100" in f.meaning
    assert "the flag that picks it is --attention-backend trtllm_mha" in f.meaning
    assert "another --attention-backend than trtllm_mha" in f.next_step
    assert f.sm12x == "maybe" and "nvidia-smi" in f.check  # no GPU in the log: say how to tell


@pytest.mark.parametrize(
    ("flag_line", "flag"),
    [
        ("python -m sglang.launch_server --model m --moe-runner-backend flashinfer_trtllm", "--moe-runner-backend"),
        ("vllm serve m --quantization modelopt_fp4 --tensor-parallel-size 2", "--quantization"),
    ],
)
def test_moe_and_quantization_flags(flag_line: str, flag: str) -> None:
    body = "RuntimeError: fused_moe fp4 gemm is not supported on this GPU"
    _, f = one([flag_line, '  File "/x/flashinfer/fused_moe/core.py", line 1, in run', body])
    assert f.details["flag"].startswith(flag)


def test_cuda_error_name_and_code_are_reported() -> None:
    _, f = one(["RuntimeError: cudaErrorMisalignedAddress (error 716) in paged_attention"])
    assert f.cls == "kernel-fault" and f.details["cuda_error"] == "cudaErrorMisalignedAddress"
    assert "cudaErrorMisalignedAddress" in f.meaning


@pytest.mark.parametrize(
    ("gpu_line", "verdict"),
    [
        ("GPU 0: NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "yes"),
        ("Device capability: (12, 1)", "yes"),
        ("GPU 0: NVIDIA H100 80GB HBM3", "no"),
        ("loading weights", "maybe"),
    ],
)
def test_the_gpu_the_log_shows_settles_an_architecture_class(gpu_line: str, verdict: str) -> None:
    _, f = one([gpu_line, "ValueError: fp8 block-scaled gemm requires sm_90a"])
    assert (f.cls, f.sm12x) == ("arch-path-unsupported", verdict)


def test_a_fault_on_an_sm12x_gpu_is_not_blamed_on_the_architecture_without_more() -> None:
    # illegal addresses happen on any GPU: showing an RTX 5090 is not enough to say "yes"
    _, f = one(["GPU 0: NVIDIA GeForce RTX 5090", "RuntimeError: CUDA error: misaligned address"])
    assert (f.cls, f.sm12x) == ("kernel-fault", "maybe")


def test_other_causes_are_never_sm12x() -> None:
    _, f = one(["GPU 0: NVIDIA GeForce RTX 5090", "OSError: libcudart.so.13: cannot open shared object file"])
    assert (f.cls, f.sm12x) == ("environment", "no")


def test_a_class_shown_only_in_the_lines_before_is_thin() -> None:
    _, f = one(
        [
            # a warning that shows a class without saying a call failed (a call that "failed with" a status is a
            # fatal line of its own since the ninth round: test_triage_ninth_families.py)
            "W0710 17:52:13.981518  5263 tf_gpu_runtime_wrappers.cc:40] module image for kernel Mul: "
            "CUDA_ERROR_INVALID_PTX",
            "tensorflow.python.framework.errors_impl.InternalError: {{function_node __wrapped__Mul}}",
        ]
    )
    assert (f.cls, f.evidence) == ("binary-lacks-arch", "thin")
    assert "evidence is thin" in f.meaning and "CUDA_ERROR_INVALID_PTX" in f.meaning


def test_a_bare_exception_near_a_kernel_library_naming_an_arch_is_a_thin_arch_path() -> None:
    _, f = one(["Error: Error Internal (cutlass_kernel_file_gemm_grouped_sm120_M128.generated.cu:60)"])
    assert (f.cls, f.evidence, f.sm12x) == ("arch-path-unsupported", "thin", "maybe")


def test_a_bare_exception_with_nothing_telling_is_other_and_says_so() -> None:
    _, f = one(["Traceback (most recent call last):", "ValueError: expected 3 chunks, got 2"])
    assert (f.cls, f.evidence) == ("other", "thin") and "evidence is thin" in f.meaning


def test_traceback_frames_without_an_exception_line_are_not_silence() -> None:
    d, f = one(['  File "/x/flashinfer/jit/core.py", line 108, in check_cuda_arch'])
    assert d.exit_code == 1 and f.evidence == "thin" and "without an exception line" in f.line


def test_a_named_cause_leaves_no_room_for_a_class_guess() -> None:
    d = diagnose(
        [
            "RuntimeError: CUDA error: no kernel image is available for execution on the device\n",
            "ValueError: something else\n",
        ],
        [],
        None,
    )
    assert [f.source for f in d.findings if f.fatal] == ["catalogue"] and d.exit_code == 0


def test_every_signature_has_a_class_and_architecture_classes_go_with_sm12x_verdicts() -> None:
    for s in load_signatures():
        assert s.cls in CLASSES
        if s.sm12x == "yes":
            assert s.cls in SM12X_CLASSES, s.id


def test_a_line_logged_at_error_level_is_fatal_but_a_frame_under_it_is_not() -> None:
    assert fatal.classify("E0710 17:52:13.982435  5263 gpu_resources.cc:98] Mismatched GPU Architecture") is not None
    assert fatal.classify("(EngineCore_DP0 pid=1) ERROR 01-10 22:23:50 [core.py:936] EngineCore died") is not None
    assert fatal.classify('(EngineCore_DP0 pid=1) ERROR 01-10 22:23:50 [core.py:936]   File "x.py", line 1') is None


def test_a_healthy_log_with_scary_warnings_stays_exit_0() -> None:
    lines = [
        # https://github.com/vllm-project/vllm/issues/31936 (a warning on a healthy run)
        "WARNING 12-29 15:21:09 [custom_all_reduce.py:154] Custom allreduce is disabled because it's not supported on "
        "more than two PCIe-only GPUs. To silence this warning, specify disable_custom_all_reduce=True explicitly.",
        "INFO 07-24 08:25:45 pynccl.py:63] vLLM is using nccl==2.20.5",
        "host:123:456 [0] NCCL INFO Channel 00/02 :    0   1",
        "[2026-01-02 10:00:00 TP0] Decode batch. #running-req: 8, #token: 4096, token usage: 0.02, cuda graph: True",
        "The server is fired up and ready to roll!",
    ]
    d = diagnose([line + "\n" for line in lines], [], None)
    assert d.exit_code == 0 and not [f for f in d.findings if f.fatal], d.render()


def test_a_non_error_line_answers_a_log_without_fatal_lines_thinly() -> None:
    _, f = one(
        [
            "WARNING:bitsandbytes.cextension:The installed version of bitsandbytes was compiled without GPU support.",
            "loading model",
        ]
    )
    assert (f.cls, f.evidence) == ("binary-lacks-arch", "thin") and "not logged as an error" in f.meaning
