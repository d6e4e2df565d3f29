"""Crash triage on real error lines from public reports (one per catalogue signature)."""
# ruff: noqa: E501  (quoted log lines stay verbatim, one per line)

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from packaging.specifiers import SpecifierSet

from sm120patch.catalogue.recipes import Recipe, load_recipes
from sm120patch.cli import triage as commands_triage
from sm120patch.triage.diagnose import MISSING, diagnose, read_lines, rollback_command
from sm120patch.triage.signatures import load_signatures
from tests.unit.cli_entry import SM120PATCH

AR = "sglang-allreduce-fusion-sm120"
AR_SIG = "No supported CUDA architectures found for major versions [9, 10]"

# One real log line per catalogue signature, as quoted in the public report next to it.
REAL_LINES = {
    # https://github.com/sgl-project/sglang/issues/13342
    "flashinfer-jit-arch-excluded": "Exception: Capture cuda graph failed: No supported CUDA architectures found for major versions [10].",
    # flashinfer PR 3633 (nvcc 12.8, FlashInfer 0.6.18)
    "flashinfer-jit-major-12-without-arch": "No supported CUDA architectures found for major versions [12]",
    # https://github.com/flashinfer-ai/flashinfer/issues/3263
    "trtllm-gen-unsupported-arch": "RuntimeError: Error in function 'TllmGenFmhaRunner' at /workspace/include/flashinfer/trtllm/fmha/fmhaRunner.cuh:30: Unsupported architecture",
    # https://github.com/sgl-project/sglang/issues/9140
    "sglang-trtllm-mha-sm100-only": "ValueError: TRTLLM MHA backend is only supported on Blackwell GPUs (SM100).",
    # https://github.com/sgl-project/sglang/issues/31578
    "flashmla-sparse-sm90-sm100-only": "RuntimeError: Sparse Attention Forward Kernel is only supported on SM90a and SM100f architectures.",
    # https://github.com/flashinfer-ai/flashinfer/issues/3310
    "trtllm-gen-moe-no-kernel": "TrtllmGenBatchedGemmRunner: No kernel found for the given options",
    # https://github.com/flashinfer-ai/flashinfer/pull/3668 (arch list abbreviated there)
    "cute-dsl-arch-mismatch": "cutlass.cute.nvgpu.common.OpError: expects arch to be one of [sm_100a, sm_100f, sm_110f], but got sm_120a",
    # SGLang python/sglang/srt/models/deepseek_common/attention_forward_methods/forward_mha.py
    # https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/models/deepseek_common/attention_forward_methods/forward_mha.py
    "nsa-page-table-1-flattened": "AttributeError: 'PrefillMetadata' object has no attribute 'page_table_1_flattened'",
    # https://github.com/flashinfer-ai/flashinfer/pull/2839
    "no-kernel-image": "RuntimeError: CUDA error: no kernel image is available for execution on the device",
    # NVIDIA/nvbandwidth#61 (driver 580, binary built by CUDA 13.2)
    "ptx-jit-too-new": "[cudaErrorUnsupportedPtxVersion] the provided PTX was compiled with an unsupported toolchain. "
    "in expression cudaGetLastError()",
    # https://github.com/RLinf/RLinf/issues/92
    "ptxas-unknown-sm12x": "ptxas fatal   : Value 'sm_120' is not defined for option 'gpu-name'",
    # https://github.com/flashinfer-ai/flashinfer/issues/2065
    "cuda-illegal-instruction": "CUDA error: an illegal instruction was encountered",
    # https://github.com/flashinfer-ai/flashinfer/issues/924
    "cuda-illegal-memory-access": "CUDA Error: an illegal memory access was encountered (CUDA Error: 700an illegal memory access was encountered)",
    # https://github.com/sgl-project/sglang/issues/8513
    "triton-smem-out-of-resource": "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 147456, Hardware limit: 101376. Reducing block sizes or `num_stages` may help.",
    # https://github.com/sgl-project/sglang/pull/36507
    "cuda-smem-attribute-too-large": "Failed to set the allowed dynamic shared memory size to 169984",
    # https://github.com/pytorch/pytorch/issues/1956
    "cuda-too-many-resources": "cuda runtime error : too many resources requested for launch",
    # https://github.com/black-forest-labs/flux2/issues/23 (RTX A6000)
    "cuda-out-of-memory": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 648.00 MiB. GPU 0 has a total capacity of 47.53 GiB of which 176.88 MiB is free.",
    # https://github.com/sgl-project/sglang/issues/3460
    "nccl-error": "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)",
    # https://github.com/tinygrad/open-gpu-kernel-modules/issues/29 (NCCL 2.25.1 logs it at INFO, then fails)
    "nccl-shared-memory-exceeds": "test:259034:259124 [0] NCCL INFO ncclMaxSharedMem 82240 exceeds device/fn maxSharedMem 79856",
    # https://github.com/yhlleo/DeepSegmentor/issues/31
    "cuda-driver-mismatch": "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling NumCudaDevices() that might have already set an error? Error 803: system has unsupported display driver / cuda driver combination",
    # https://github.com/sgl-project/sglang/issues/13061
    "sglang-gpt-oss-mxfp4-sm100-detect": "[2025-11-11 15:55:06] WARNING server_args.py:949: Detected SM100 and MXFP4 quantization format for GPT-OSS model, enabling FlashInfer MXFP4 MOE kernel.",
    # https://github.com/sgl-project/sglang/issues/13061
    "sglang-allreduce-fusion-sm100-detect": "[2025-11-11 15:55:06] INFO server_args.py:938: Enable FlashInfer AllReduce Fusion on sm100 for GptOssForCausalLM",
    # The rest: one line of a case in tests/corpus/triage/ (its URL there).
    "cutlass-sm120-only-trap": "This kernel only supports sm120.",
    "deepgemm-no-sm12x": "NameError: name 'deep_gemm' is not defined",
    "tma-gather-scatter-sm100-only": "ptxas-blackwell /tmp/tmp5gzj9h7b.ptx, line 4129; error   : Feature '.tile::scatter4' not supported on .target 'sm_120a'",
    "ptx-feature-not-on-sm12x": "ptxas /tmp/tmpxft_00001af0_00000000-6_sm90_q64n32.ptx, line 10531; error   : Instruction 'tensormap.replace' not supported on .target 'sm_120'",
    "ptxas-unknown-arch": "20' is not defined for option 'gpu-name' (SGLangWorker pid=38138) (SGLangWorker pid=38138) Possible solutions:",
    "nvcc-unknown-sm12x": "nvcc fatal   : Unsupported gpu architecture 'compute_120'",
    "nvcc-unknown-arch": "nvcc fatal: Unsupported gpu architecture 'compute_89'",
    "ptx-version-too-new": "ptxas add_kernel.ptx, line 5; fatal   : Unsupported .version 8.4; current version is '7.8'",
    "torch-without-sm12x": "NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current PyTorch installation.",
    "requires-sm100": "NotImplementedError: DeepGEMM MegaMoE requires SM100 GPUs.",
    "kernel-rejects-sm12x": "RuntimeError: FlashInfer-CUTLASS MoE kernel does not support current device sm_120",
    "no-compiled-kernel-for-capability": "No compiled cutlass_scaled_mm for CUDA device capability: 120. Required capability: 90 or 100",
    "vllm-no-attention-backend": "ValueError: No valid attention backend found for cuda with AttentionSelectorConfig(head_size=576, dtype=torch.bfloat16, kv_cache_dtype=auto, block_size=None, use_mla=True, has_sink=False, use_sparse=True, use_mm_prefix=False, attn_type=decoder).",
    "unsupported-architecture": "RuntimeError: Unsupported architecture",
    "port-in-use": "OSError: [Errno 98] Address already in use",
    "hf-gated-or-auth": "huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-66f4b037-1bf3d7d219afbc904ee05694;5601d2c9-8fd8-4ed8-b38d-d8a432e1fa59)",
    "tokenizer-load-error": "Exception: data did not match any variant of untagged enum ModelWrapper at line 646517 column 3",
    "import-error": "ModuleNotFoundError: No module named 'slora._kernels'",
    "triton-too-old-for-sm12x": "LLVM ERROR: Cannot select: intrinsic %llvm.nvvm.shfl.sync.bfly.i32",
    "torch-capability-outside-build": "    Minimum and Maximum cuda capability supported by this version of PyTorch is",
    "sgl-kernel-no-arch-variant": "ImportError: [sgl_kernel] CRITICAL: Could not load any common_ops library!",
    "undefined-arch-kernel-symbol": "ImportError: /path/to/vllm/_C.abi3.so: undefined symbol: _Z20cutlass_moe_mm_sm100RN2at6TensorERKS0_S3_S3_S3_S3_S3_S3_S3_S3_bb",
}

