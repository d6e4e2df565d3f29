"""The probe ladder on real flashinfer-python / flashinfer-cubin releases from PyPI."""

from __future__ import annotations

import pytest

from sm120patch.arch import parse_arch
from sm120patch.catalogue.kernels import get_kernel
from sm120patch.probes import ProbeCache, probe_kernel
from sm120patch.probes import spec as spec_mod
from sm120patch.probes.artifact import scan_cubins
from sm120patch.probes.environment.flashinfer import from_python, from_tree
from sm120patch.probes.spec import check_spec
from tests.integration.fi_releases import site_with_cubin, spec_venv, unpacked

pytestmark = pytest.mark.releases

COMM = "flashinfer:trtllm_comm"
MOE120 = "flashinfer:cutlass_fused_moe_sm120"
GEN_MOE = "flashinfer:trtllm_gen_moe"
SM90, SM100, SM120, SM121 = (parse_arch(a) for a in ("sm_90", "sm_100", "sm_120", "sm_121"))
NEWEST = "0.7.4"


@pytest.mark.parametrize(
    "version, sm120", [("0.6.1", "fail"), ("0.6.16", "fail"), ("0.6.17", "pass"), (NEWEST, "pass")]
)
def test_trtllm_comm_static(version: str, sm120: str) -> None:
    fi = from_tree(unpacked("flashinfer-python", version))
    assert fi.version == version and fi.dist_versions["flashinfer-python"] == version
    v = probe_kernel(COMM, SM120, fi, "static")
    assert (v.result, v.rung) == (sm120, "static"), v
    gate = "[9, 10]" if sm120 == "fail" else "[9, 10, 12]"
    assert f"supported_major_versions={gate}" in v.reason
    for arch in (SM90, SM100):
        assert probe_kernel(COMM, arch, fi, "static").result == "pass"
    # the SM12x MoE generator keeps its [12] gate across the range
    assert probe_kernel(MOE120, SM120, fi, "static").result == "pass"
    assert probe_kernel(MOE120, SM90, fi, "static").result == "fail"
    assert probe_kernel(GEN_MOE, SM120, fi, "static").result == "fail"


def test_cubin_wheel_has_sm100_family_and_no_sm12x() -> None:
    fi = from_tree(site_with_cubin("0.6.1", "0.6.1"))
    assert fi.cubin_dir is not None
    scan = scan_cubins(fi.cubin_dir)
    assert len(scan.files) > 1000 and not [f for f in scan.files if f.error]
    assert {100, 103} <= set(scan.sms) and not {120, 121} & set(scan.sms), scan.sms
    for arch in (SM120, SM121):
        v = probe_kernel(GEN_MOE, arch, fi, "artifact")
        assert (v.result, v.rung) == ("fail", "artifact"), v
        assert "none for sm_12" in v.reason


@pytest.fixture(scope="module")
def venv_python() -> str:
    return str(spec_venv())


def _no_subprocess(*a: object, **k: object) -> None:
    raise AssertionError("a cached verdict started a subprocess")


def test_spec_rung_real_flashinfer_0_6_1(venv_python: str, tmp_path) -> None:
    fi = from_python(venv_python)
    assert fi.found and fi.version == "0.6.1" and fi.source == "installed"
    kernel = get_kernel(COMM)
    step = check_spec(kernel, SM120, fi)
    assert step.result == "fail" and step.final, step.reason
    assert "No supported CUDA architectures found for major versions [9, 10]" in step.reason
    step = check_spec(kernel, SM90, fi)
    assert step.result == "pass", step.reason
    cache = ProbeCache(tmp_path / "cache")
    v = probe_kernel(COMM, SM90, fi, "spec", cache)
    assert (v.result, v.rung) == ("pass", "spec"), v
    with pytest.MonkeyPatch.context() as m:  # a warm verdict must not start FlashInfer again
        m.setattr(spec_mod, "run_script", _no_subprocess)
        warm = probe_kernel(COMM, SM90, fi, "spec", cache)
    assert warm.cached and (warm.result, warm.rung) == ("pass", "spec")
    assert probe_kernel(COMM, SM120, fi, "spec").result == "fail"


@pytest.mark.parametrize("version", ["0.6.17", NEWEST])
def test_spec_rung_on_tree_via_pythonpath(venv_python: str, version: str) -> None:
    fi = from_tree(unpacked("flashinfer-python", version), python=venv_python)
    v = probe_kernel(COMM, SM120, fi, "spec")
    assert (v.result, v.rung) == ("pass", "spec"), v
    assert "FLASHINFER_CUDA_ARCH_LIST=12.0f" in v.reason
