"""The build rung on a fake FlashInfer whose module is two tiny CUDA units we write: nvcc
compiles them for the arch (device code only), and the cubins are read back. Runs wherever
an nvcc that builds for SM12x (CUDA >= 12.9) exists, GPU or not; skipped, saying so, elsewhere."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sm120patch.arch import parse_arch
from sm120patch.catalogue.kernels import get_kernel
from sm120patch.probes import ProbeCache, build, probe_kernel, spec
from sm120patch.probes.environment.device import CudaToolkit, can_build_for, find_cuda
from sm120patch.probes.environment.flashinfer import from_tree
from tests.unit.fi_fakes import BODY_OPEN, make_buildable_tree

SM90, SM120 = parse_arch("sm_90"), parse_arch("sm_120")
COMM = "flashinfer:trtllm_comm"
CUDA = find_cuda()
requires_nvcc = pytest.mark.skipif(
    not can_build_for(CUDA, SM120, family=True)[0],
    reason=f"build rung needs nvcc for sm_120f: {can_build_for(CUDA, SM120, family=True)[1]}",
)


@pytest.fixture(autouse=True)
def _private_homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "fi-home"))


def _fi(tmp_path: Path, guarded: bool, **kw: str):  # noqa: ANN202
    return from_tree(make_buildable_tree(tmp_path / "fi", guarded, **kw), python=sys.executable)


@requires_nvcc
def test_compiled_out_bodies_fail_and_name_the_family(tmp_path: Path) -> None:
    v = probe_kernel(COMM, SM120, _fi(tmp_path, guarded=True), "build", ProbeCache(tmp_path / "c"))
    assert (v.result, v.rung) == ("fail", "build"), v.reason
    assert "3 of 3 fake_lamport_kernel instantiations have an empty body for sm_120" in v.reason
    assert "fake_two_shot_kernel" not in v.reason
    b = v.evidence["build"]
    assert (
        b["sms"] == [120]
        and b["kernels"] == 4
        and b["empty"] == [{"family": "fake_lamport_kernel", "empty": 3, "of": 3}]
    )
    # what the build read from FlashInfer is in the evidence, by sha256
    assert "data/include/fake/body.cuh" in v.evidence["files"] and "data/csrc/fake_comm.cu" in v.evidence["files"]


@requires_nvcc
def test_the_same_source_passes_on_an_arch_whose_bodies_exist(tmp_path: Path) -> None:
    fi = _fi(tmp_path, guarded=True)
    v = probe_kernel(COMM, SM90, fi, "build", ProbeCache(tmp_path / "c"))
    assert (v.result, v.rung) == ("pass", "build"), v.reason
    assert "4 kernels with sm_90 SASS, none with an empty body" in v.reason


@requires_nvcc
def test_warm_build_reads_hashes_only_and_a_header_edit_rebuilds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fi = _fi(tmp_path, guarded=True)
    cold = probe_kernel(COMM, SM120, fi, "build", ProbeCache(tmp_path / "c"))
    assert cold.result == "fail" and not cold.cached

    def no_nvcc(*a: object, **k: object) -> None:
        raise AssertionError("a warm build ran nvcc")

    with monkeypatch.context() as m:
        m.setattr(build, "_run_nvcc", no_nvcc)
        warm = probe_kernel(COMM, SM120, fi, "build", ProbeCache(tmp_path / "c"))  # verdict cache
        again = build.check_build(get_kernel(COMM), SM120, fi, tmp_path / "c")  # cubin cache, no verdict cache
    assert warm.cached and warm.reason == cold.reason
    assert again.result == "fail" and "all from cache" in again.reason
    # the fix lands in a header: the verdict and the cubin of the unit that includes it are redone
    (fi.package_dir / "data" / "include" / "fake" / "body.cuh").write_text(BODY_OPEN)
    fixed = probe_kernel(COMM, SM120, fi, "build", ProbeCache(tmp_path / "c"))
    assert not fixed.cached and fixed.result == "pass", fixed.reason
    assert "1 compiled" in fixed.reason  # fake_other.cu did not include it: still from cache


@requires_nvcc
def test_a_warm_build_starts_no_interpreter_and_a_header_rebuilds_only_its_units(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No verdict cache: the compile commands come from the answer cache (every Python file the
    generator loaded unchanged), the cubins from theirs (every header nvcc read unchanged)."""
    fi = _fi(tmp_path, guarded=True)
    kernel = get_kernel(COMM)
    cold = build.check_build(kernel, SM120, fi, tmp_path / "c")
    assert cold.result == "fail" and "2 compiled" in cold.reason
    compiled: list[str] = []
    real_nvcc = build._run_nvcc

    def nvcc(argv: list[str], timeout: float):  # noqa: ANN202
        compiled.append(next(Path(a).name for a in argv if a.endswith(".cu")))
        return real_nvcc(argv, timeout)

    def no_interpreter(*a: object, **k: object) -> None:
        raise AssertionError("a warm build started the target interpreter (FlashInfer, torch)")

    with monkeypatch.context() as m:
        m.setattr(spec, "run_script", no_interpreter)
        m.setattr(build, "_run_nvcc", nvcc)
        warm = build.check_build(kernel, SM120, fi, tmp_path / "c")
        assert warm.result == "fail" and "all from cache" in warm.reason and compiled == []
        # a header only fake_comm.cu includes: that unit is compiled again, fake_other.cu is not
        (fi.package_dir / "data" / "include" / "fake" / "body.cuh").write_text(BODY_OPEN)
        fixed = build.check_build(kernel, SM120, fi, tmp_path / "c")
    assert fixed.result == "pass" and "1 compiled" in fixed.reason, fixed.reason
    assert compiled == ["fake_comm.cu"]
    # the generator itself changed: FlashInfer is asked again for its commands
    comm = fi.package_dir / "jit" / "comm.py"
    comm.write_text(comm.read_text() + "\n# edited\n")
    with monkeypatch.context() as m:
        m.setattr(spec, "run_script", no_interpreter)
        with pytest.raises(AssertionError, match="started the target interpreter"):
            build.check_build(kernel, SM120, fi, tmp_path / "c")


