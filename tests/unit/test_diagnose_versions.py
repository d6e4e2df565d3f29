"""The releases that fixed a toolchain for an SM12x arch (patches/fixed_versions.toml) are named in the advice for
a crash that shows that tool lacking that arch, each with its source; the table holds facts with their URLs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sm120patch.errors import RecipeError
from sm120patch.triage.versions import load, rows_for
from tests.unit.cli_entry import SM120PATCH

TRITON_121 = (
    "Traceback (most recent call last):\n"
    "RuntimeError: Internal Triton PTX codegen error\n"
    "ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'\n"
)
NVCC_120 = "nvcc fatal   : Unsupported gpu architecture 'compute_120'\n"


def test_every_row_has_its_source() -> None:
    rows = load()
    assert rows and all(r.source.startswith("https://") and r.fact and r.archs for r in rows)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (TRITON_121, {("triton", "3.6.0"), ("triton", "TRITON_PTXAS_PATH")}),
        (NVCC_120, {("cuda", "12.8")}),
        ("RuntimeError: 'sm_120' is not a recognized processor for this target (triton)", {("triton", "3.3.0")}),
        ("ptxas fatal   : Value 'sm_90a' is not defined for option 'gpu-name'", set()),  # not an SM12x arch row
    ],
)
def test_rows_for_the_tool_and_arch_the_log_names(text: str, want: set[tuple[str, str]]) -> None:
    assert {(r.component, r.version) for r in rows_for(text, load())} == want


def test_diagnose_names_the_release_and_its_source(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(TRITON_121, encoding="utf-8")
    res = CliRunner().invoke(SM120PATCH, ["diagnose", "--json", str(log)])
    assert res.exit_code in (0, 1), res.output
    [cause] = [f for f in json.loads(res.stdout)["findings"] if f["fatal"] and f["class"] == "toolchain-lacks-arch"]
    notes = " ".join(cause["notes"])
    assert "triton 3.6.0" in notes and "https://github.com/triton-lang/triton/issues/10331" in notes
    assert "TRITON_PTXAS_PATH" in notes


def test_a_row_without_a_source_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "fixed_versions.toml"
    bad.write_text('[[fix]]\ncomponent = "cuda"\narchs = ["sm_120"]\nversion = "12.8"\nfact = "x"\nsource = "a blog"\n')
    with pytest.raises(RecipeError, match="https URL"):
        load(bad)


@pytest.mark.parametrize(
    ("majors", "signature", "cls"),
    [
        ("[12]", "flashinfer-jit-major-12-without-arch", "toolchain-lacks-arch"),
        ("[9, 10, 12]", "flashinfer-jit-major-12-without-arch", "toolchain-lacks-arch"),
        ("[9, 10]", "flashinfer-jit-arch-excluded", "arch-path-unsupported"),
        ("[10, 11]", "flashinfer-jit-arch-excluded", "arch-path-unsupported"),
    ],
)
def test_a_flashinfer_module_that_lists_major_12_and_still_finds_no_arch_is_the_toolchain(
    tmp_path: Path, majors: str, signature: str, cls: str
) -> None:
    """Major 12 in the module's list: the GPU's major was allowed, the arch list FlashInfer built from held none
    (an nvcc older than it asks for SM12x); without 12 the module lacks the major, as before."""
    log = tmp_path / "server.log"
    log.write_text(
        "  File \"/v/flashinfer/jit/fused_moe.py\", line 70, in gen_cutlass_fused_moe_sm120_module\n"
        f"RuntimeError: No supported CUDA architectures found for major versions {majors}.\n",
        encoding="utf-8",
    )
    res = CliRunner().invoke(SM120PATCH, ["diagnose", "--json", str(log)])
    [cause] = [f for f in json.loads(res.stdout)["findings"] if f["fatal"]]
    assert (cause["signature"], cause["class"]) == (signature, cls)
    if cls == "toolchain-lacks-arch":
        assert "CUDA 12.9" in cause["next_step"] and "FLASHINFER_CUDA_ARCH_LIST" in cause["next_step"]