# A traceback shaped like FlashInfer's JIT path (frames written here, error text from
# https://github.com/sgl-project/sglang/issues/15650).
JIT_CRASH = """\
[2026-01-02 10:00:00 TP0] Capturing batches (bs=8)
Traceback (most recent call last):
  File "/x/flashinfer/comm/trtllm_ar.py", line 100, in get_trtllm_comm_module
    module = gen_trtllm_comm_module().build_and_load()
  File "/x/flashinfer/jit/comm.py", line 40, in gen_trtllm_comm_module
    nvcc_flags = ctx.get_nvcc_flags_list(supported_major_versions=[9, 10])
RuntimeError: No supported CUDA architectures found for major versions [9, 10].
[2026-01-02 10:00:01 TP1] RuntimeError: No supported CUDA architectures found for major versions [9, 10].
""".splitlines(keepends=True)


def recipe(rid: str = AR, sigs: tuple[str, ...] = (AR_SIG,), advice: str = "") -> Recipe:
    return Recipe(
        id=rid,
        package="sglang",
        title="Let FlashInfer allreduce fusion run on SM12x",
        why="test",
        versions=SpecifierSet(">=0"),
        arch=(),
        edits=(),
        path=Path(f"{rid}.toml"),
        sha256="0",
        crash_signatures=sigs,
        advice=advice,
    )