@requires_nvcc
def test_an_arch_the_generator_refuses_fails_before_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fi = _fi(tmp_path, guarded=False, gate="[9, 10]")
    monkeypatch.setattr(build, "_run_nvcc", lambda *a, **k: pytest.fail("nvcc ran"))
    step = build.check_build(get_kernel(COMM), SM120, fi, tmp_path / "c")
    assert step.result == "fail" and "No supported CUDA architectures found for major versions [9, 10]" in step.reason


def test_no_toolkit_or_no_interpreter_is_unknown_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fi = from_tree(make_buildable_tree(tmp_path / "fi", guarded=False))
    step = build.check_build(get_kernel(COMM), SM120, fi, tmp_path / "c")
    assert step.result == "unknown" and "no Python interpreter" in step.reason and "--python EXE" in step.reason
    fi.python = sys.executable
    monkeypatch.setattr(build, "find_cuda", lambda: CudaToolkit())
    step = build.check_build(get_kernel(COMM), SM120, fi, tmp_path / "c")
    assert step.result == "unknown" and "no CUDA toolkit found" in step.reason
    monkeypatch.setattr(build, "find_cuda", lambda: CudaToolkit("12.4", "/x/nvcc", "/x"))
    step = build.check_build(get_kernel(COMM), SM120, fi, tmp_path / "c")
    assert step.result == "unknown" and "too old" in step.reason


def test_requested_build_without_nvcc_reaches_static_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verdict shows the rung reached (static), the rung asked (build), and why."""
    monkeypatch.setattr(build, "find_cuda", lambda: CudaToolkit())
    fi = from_tree(make_buildable_tree(tmp_path / "fi", guarded=False))
    v = probe_kernel(COMM, SM120, fi, "build")
    assert (v.result, v.rung, v.asked) == ("pass", "static", "build") and v.short_of_asked
    assert "no Python interpreter" in v.reason


def test_depfile_and_kernel_family_parsing(tmp_path: Path) -> None:
    from sm120patch.probes.environment.elf import kernel_family

    d = tmp_path / "x.d"
    d.write_text("/o/x.cubin : /src/a.cu \\\n  /inc/b.cuh /inc/c.cuh \\\n  /usr/include/d.h\n")
    assert build._read_depfile(d) == ["/src/a.cu", "/inc/b.cuh", "/inc/c.cuh", "/usr/include/d.h"]
    assert kernel_family("_ZN10flashinfer4comm9my_kernelILi1EEEvv") == "my_kernel"
    assert kernel_family("_Z3fooILi2EEvPf") == "foo"
    assert kernel_family("sm120patch_empty_kernel") == "sm120patch_empty_kernel"
