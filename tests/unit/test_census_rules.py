"""The loader's rules as the CUDA documentation states them, one case per sentence, and the
agreement between what the census says the user will see and what `diagnose` names.

Oracle: the docs, written out here by hand (CUDA Programming Guide "Binary Compatibility",
"PTX Compatibility", and "Feature Availability": architecture-/family-specific features).
"""

from __future__ import annotations

import pytest

from sm120patch.arch import Arch
from sm120patch.census.fixes import arch_list, fix_for
from sm120patch.census.rules import (
    NO_IMAGE_ERROR,
    PTX_TOO_NEW_ERROR,
    Code,
    driver_cuda,
    driver_ptx_isa,
    judge,
    ptx_targets,
    sass_runs_on,
)
from sm120patch.triage.diagnose import diagnose

A = Arch


@pytest.mark.parametrize(
    "sass, gpu, runs",
    [
        # Binary Compatibility: a cubin for X.y runs on X.z, z >= y; never across majors
        ("sm_120", A(12, 0), True),
        ("sm_120", A(12, 1), True),
        ("sm_121", A(12, 0), False),
        ("sm_86", A(8, 9), True),
        ("sm_90", A(10, 0), False),
        ("sm_100", A(10, 3), True),
        ("sm_100", A(12, 0), False),
        # architecture-specific: exactly X.Y
        ("sm_120a", A(12, 0), True),
        ("sm_120a", A(12, 1), False),
        ("sm_121a", A(12, 1), True),
        ("sm_121a", A(12, 0), False),
        ("sm_90a", A(9, 0), True),
        ("sm_100a", A(10, 3), False),
        # family-specific: the family's later members too, never another major
        ("sm_120f", A(12, 0), True),
        ("sm_120f", A(12, 1), True),
        ("sm_100f", A(10, 3), True),
        ("sm_103f", A(10, 0), False),
        ("sm_100f", A(12, 0), False),
    ],
)
def test_sass_rules(sass: str, gpu: Arch, runs: bool) -> None:
    assert sass_runs_on(Code.parse(f"sass:{sass}"), gpu) is runs


@pytest.mark.parametrize(
    "ptx, gpu, jits",
    [
        # PTX Compatibility: plain compute_XY JIT-compiles for any GPU >= X.Y, across majors
        ("sm_90", A(12, 1), True),
        ("sm_120", A(12, 1), True),
        ("sm_120", A(10, 0), False),
        ("sm_80", A(8, 6), True),
        # arch-specific PTX: only X.Y; family PTX: only its family
        ("sm_120a", A(12, 0), True),
        ("sm_120a", A(12, 1), False),
        ("sm_90a", A(12, 0), False),
        ("sm_120f", A(12, 1), True),
        ("sm_100f", A(12, 0), False),
    ],
)
def test_ptx_rules(ptx: str, gpu: Arch, jits: bool) -> None:
    assert ptx_targets(Code.parse(f"ptx:{ptx}:8.7"), gpu) is jits


def test_driver_knows_ptx_isa_up_to_its_cuda() -> None:
    # CUDA Toolkit release notes: 570.26 is CUDA 12.8 (PTX ISA 8.7), 580.65.06 CUDA 13.0 (ISA 9.0)
    assert driver_cuda("570.133.07") == (12, 8)
    assert driver_ptx_isa("570.133.07") == (8, 7)
    assert driver_ptx_isa("580.95.05") == (9, 0)
    assert driver_cuda("470.223.02") is None
    assert driver_cuda(None) is None
    ptx90 = [Code.parse("ptx:sm_120:9.0")]
    assert not judge(ptx90, A(12, 1), "570.133.07").ok
    assert judge(ptx90, A(12, 1), "570.133.07").error == PTX_TOO_NEW_ERROR
    assert judge(ptx90, A(12, 1), "580.95.05").how == "jit"
    # no driver known (no GPU here, --arch): taken as JIT-able, and the why says it depends
    v = judge(ptx90, A(12, 1), None)
    assert v.ok and "driver-dependent" in v.why


def test_sass_is_preferred_to_ptx() -> None:
    v = judge([Code.parse("ptx:sm_90:8.0"), Code.parse("sass:sm_120")], A(12, 1))
    assert (v.how, v.image) == ("sass", "sm_120")
    v = judge([Code.parse("sass:sm_120a"), Code.parse("sass:sm_90a")], A(12, 1))
    assert (v.ok, v.error) == (False, NO_IMAGE_ERROR)
    assert "sm_90a, sm_120a" in v.why


@pytest.mark.parametrize(
    "text, signature",
    [
        (f"RuntimeError: CUDA error: {NO_IMAGE_ERROR}", "no-kernel-image"),
        (f"RuntimeError: CUDA error: {PTX_TOO_NEW_ERROR}", "ptx-jit-too-new"),
        ("ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'", "ptxas-unknown-sm12x"),
    ],
)
def test_diagnose_names_what_the_census_says_you_will_see(text: str, signature: str) -> None:
    d = diagnose([text], [], None)
    assert d.findings and d.findings[0].signature == signature


def test_fix_asks_for_the_family_with_the_suffix_the_package_uses() -> None:
    assert arch_list(A(12, 1), ["sm_90a", "sm_100a"]) == "12.0a;12.1a"
    assert arch_list(A(12, 1), ["sm_80", "sm_90"]) == "12.0;12.1"
    assert 'TORCH_CUDA_ARCH_LIST="12.0;12.1"' in fix_for("some-ext", "1.2", A(12, 1), ["sm_90"])
    assert "some-ext==1.2" in fix_for("some-ext", "1.2", A(12, 1), ["sm_90"])
    assert "download.pytorch.org/whl/cu128" in fix_for("torch", "2.1.0", A(12, 0), ["sm_90"])
    assert "uninstall flashinfer-jit-cache" in fix_for("flashinfer-jit-cache", "0.6.1", A(12, 1), [])


@pytest.mark.parametrize(
    "flags, suffix",
    # e_flags of real flashinfer-cubin 0.6.1 cubins (no -arch in their tkinfo note), named
    # fmhaSm100aKernel_* / fmhaSm103aKernel_* / *_sm100f.cubin; and nvcc 13.0's sm_120 cubin
    [(0xF00640C, "a"), (0x600670A, "a"), (0x6006402, ""), (0x6007802, "")],
)
def test_cubin_suffix_from_e_flags_without_the_ptxas_command_line(tmp_path, flags: int, suffix: str) -> None:
    from sm120patch.probes.environment.elf import read_file_code
    from tests.unit.fi_fakes import elf64_header

    path = tmp_path / "k.cubin"
    path.write_bytes(elf64_header(190, flags, 8) + b"\0" * 32)
    (entry,) = read_file_code(path).entries
    assert (entry.sm, entry.suffix) == ((flags >> 8) & 0xFF, suffix)


def test_site_packages_of_an_interpreter_and_of_a_package(tmp_path) -> None:
    import sys
    import sysconfig
    from pathlib import Path

    from sm120patch.census import site_packages_for, site_packages_of, sites_for

    here = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert here in site_packages_for(sys.executable)  # asked in a subprocess
    assert site_packages_for(str(tmp_path / "no-python")) == []
    site = tmp_path / "site"
    (site / "pkg" / "sub").mkdir(parents=True)
    (site / "pkg-1.0.dist-info").mkdir()
    assert site_packages_of(site / "pkg" / "sub") == site
    assert sites_for((), None, [site / "pkg"]) == [site.resolve()]
    assert sites_for([site], sys.executable, []) == [site.resolve()]  # --site-packages wins
