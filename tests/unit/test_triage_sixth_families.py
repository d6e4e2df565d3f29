# ruff: noqa: E501 (real log lines are long)
"""Families the sixth round of issue 23 added, for logs from projects the corpus has never seen: bare one-line
errors with no traceback and no exception class (a loader's `undefined symbol`, a C++ app printing a CUDA runtime
error string on its own line, a binary or container built for another CPU), the other line shapes a crashed log
ends on (glibc aborts, signals, linker and shell errors, an exit status, HIP/Vulkan errors), a log whose last
lines say it failed in words nothing names; and the reverse: a fallback warning ("using bf16 instead") is not a
failure. Lines written here by hand from the shapes those tools print (none is copied from a corpus case); the
catalogue is off, so only fatal.py and the structure answer."""

from __future__ import annotations

import pytest

from sm120patch.triage import fatal
from sm120patch.triage.classes import classify_line
from sm120patch.triage.diagnose import diagnose
from tests.unit.triage_lines import assert_prefilter_keeps, fatal_findings

RTX5090 = "Using device 0: NVIDIA GeForce RTX 5090\n"
A100 = "Using device 0: NVIDIA A100-SXM4-40GB\n"

# (class the structure must give, or None for "any class, but never silent"; the log)
FAMILIES = [
    # a shared library built against another ABI: the loader's one line, no traceback
    ("environment", "./bin/server: symbol lookup error: ./lib/libops.so: undefined symbol: _ZN3c104impl8GPUTrace\n"),
    ("environment", "/opt/app/ext/_C.so: undefined symbol: _ZNK3c1010TensorImpl4sizeEv\n"),
    ("environment", "./llama-server: /lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not found\n"),
    # a binary or image built for another CPU
    ("environment", "app_1  | exec /usr/local/bin/entrypoint.sh: exec format error\n"),
    ("environment", "OSError: [Errno 8] Exec format error: './worker'\n"),
    (
        "environment",
        "WARNING: The requested image's platform (linux/amd64) does not match the detected host platform (linux/arm64/v8)\nstandard_init_linux.go:228: exec user process caused: no such file or directory\n",
    ),
    # the CUDA runtime's own error strings, printed by a C++ app on a line of their own; the GPU decides SM12x
    ("binary-lacks-arch", RTX5090 + "cudaMemcpyToSymbol: invalid device symbol\n"),
    ("binary-lacks-arch", "GPU error: invalid device symbol at hash.cu:88\n"),
    ("binary-lacks-arch", "[worker 0] CUDA kernel launch: invalid device function\n"),
    ("kernel-fault", "solver.cu(212): unspecified launch failure\n"),
    ("kernel-fault", "[gpu0] step 12: misaligned address\n"),
    ("resource-limit", "launch of conv_tile: too many resources requested for launch\n"),
    ("toolchain-lacks-arch", "module load: the provided PTX was compiled with an unsupported toolchain.\n"),
    ("environment", "init: CUDA driver version is insufficient for CUDA runtime version\n"),
    ("communication", "enable peer: peer access is not supported between these two devices\n"),
    (None, "cudaStreamSynchronize: invalid resource handle\n"),
    # a kernel launch refused with invalid argument on an SM12x GPU: a launch's size or shared memory, thinly
    ("resource-limit", RTX5090 + "Failed to launch kernel attn_fwd_split: CUDA_ERROR_INVALID_VALUE\n"),
    (None, "GPUassert: invalid argument render.cu 301\n"),
    # the other shapes a crashed log ends on
    (None, "free(): invalid next size (fast)\n"),
    (None, "*** stack smashing detected ***: terminated\n"),
    (None, "Caught signal 11 (Segmentation fault: invalid permissions for mapped object)\n"),
    (None, "/usr/bin/ld: cannot find -lnvinfer: No such file or directory\n"),
    (None, "/bin/sh: 1: ./launch.sh: not found\n"),
    (None, "hipErrorNoBinaryForGpu: Unable to find code object for all current devices!\n"),
    (None, "VK_ERROR_DEVICE_LOST while submitting the compute queue\n"),
    (None, "[12:00:00] [Info] Error: model file is corrupt\n"),
    (None, "ERROR:app.main:engine stopped\n"),
    (None, "inference worker process has died, restarting\n"),
    (None, "svc.service: Main process exited, code=exited, status=2/INVALIDARGUMENT\n"),
    (None, "Engine initialization failed. See the root cause above.\n"),
    (
        None,
        "RuntimeError: shape mismatch\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\n",
    ),
    # lines that only ever follow an error, when the error's first line is cut off above them
    ("resource-limit", "    Reducing block sizes or `num_stages` may help.\n"),
    ("kernel-fault", "=========     Access at 0x7f00aa10 is out of bounds\n"),
    ("environment", "Access to model acme/secret-7b is restricted. You must be authenticated to access it.\n"),
    (None, "  current device: 0, in function ggml_cuda_op_mul_mat at /src/ggml-cuda.cu:1200\n"),
    (None, "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace (please do this especially if reporting a bug)\n"),
    (None, "During handling of the above exception, another exception occurred:\n"),
    (None, "CudaSupportError                          Traceback (most recent call last)\n"),
    (None, "00007FF800000000 c10.dll!c10::detail::torchCheckFail [<unknown file> @ <unknown line number>]\n"),
    (None, "已放弃 (核心已转储)\n"),
    # the last lines say the run failed, in words no class knows
    (None, "loading model.bin\nstep 3/7\nstatus: 1\n"),
    (None, "starting engine\nchild returned -6\n"),
    (None, "compiling kernels...\nExit 134\n"),
    (None, "booting\nmodel loader: cannot find weights.safetensors\n"),
]