def test_every_signature_has_a_real_line() -> None:
    assert set(REAL_LINES) == {s.id for s in load_signatures()}


@pytest.mark.parametrize("sig_id", sorted(REAL_LINES))
def test_real_line_is_named(sig_id: str) -> None:
    lines = ["INFO starting\n", REAL_LINES[sig_id] + "\n", "INFO bye\n"]
    d = diagnose(lines, [], None)
    assert d.findings, d.render()
    first = d.findings[0]
    assert (first.signature, first.line_no, first.source) == (sig_id, 2, "catalogue")
    assert first.sources and first.sources[0].startswith("https://")
    assert "{" not in first.meaning and "{" not in first.next_step
    assert d.exit_code == 0


def test_jit_details_name_majors_and_module_from_the_traceback() -> None:
    d = diagnose(JIT_CRASH, [], set())
    (f,) = d.findings
    # and the library whose frame is above the failing line (flashinfer/jit/...): where to act
    assert f.details == {"majors": "9, 10", "module": "trtllm_comm", "library": "flashinfer"}
    assert "(trtllm_comm)" in f.meaning and "[9, 10]" in f.meaning
    assert f.count == 2 and f.line_no == 7


def test_module_unknown_when_the_log_does_not_show_it() -> None:
    d = diagnose([REAL_LINES["flashinfer-jit-arch-excluded"]], [], None)
    assert d.findings[0].details == {"majors": "10"}
    assert MISSING in d.findings[0].meaning


def test_applied_recipe_is_implicated_with_rollback_command() -> None:
    d = diagnose(JIT_CRASH, [recipe()], {AR}, target=Path("/srv/sglang tree"))
    (f,) = d.findings
    assert f.source == "recipe" and f.recipe_ids == [AR] and f.journal == "applied"
    assert f.next_step == f"sm120patch rollback '/srv/sglang tree' --recipe {AR}"
    assert f.signature == "flashinfer-jit-arch-excluded" and f.details["module"] == "trtllm_comm"
    assert d.implicated_recipes == [AR]


def test_recipe_not_applied_is_not_implicated() -> None:
    d = diagnose(JIT_CRASH, [recipe()], {"some-other-recipe"})
    (f,) = d.findings
    assert f.source == "catalogue" and f.recipe_ids == [] and d.implicated_recipes == []
    assert any(AR in n and "not applied" in n for n in f.notes)


def test_without_journal_the_recipe_is_flagged_unknown_and_said_so() -> None:
    d = diagnose(JIT_CRASH, [recipe()], None)
    (f,) = d.findings
    assert f.recipe_ids == [AR] and f.journal == "unknown"
    assert f.next_step.startswith(f"If you applied {AR}: sm120patch rollback TARGET --recipe {AR}")
    assert d.implicated_recipes == []  # nothing to roll back automatically
    assert any("no journal information" in n for n in d.notes)
    assert "journal unknown" in d.render()


