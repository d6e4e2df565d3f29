# ruff: noqa: E501 (real log lines are long)
"""Families the ninth round of issue 23 added, for logs from projects the corpus has never seen: a FAILURE logged
at warning level (TensorFlow/XLA's `W ... OP_REQUIRES failed at x.cc:N : INTERNAL: ...`, any absl/gRPC status code,
`X is required by ... but was not found`, a call that "failed with" a status, an intercepted runtime error), the
status lines and exceptions of other runtimes (JAX/PJRT, Go panics, Java/Kotlin/C#), a CUDA driver error NAME
(`CUDA_ERROR_MISALIGNED_ADDRESS (716)`, ...) as a kernel fault wherever it stands (the GPU shown decides SM12x),
a missing toolchain (no ptxas/nvjitlink at all) as the environment, and an API server's "engine dead" tail said
as what it is. The reverse: warnings that retry, fall back or use a default stay healthy. Lines written here by
hand from the shapes those tools print (none is copied from a corpus case); the catalogue is off, so only
fatal.py and the structure answer."""

from __future__ import annotations

import pytest

from sm120patch.triage import fatal
from sm120patch.triage.diagnose import diagnose
from tests.unit.triage_lines import assert_prefilter_keeps, fatal_findings

RTX5090 = "Using device 0: NVIDIA GeForce RTX 5090\n"
H100 = "Using device 0: NVIDIA H100 80GB HBM3\n"
TF_W = "2026-01-02 10:00:00.000001: W tensorflow/core/framework/op_kernel.cc:1830] "
XLA_W = "2026-01-02 10:00:00.000002: W external/xla/xla/service/gpu/backend.cc:77] "

# (class the structure must give, or None for "any class, but never silent"; the log)
FAMILIES = [
    # failures logged at warning level: an absl status code, a component required but not found, a failed call
    (None, TF_W + "OP_REQUIRES failed at conv_ops.cc:1100 : INTERNAL: cuDNN launch failure : input shape ([1,3,4])\n"),
    (None, TF_W + "OP_REQUIRES failed at gather_op.cc:99 : INVALID_ARGUMENT: indices[3] = 7 is not in [0, 5)\n"),
    (None, "W0102 10:00:00.000 77 pjrt_client.cc:12] RESOURCE_EXHAUSTED: Out of memory allocating 1024 bytes\n"),
    (None, XLA_W + "FAILED_PRECONDITION: DNN library initialization failed\n"),
    ("environment", XLA_W + "nvvm is required by this compile step but was not found at /opt/cuda/nvvm\n"),
    (
        None,
        XLA_W
        + "'cuModuleLoadDataEx(&module, image, 0, nullptr, nullptr)' failed with 'CUDA_ERROR_NO_BINARY_FOR_GPU'\n",
    ),
    (None, XLA_W + "Intercepted XLA runtime error:\n"),
    # other runtimes' status lines and exceptions
    (
        None,
        "E0102 10:00:00.000 77 pjrt_stream_executor_client.cc:2809] Execution of replica 0 failed: UNIMPLEMENTED: no fused kernel\n",
    ),
    (None, "DATA_LOSS: checkpoint shard 3 is truncated\n"),
    (None, "panic: runtime error: index out of range [3] with length 3\n\ngoroutine 1 [running]:\nmain.main()\n"),
    (None, "fatal error: all goroutines are asleep - deadlock!\n"),
    (None, 'Exception in thread "main" java.lang.UnsatisfiedLinkError: no cudnnjni in java.library.path\n'),
    (
        None,
        "Unhandled exception. System.DllNotFoundException: Unable to load DLL 'cublasLt64_12' or one of its dependencies\n",
    ),
    # a CUDA driver error name: a kernel fault wherever it appears
    ("kernel-fault", RTX5090 + "CUDA_ERROR_MISALIGNED_ADDRESS (716) in batch 0\n"),
    ("kernel-fault", RTX5090 + "step 12: CUDA_ERROR_ILLEGAL_ADDRESS\n"),
    ("kernel-fault", "decode: driver said CUDA_ERROR_LAUNCH_FAILED (719)\n"),
    ("kernel-fault", "sync failed: CUDA_ERROR_HARDWARE_STACK_ERROR\n"),
    ("kernel-fault", "cuStreamSynchronize returned CUDA_ERROR_ASSERT\n"),
    # no toolchain at all: a missing component, not a compiler that lacks the arch
    (
        "environment",
        RTX5090
        + XLA_W
        + "No PTX compilation provider is available. Neither ptxas/nvlink nor nvjitlink is available.\n",
    ),
    ("environment", "RuntimeError: ptxas could not be found in PATH or in the wheel\n"),
]