@pytest.mark.parametrize(("cls", "log"), FAMILIES)
def test_a_sixth_round_family_is_never_silent_and_shows_its_class(cls: str | None, log: str) -> None:
    found = fatal_findings(log)
    if cls is not None:
        assert cls in {f["class"] for f in found}, (log, found)
    assert all(f["sm12x"] != "yes" for f in found), (log, found)


@pytest.mark.parametrize(("cls", "log"), FAMILIES)
def test_the_prefilter_keeps_every_sixth_round_family(cls: str | None, log: str) -> None:
    assert_prefilter_keeps(log, cls)


def test_a_cuda_error_string_is_settled_by_the_gpu_the_log_shows() -> None:
    (f,) = fatal_findings(RTX5090 + "hash kernel: invalid device function\n")
    assert (f["class"], f["sm12x"]) == ("binary-lacks-arch", "yes")
    (f,) = fatal_findings(A100 + "hash kernel: invalid device function\n")
    assert (f["class"], f["sm12x"]) == ("binary-lacks-arch", "no")
    (f,) = fatal_findings(RTX5090 + "cudaMemcpyToSymbol: invalid device symbol\n")  # several causes print it: thin
    assert (f["class"], f["sm12x"], f["evidence"]) == ("binary-lacks-arch", "maybe", "thin")


def test_a_refused_launch_on_another_gpu_is_not_a_resource_limit() -> None:
    (f,) = fatal_findings(A100 + "Failed to launch kernel attn_fwd_split: CUDA_ERROR_INVALID_VALUE\n")
    assert (f["class"], f["sm12x"]) == ("other", "no")


def test_plain_english_cuda_strings_need_an_error_tag_or_a_cuda_word() -> None:
    assert fatal.CUDA_ERROR_STRING.search("cudaMalloc: out of memory")
    assert fatal.CUDA_ERROR_STRING.search("Error: unknown error")
    assert not fatal.CUDA_ERROR_STRING.search("the user gave an invalid argument to the tokenizer")
    assert classify_line("cudaStreamSynchronize: invalid resource handle") is None  # no class: a bare failure


def test_an_undefined_symbol_naming_an_arch_stays_an_arch_path() -> None:
    got = classify_line("ImportError: /env/ext/_C.so: undefined symbol: _Z17gemm_fp8_sm100")
    assert got is not None and got[0] == "arch-path-unsupported"


FALLBACKS = [
    "This GPU does not support FP8, using bf16 instead\n",
    "FP8 GEMM is not supported on this device; falling back to bf16\n",
    "FlashAttention 3 is not available on this GPU, using FlashAttention 2 instead.\n",
    "Flash attention is unsupported on this GPU, switching to SDPA\n",
    "CUDA graphs are not supported with this backend, disabling cuda graphs\n",
    "Using 'triton' attention backend since 'fa3' is not supported on this GPU.\n",
    "MoE kernel not available for this GPU, will use the unfused path\n",
    "torch.cuda.amp.GradScaler(args...) is deprecated. Please use torch.amp.GradScaler('cuda', args...) instead.\n",
]


@pytest.mark.parametrize("line", FALLBACKS)
def test_a_fallback_warning_is_not_a_failure(line: str) -> None:
    d = diagnose(["Loading model\n", line, "The server is fired up and ready to roll!\n"], [], None)
    assert d.exit_code == 0 and not d.causes and not d.unnamed_errors, d.render()


def test_advice_to_use_something_instead_in_a_real_error_stays_fatal() -> None:
    found = fatal_findings("RuntimeError: FP8 is not supported on this GPU. Please use --dtype bfloat16 instead.\n")
    assert found


HEALTHY = """Unable to find image 'example/server:latest' locally
latest: Pulling from example/server
Status: Downloaded newer image for example/server:latest
Could not find image processor class in the image processor config. Loading based on pattern matching.
Loading checkpoint shards: 100% | 4/4 [00:03<00:00,  1.10it/s]
This GPU does not support FP8, using bf16 instead
[2026-01-02 10:00:00 TP0] Decode batch. #running-req: 1, #token: 100, token usage: 0.00, cuda graph: True
INFO:     127.0.0.1:40000 - "POST /v1/chat/completions HTTP/1.1" 200 OK
The server is fired up and ready to roll!
"""


@pytest.mark.parametrize(
    "tail",
    [
        "",
        "INFO:     Shutting down\n",
        "Worker exited with code 0\n",
        "Process finished with exit code 0\n",
        "3 passed, 0 failed\n",
        "Error rate: 0.00%\n",
        "Retrying request (attempt 1 failed)\n",
        "done\n",
    ],
)
def test_a_healthy_log_stays_exit_0_whatever_its_last_line(tail: str) -> None:
    d = diagnose((HEALTHY + tail).splitlines(True), [], None)
    assert d.exit_code == 0 and not d.causes and not d.unnamed_errors, d.render()


def test_only_the_last_lines_count_for_the_tail_rule() -> None:
    log = "status: 1\n" + "".join(f"step {i} ok\n" for i in range(5))
    assert diagnose(log.splitlines(True), [], None).exit_code == 0
    assert fatal.tail_failure(["x", "status: 1", "", "step ok"]) == 1
    assert fatal.tail_failure(["INFO: child returned 1"]) is None  # logged below error level


def test_the_tail_rule_does_not_change_the_watcher() -> None:
    from sm120patch.triage.diagnose import Diagnoser

    d = Diagnoser([], None)
    for line in ("booting\n", "status: 1\n"):
        d.feed(line)
    first, second = d.result().to_dict(), d.result().to_dict()
    assert first == second and first["exit_code"] == 1
    d.feed("The server is fired up and ready to roll!\n")
    d.feed("serving\n")
    d.feed("serving\n")
    d.feed("serving\n")
    assert d.result().exit_code == 0