def test_recipe_signature_without_catalogue_entry() -> None:
    r = recipe("sglang-moe-backend-sm120", ("flashinfer_cutlass tactic 7 exploded",), advice="Use cutlass.")
    d = diagnose(["RuntimeError: flashinfer_cutlass tactic 7 exploded\n"], [r], {r.id})
    (f,) = d.findings
    assert f.signature == "flashinfer_cutlass tactic 7 exploded" and f.fatal
    assert "sglang-moe-backend-sm120" in f.meaning
    assert any("Use cutlass." in n for n in f.notes)


def test_unnamed_fatal_error_exits_1_and_says_what_to_look_for() -> None:
    log = ["loading\n", "Traceback (most recent call last):\n", '  File "x.py", line 1\n', "KeyError: 'qkv'\n"]
    d = diagnose(log, [], None)
    assert not d.cause_found and d.exit_code == 1
    (f,) = d.findings  # answered by class, and the answer says how thin it is
    assert (f.source, f.cls, f.evidence, f.line_no) == ("structure", "other", "thin", 4)
    assert "evidence is thin" in f.meaning
    assert [(e.line_no, e.cls) for e in d.unnamed_errors] == [(2, "Python traceback"), (4, "Python exception KeyError")]
    text = d.render()
    assert "No known crash signature names the fatal error" in text and "Look for:" in text
    assert "line 4 [generic: Python exception KeyError]: KeyError: 'qkv'" in text


def test_clean_log_is_never_silent() -> None:
    d = diagnose(["INFO all good\n"] * 3, [], None)
    assert d.exit_code == 0 and not d.cause_found
    assert "No known crash signature and no fatal lines in 3 log lines" in d.render()


def test_warning_alone_is_not_a_cause() -> None:
    d = diagnose([REAL_LINES["sglang-gpt-oss-mxfp4-sm100-detect"], "ValueError: boom"], [], None)
    assert not d.cause_found and d.exit_code == 1
    warning = next(f for f in d.findings if f.source == "catalogue")
    assert warning.fatal is False
    assert [f.evidence for f in d.findings if f.fatal] == ["thin"]  # only a class answers the ValueError


def test_fatal_findings_come_first() -> None:
    d = diagnose([REAL_LINES["sglang-gpt-oss-mxfp4-sm100-detect"], REAL_LINES["cuda-out-of-memory"]], [], None)
    assert [f.signature for f in d.findings] == ["cuda-out-of-memory", "sglang-gpt-oss-mxfp4-sm100-detect"]


def test_ansi_colours_are_stripped() -> None:
    d = diagnose(["\x1b[31mCUDA error: an illegal instruction was encountered\x1b[0m\n"], [], None)
    assert d.findings[0].line == "CUDA error: an illegal instruction was encountered"


def test_streams_a_large_generated_log() -> None:
    def lines():
        for i in range(200_000):
            yield f"[TP{i % 8}] decode batch {i}\n"
        yield REAL_LINES["nccl-error"] + "\n"

    d = diagnose(lines(), [], None)
    assert d.lines_read == 200_001 and d.findings[0].line_no == 200_001


def test_read_lines_bounds_each_line() -> None:
    blob = b"x" * 100 + b" CUDA out of memory.\nnext\nlast"
    got = list(read_lines(io.BytesIO(blob), max_line=16))
    assert got == ["x" * 16, "next\n", "last"]


def test_json_shape() -> None:
    d = diagnose(JIT_CRASH, [recipe()], {AR}, target=Path("/t"))
    data = json.loads(json.dumps(d.to_dict()))
    assert set(data) == {
        "cause_found",
        "exit_code",
        "lines_read",
        "target",
        "journal",
        "framework",
        "gpu",
        "findings",
        "unnamed_errors",
        "taken",
        "taken_before_crash",
        "notes",
    }
    assert (data["taken"], data["taken_before_crash"]) == ([], [])  # no taken line in this log
    assert set(data["gpu"]) == {"gpu", "sm12x_evidence", "other_evidence"}
    f = data["findings"][0]
    assert set(f) == {
        "source",
        "signature",
        "class",
        "evidence",
        "fatal",
        "sm12x",
        "check",
        "recipe_ids",
        "journal",
        "meaning",
        "next_step",
        "line_no",
        "line",
        "count",
        "details",
        "sources",
        "notes",
    }
    assert data["target"] == "/t" and data["journal"] == "read" and f["recipe_ids"] == [AR]