@pytest.mark.parametrize(("cls", "log"), FAMILIES)
def test_a_ninth_round_family_is_never_silent_and_shows_its_class(cls: str | None, log: str) -> None:
    found = fatal_findings(log)
    if cls is not None:
        assert cls in {f["class"] for f in found}, (log, found)


@pytest.mark.parametrize(("cls", "log"), FAMILIES)
def test_the_prefilter_keeps_every_ninth_round_family(cls: str | None, log: str) -> None:
    assert_prefilter_keeps(log, cls)


def test_a_warned_op_failure_is_its_own_generic_class() -> None:
    got = fatal.classify(TF_W + "OP_REQUIRES failed at xla_ops.cc:12 : NOT_FOUND: libfoo.bc not found\n")
    assert got is not None and got.id == "warned-failure"


def test_a_driver_error_name_is_sm12x_only_on_an_sm12x_gpu() -> None:
    on_5090 = fatal_findings(RTX5090 + "CUDA_ERROR_MISALIGNED_ADDRESS (716) in batch 0\n")
    assert {("kernel-fault", "yes"), ("kernel-fault", "maybe")} & {(f["class"], f["sm12x"]) for f in on_5090}, on_5090
    named = fatal_findings("RTX 5090, sm_120\nCUDA_ERROR_MISALIGNED_ADDRESS (716) in batch 0\n")
    assert ("kernel-fault", "yes") in {(f["class"], f["sm12x"]) for f in named}, named
    on_h100 = fatal_findings(H100 + "CUDA_ERROR_MISALIGNED_ADDRESS (716) in batch 0\n")
    assert all(f["sm12x"] != "yes" for f in on_h100), on_h100


def test_a_missing_toolchain_on_sm12x_is_not_blamed_on_the_arch() -> None:
    found = fatal_findings(RTX5090 + FAMILIES[18][1])
    assert all(f["sm12x"] != "yes" for f in found), found


def test_an_engine_dead_tail_says_where_the_cause_is_and_blames_nothing() -> None:
    log = (
        "(APIServer pid=1) ERROR 01-02 10:00:00 [serving.py:1] Traceback (most recent call last):\n"
        '(APIServer pid=1) ERROR 01-02 10:00:00 [serving.py:1]   File "/x/vllm/v1/engine/core_client.py", line 9, in get\n'
        "(APIServer pid=1) ERROR 01-02 10:00:00 [serving.py:1] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
    )
    found = fatal_findings(log)
    assert all(f["sm12x"] != "yes" for f in found), found
    assert any("engine or worker process that died" in f["details"].get("cue", "") for f in found), found


HEALTHY = [
    "W0102 10:00:00.000 77 grpc_client.cc:12] UNAVAILABLE: connection reset by peer; retrying in 1s\n",
    XLA_W + "INTERNAL: autotuning failed for one config, falling back to the default kernel\n",
    XLA_W + "libdevice is required by this module but was not found; using the bundled copy instead\n",
    "2026-01-02 10:00:00.000003: I tensorflow/core/common_runtime/x.cc:1] status NOT_FOUND: cache entry missing\n",
    "INFO: lookup NOT_FOUND: key 12 (first run)\n",
    "loading model; CUDA_ERROR codes are listed in the README\nserving\n",
]


@pytest.mark.parametrize("log", HEALTHY)
def test_healthy_lines_with_the_same_words_stay_healthy(log: str) -> None:
    d = diagnose(log.splitlines(keepends=True), [], None, signatures=[]).to_dict()
    assert d["exit_code"] == 0, (log, d["findings"])
