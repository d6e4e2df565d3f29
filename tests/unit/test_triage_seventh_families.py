# ruff: noqa: E501 (real log lines are long)
"""Families the seventh round of issue 23 added, for logs from projects the corpus has never seen: a C++ engine's
bare refusal on a line of its own (`not implemented: ...`, `unsupported ...`, `... is not supported`) naming an
arch (`sm=70`) or a dtype; a fatal word a bad paste glued to the token before it (`...e2m1Aborted`,
`...failedTraceback (most recent call last):`); the remedy half of a message whose first half is cut off
(`your current GPU is 120`, `Install the ... wheel built for your GPU`, `Please install ... built for sm_120`,
`Reason: ... not supported`); a bare `CUDA error: invalid argument` with no GPU shown (a thin resource limit,
"maybe", never "yes"); a few tails that only follow an error (a debugger's `at faulting PC`, PyTorch's allocator
line under an out-of-memory error, a driver's GSP crash report). And the reverse: healthy lines with the same words
stay healthy. Lines written here by hand from the shapes those tools print (none is copied from a corpus case);
the catalogue is off, so only fatal.py and the structure answer."""

from __future__ import annotations

import pytest

from sm120patch.triage import fatal
from sm120patch.triage.diagnose import diagnose
from tests.unit.triage_lines import assert_prefilter_keeps, fatal_findings

RTX5070 = "Using device 0: NVIDIA GeForce RTX 5070\n"
A100 = "Using device 0: NVIDIA A100-SXM4-40GB\n"

# (class the structure must give, or None for "any class, but never silent"; the log)
FAMILIES = [
    # a C++ engine's bare refusal naming an arch (key=value) or a dtype
    ("arch-path-unsupported", "[engine] loading layers\nnot implemented: quant=nvfp4, grouped=1, sm=86\n"),
    ("arch-path-unsupported", "unsupported weight type mxfp4 for this kernel\n"),
    ("arch-path-unsupported", RTX5070 + "NOT IMPLEMENTED: e4m3 block scaling, sm: 120\n"),
    (None, "layer norm with bias=false is not supported\n"),
    (None, "rotary scaling type 'yarn2' not implemented\n"),
    # a fatal word glued to the token before it by a bad paste
    ("arch-path-unsupported", "not implemented: dtype=e4m3, sm=75Aborted\n"),
    (None, "loading shards 3/3 okSegmentation fault (core dumped)\n"),
    (None, "worker: init cuda context failedTraceback (most recent call last):\n"),
    (None, "step 4 of 9 doneKilled\n"),
    # the remedy half of a build-mismatch message, its first half cut off
    ("binary-lacks-arch", "but your current GPU is 89\n"),
    ("binary-lacks-arch", "Hint: install the matching wheel package built for your GPU from the project's download page\n"),
    ("binary-lacks-arch", "Please reinstall a build compiled for sm_120 (see the install guide)\n"),
    (None, "Please install a torch release that supports one of these CUDA architectures\n"),
    (None, "Make sure you run this on a card with compute capability 9.0 or higher.\n"),
    (None, "Reason: ['paged kv with fp8 not supported']\n"),
    # a bare CUDA error with only the runtime's "invalid argument": a thin resource limit where the GPU is not shown
    ("resource-limit", "torch.AcceleratorError: CUDA error: invalid argument\n"),
    ("resource-limit", RTX5070 + "RuntimeError: CUDA error: invalid argument\n"),
    # tails that only ever follow an error
    ("kernel-fault", "=> SASS at faulting PC:  LDG.E.128 R8, [R2.64]\n"),
    ("out-of-memory", "  and 3.02 GiB is reserved by PyTorch but unallocated.\n"),
    (None, "NVRM: GPU1 kgspHealthCheck_GA102: GSP-CrashCat report follows\n"),
    # mid-log lines (not the last ones) that end on the failure, or use another tool's level tag
    (None, "ggml_backend_op: ROPE failed\n" + "INFO waiting\n" * 4),
    (None, "render worker crashed\n" + "INFO waiting\n" * 4),
    (None, "build aborted: missing target list\n" + "INFO waiting\n" * 4),
    (None, "No usable tile config. Aborting.\n" + "INFO waiting\n" * 4),
    (None, "tensor core path ran into an error!\n" + "INFO waiting\n" * 4),
    (None, "ERR: queue submit returned 4\n" + "INFO waiting\n" * 4),
    # a GPU or arch newer than the build or release knows
    ("binary-lacks-arch", "the device arch sm_120 is too new for this release of the runtime\n" + "INFO waiting\n" * 4),
    ("binary-lacks-arch", "device capability 12.0 is newer than the maximum supported 9.0\n" + "INFO waiting\n" * 4),
    ("binary-lacks-arch", "Mismatch between the device arch and the binary (rebuild required)\n" + "INFO waiting\n" * 4),
    ("arch-path-unsupported", "compute_120 is not a supported target for the fused path\n" + "INFO waiting\n" * 4),
    ("arch-path-unsupported", "No available attention kernel for head_dim=256\n" + "INFO waiting\n" * 4),
    # a compile that failed for a named arch; a kernel launch that failed; a device-side assertion, however cased
    ("toolchain-lacks-arch", "[ERROR] [jit.py:40] kernel compile failed for sm_121\n"),
    ("toolchain-lacks-arch", "failed to build plan for compute_120 (see log above)\n"),
    ("kernel-fault", "[ERROR] CUDA kernel launch failure\n"),
    ("kernel-fault", "Device-side assertion `row < rows' failed.\n"),
]