def test_rollback_command_quotes() -> None:
    assert (
        rollback_command(None, ["a", "b"])
        == "sm120patch rollback TARGET --recipe a && sm120patch rollback TARGET --recipe b"
    )


def test_real_allreduce_recipe_signature_is_found() -> None:
    recipes = load_recipes()
    assert AR in {r.id for r in recipes}
    d = diagnose(JIT_CRASH, recipes, {AR})
    assert d.implicated_recipes == [AR]


# -- CLI -------------------------------------------------------------------


def write_log(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "server.log"
    p.write_text("".join(lines), encoding="utf-8")
    return p


def test_cli_missing_file_is_one_line_exit_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(SM120PATCH, ["diagnose", str(tmp_path / "nope.log")])
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and "cannot read the log" in res.output


def test_cli_json_and_exit_codes(tmp_path: Path) -> None:
    res = CliRunner().invoke(SM120PATCH, ["diagnose", str(write_log(tmp_path, JIT_CRASH)), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["findings"][0]["signature"] == "flashinfer-jit-arch-excluded"
    res = CliRunner().invoke(SM120PATCH, ["diagnose", str(write_log(tmp_path, ["ValueError: odd\n"]))])
    assert res.exit_code == 1 and "Look for:" in res.output


def test_cli_reads_stdin() -> None:
    res = CliRunner().invoke(SM120PATCH, ["diagnose", "-"], input=REAL_LINES["no-kernel-image"] + "\n")
    assert res.exit_code == 0 and "no-kernel-image" in res.output


def test_cli_target_reads_the_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Path] = []

    def applied(path: Path) -> set[str]:
        seen.append(path)
        return {AR}

    monkeypatch.setattr(commands_triage, "engine_hooks", lambda: (applied, lambda p, ids: ids))
    monkeypatch.setattr(commands_triage, "load_recipes", lambda directory=None: [recipe()])
    log = write_log(tmp_path, JIT_CRASH)
    res = CliRunner().invoke(SM120PATCH, ["diagnose", str(log), "--target", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert seen == [tmp_path]
    assert f"sm120patch rollback {tmp_path} --recipe {AR}" in res.output


def test_cli_without_engine_treats_journal_as_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing():
        raise ImportError("no engine")

    monkeypatch.setattr(commands_triage, "engine_hooks", missing)
    monkeypatch.setattr(commands_triage, "load_recipes", lambda directory=None: [recipe()])
    res = CliRunner().invoke(SM120PATCH, ["diagnose", str(write_log(tmp_path, JIT_CRASH)), "--target", str(tmp_path)])
    assert res.exit_code == 0
    assert "journal is unknown" in res.output and "journal unknown" in res.output


def test_cli_missing_target_is_usage_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        SM120PATCH, ["diagnose", str(write_log(tmp_path, JIT_CRASH)), "--target", str(tmp_path / "no")]
    )
    assert res.exit_code == 2 and "target not found" in res.output


def test_cli_target_that_is_not_a_package_tree_is_usage_error(tmp_path: Path) -> None:
    log = write_log(tmp_path, JIT_CRASH)
    empty = tmp_path / "empty"
    empty.mkdir()
    res = CliRunner().invoke(SM120PATCH, ["diagnose", str(log), "--target", str(empty)])
    assert res.exit_code == 2 and res.output.startswith("sm120patch: error: ")


def test_recipe_advice_is_one_line_in_notes() -> None:
    d = diagnose(JIT_CRASH, [recipe(advice="Needs 0.6.17.\nBenchmark TP4.")], {AR})
    assert any(n.endswith("Needs 0.6.17. Benchmark TP4.") for n in d.findings[0].notes)


def test_without_target_the_fix_is_named_with_the_shape_of_the_command(tmp_path: Path) -> None:
    res = CliRunner().invoke(SM120PATCH, ["diagnose", str(write_log(tmp_path, JIT_CRASH))])
    assert res.exit_code == 0, res.output
    assert (
        "sm120patch apply SGLANG FLASHINFER --recipe flashinfer-trtllm-comm-sm120 --recipe sglang-allreduce-fusion-sm120"
        in res.output
    )