@pytest.mark.parametrize(("cls", "log"), FAMILIES)
def test_a_seventh_round_family_is_never_silent_and_shows_its_class(cls: str | None, log: str) -> None:
    found = fatal_findings(log)
    if cls is not None:
        assert cls in {f["class"] for f in found}, (log, found)


@pytest.mark.parametrize(("cls", "log"), FAMILIES)
def test_the_prefilter_keeps_every_seventh_round_family(cls: str | None, log: str) -> None:
    assert_prefilter_keeps(log, cls)


def test_a_refusal_naming_another_arch_or_no_gpu_is_never_yes() -> None:
    for log in (
        "not implemented: quant=nvfp4, grouped=1, sm=86\n",
        "unsupported weight type mxfp4 for this kernel\n",
        "torch.AcceleratorError: CUDA error: invalid argument\n",
        "not implemented: dtype=e4m3, sm=75Aborted\n",
    ):
        assert all(f["sm12x"] != "yes" for f in fatal_findings(log)), log


def test_a_refusal_naming_sm12x_says_so() -> None:
    (f,) = fatal_findings("not implemented: dtype=e2m1, fused=1, sm=120\n")
    assert (f["class"], f["sm12x"]) == ("arch-path-unsupported", "yes")
    found = fatal_findings("your current GPU is 120\n")
    assert {(f["class"], f["sm12x"]) for f in found} == {("binary-lacks-arch", "yes")}


def test_a_compile_failed_for_another_arch_is_not_blamed_on_sm12x() -> None:
    found = fatal_findings(A100 + "[ERROR] [jit.py:40] kernel compile failed for sm_80\n")
    assert all(f["sm12x"] != "yes" for f in found), found


def test_a_bare_invalid_argument_on_another_gpu_stays_other() -> None:
    (f,) = fatal_findings(A100 + "RuntimeError: CUDA error: invalid argument\n")
    assert f["class"] == "other" and f["sm12x"] == "no"


def test_the_glued_word_is_unglued_only_at_the_end_of_a_line() -> None:
    assert fatal.unglue("dtype=e2m1Aborted") == "dtype=e2m1 Aborted"
    assert fatal.unglue("okSegmentation fault (core dumped)") == "ok Segmentation fault (core dumped)"
    assert fatal.unglue("if requestAborted: retry()") == "if requestAborted: retry()"
    assert fatal.classify("status: requestAborted=false, retries=0") is None


HEALTHY = [
    "INFO 12-01 10:00:00 [model.py:12] Hint: please install flash-attn built for your GPU for faster decoding\n",
    "Installing collected packages: torch, triton\nSuccessfully installed torch-2.9.0 triton-3.5.0\n",
    "config: sm_count=84, num_sms=132, smem_per_block=101376\n",
    "requestAborted: false\n",
    "Supported dtypes: bf16, fp16, fp8 (e4m3)\n",
    "WARNING: fp8 kv cache is not supported on this GPU, using bf16 instead\n",
    "Reason for restart: config reload\n",
    "Tests: 12 passed, 0 failed\n",
    "Health check: no probes failed\nserving\n",
    "retry 1 of 3: upload failed\nupload ok\n",
    "user cancelled; request aborted\nserving\n",
    "[2026-01-02 10:00:00 TP0] Abort request 8f3e\nserving\n",
    "Loaded 3 adapters, 0 crashed\n",
    "sampler: encountered an EOS token, stopping\nserving\n",
    "Using SDPA since flash attention is too new for this torch version\n",
    "This option is not a supported setting on Windows, ignoring\n",
]


@pytest.mark.parametrize("log", HEALTHY)
def test_healthy_lines_with_the_same_words_stay_healthy(log: str) -> None:
    d = diagnose(log.splitlines(keepends=True), [], None, signatures=[]).to_dict()
    assert d["exit_code"] == 0, (log, d["findings"])
