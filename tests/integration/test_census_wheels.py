"""The census on real wheels from PyPI, against the arch lists their upstreams document.

Wheels are fetched once with `pip download --platform` into the shared cache
(~/.cache/sm120patch/pypi) and their CUDA files (plus dist-info) unpacked once into
trees/census-<wheel>/ (tools/wheels.py), marked complete only when whole; a run finds them there.

Oracles (not our reader):
- torchvision 0.24.0, manylinux_2_28_x86_64 (PyPI's build is CUDA 12.8): PyTorch builds
  its CUDA 12.8 release wheels with TORCH_CUDA_ARCH_LIST="7.0;7.5;8.0;8.6;9.0;10.0;12.0"
  (pytorch/pytorch .ci/manywheel/build_cuda.sh, the `12.8)` case): plain sm_120 SASS, so
  it runs on 12.0 and on DGX Spark's 12.1.
- torchvision 0.16.0, manylinux1_x86_64 (torch 2.1, CUDA 12.1): those builds stop at sm_90
  (the arch list PyTorch's own warning prints for them: "supports CUDA capabilities sm_50
  sm_60 sm_70 sm_75 sm_80 sm_86 sm_90", e.g. pytorch/pytorch#150733); no SM12x SASS.
- sglang-kernel 0.4.10 (slow: the x86_64 wheel is 373 MB, 1.1 GB unpacked): issue 22 and
  the reports it cites (sglang#29317: cuobjdump by hand) say its aarch64 wheel has sm_121a
  (common_ops) and x86_64 does not, and that flash_ops/flashmla_ops carry no SM12x code
  and no PTX. FlashMLA is a Hopper/Blackwell-datacenter kernel library (deepseek-ai/FlashMLA
  README: SM90 and SM100), so no SM12x image there is upstream's stated scope.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sm120patch import census
from sm120patch.arch import Arch
from sm120patch.census import render
from sm120patch.engine.preflight import census_fails
from tests.conftest import fetch_or_skip, needs_tool, pristine_or_skip, unavailable
from tests.unit.test_census_nvcc import build_fatbins
from tools import wheels

pytestmark = pytest.mark.releases
SM120, SM121 = Arch(12, 0), Arch(12, 1)


def _site(dist: str, version: str, platform: str, keep_wheel: bool = True, python: bool = False) -> Path:
    """tools/wheels.py's unpacked tree of the wheel; a failed download is `unavailable` (a failure in CI)."""
    try:
        return wheels.census_site(dist, version, platform, keep_wheel=keep_wheel, python=python)
    except RuntimeError as e:
        unavailable(str(e))


def _row(report: dict, name: str) -> dict:
    return next(r for r in report["distributions"] if r["name"] == name)


def test_torchvision_cu128_runs_on_sm120_and_dgx_spark(tmp_path: Path) -> None:
    site = _site("torchvision", "0.24.0", "manylinux_2_28_x86_64")
    report = census.census([site], [SM120, SM121], cache_root=tmp_path, env={})
    tv = _row(report, "torchvision")
    c_so = next(m for m in tv["gpus"]["sm_121"]["modules"] if m.endswith("_C.so"))
    documented = ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    assert set(documented) <= set(tv["sass"])
    for gpu in ("sm_120", "sm_121"):
        v = tv["gpus"][gpu]["modules"][c_so]
        assert (v["status"], v["how"], v["image"]) == ("ok", "sass", "sm_120"), v
    assert not [p for p in report["problems"] if p["package"] == "torchvision"]


def test_old_torchvision_has_no_sm12x_sass(tmp_path: Path) -> None:
    site = _site("torchvision", "0.16.0", "manylinux1_x86_64")
    report = census.census([site], [SM120, SM121, Arch(9, 0)], cache_root=tmp_path, env={})
    tv = _row(report, "torchvision")
    assert {"sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"} <= set(tv["sass"])
    assert not [s for s in tv["sass"] if s.startswith("sm_12")]
    c_so = next(m for m in tv["modules"] if m.endswith("_C.so"))
    # sm_90 SASS on 9.0; on 12.x only the PTX its build kept (compute_50) can be JIT-compiled
    assert tv["gpus"]["sm_90"]["modules"][c_so]["how"] == "sass"
    for gpu in ("sm_120", "sm_121"):
        v = tv["gpus"][gpu]["modules"][c_so]
        assert v["how"] == "jit" and v["image"].startswith("compute_"), v
    assert tv["gpus"]["sm_120"]["status"] == "jit"


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["manylinux2014_aarch64", "manylinux2014_x86_64"])
def test_sglang_kernel_0_4_10(tmp_path: Path, platform: str) -> None:
    site = _site("sglang-kernel", "0.4.10", platform, keep_wheel=platform.endswith("aarch64"), python=True)
    report = census.census([site], [SM120, SM121], cache_root=tmp_path, env={})
    sk = _row(report, "sglang-kernel")
    mods = {Path(m).name.split(".")[0] + ("@" + Path(m).parent.name): m for m in sk["modules"]}
    common = mods["common_ops@sm100"]
    spark = sk["gpus"]["sm_121"]["modules"][common]
    if platform.endswith("aarch64"):
        assert (spark["status"], spark["image"]) == ("ok", "sm_121a"), spark
    else:
        assert spark["status"] == "none", spark
        assert spark["error"] == "no kernel image is available for execution on the device"
    for key, path in mods.items():
        if key.startswith(("flash_ops", "flashmla_ops")):
            for gpu in ("sm_120", "sm_121"):
                assert sk["gpus"][gpu]["modules"][path]["status"] == "none", (key, gpu)
    assert not sk["ptx"], sk["ptx"]  # no PTX anywhere in the wheel: nothing to JIT from
    problem = next(p for p in report["problems"] if p["package"] == "sglang-kernel" and p["gpu"] == "sm_121")
    assert problem["fix"] and problem["you_will_see"]
    # does it fail every start? The wheel's own source says how each module without an image is loaded:
    # flashmla_ops in a try block (sgl_kernel/flash_mla.py), infllm_ops by a function of infllm_v2/_loader.py
    # that only a feature calls; common_ops at import (load_utils, run by the package's __init__)
    fails, warnings = census_fails(report)
    spark = [p for p in report["problems"] if p["package"] == "sglang-kernel" and p["gpu"] == "sm_121"]
    loading = {Path(m).name.split(".")[0]: kind for p in spark for m, kind in p["loading"].items()}
    if platform.endswith("aarch64"):
        assert loading == {"flashmla_ops": "optional", "infllm_ops": "on-use"}, loading
        assert not [f for f in fails if "sm_121" in f], fails
        (warn,) = [w for w in warnings if "sm_121" in w]
        assert "sgl_kernel/flash_mla.py" in warn and "infllm_v2/_loader.py" in warn
    else:
        assert loading[next(k for k in loading if k == "common_ops")] == "import", loading
        assert [f for f in fails if f.startswith("sglang-kernel 0.4.10 cannot run on sm_121")], fails
    # warm: the same answer from the cache, no file read
    warm = census.census([site], [SM120, SM121], cache_root=tmp_path, env={})
    assert warm["files_read"] == 0 and warm["distributions"] == report["distributions"]


def test_preflight_census_names_the_package_and_the_recipe(tmp_path: Path) -> None:
    """End to end: `preflight --json` and text on a real SGLang 0.5.9 with a flashinfer-jit-cache
    whose trtllm_comm module nvcc built for sm_120a only, planned for a DGX Spark (sm_121)."""
    built = build_fatbins()
    site = tmp_path / "site"
    fetch_or_skip("sglang", "0.5.9", site)
    mod = site / "flashinfer_jit_cache" / "jit_cache" / "trtllm_comm" / "trtllm_comm.so"
    mod.parent.mkdir(parents=True)
    shutil.copy(built / "sm_120a.so", mod)
    info = site / "flashinfer_jit_cache-0.6.1.dist-info"
    info.mkdir()
    (info / "RECORD").write_text(f"{mod.relative_to(site).as_posix()},,\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path)}
    base = [sys.executable, "-m", "sm120patch", "preflight", str(site / "sglang"), "--arch", "sm_121"]
    base += ["--no-torch", "--probe", "none"]
    r = subprocess.run([*base, "--json"], capture_output=True, text=True, timeout=300, env=env)
    report = json.loads(r.stdout)
    # flashinfer-jit-cache is a package the server loads: it cannot run on sm_121, so preflight exits 1
    assert r.returncode == 1, r.stderr
    assert report["census_fails"] == [
        "flashinfer-jit-cache 0.6.1 cannot run on sm_121 (none): "
        "CUDA error: no kernel image is available for execution on the device"
    ]
    c = report["census"]
    assert c["site_packages"] == [str(site.resolve())] and c["archs"] == ["sm_121"]
    (p,) = [p for p in c["problems"] if p["package"] == "flashinfer-jit-cache"]
    assert p["modules"] == ["flashinfer_jit_cache/jit_cache/trtllm_comm/trtllm_comm.so"]
    assert p["you_will_see"] == ["CUDA error: no kernel image is available for execution on the device"]
    assert "uninstall flashinfer-jit-cache" in p["fix"]
    row = next(x for x in report["recipes"] if x["id"] == "sglang-allreduce-fusion-sm120")
    assert any("flashinfer:trtllm_comm lives in flashinfer-jit-cache 0.6.1" in line for line in row["census"])
    text = subprocess.run(base, capture_output=True, text=True, timeout=300, env=env).stdout
    assert "census: 1 distributions with CUDA code" in text
    assert "you will see: CUDA error: no kernel image is available" in text
    off = subprocess.run([*base, "--json", "--no-census"], capture_output=True, text=True, timeout=300, env=env)
    assert "census" not in json.loads(off.stdout)


def test_flashinfer_cubin_images_match_their_names(tmp_path: Path) -> None:
    """flashinfer-cubin 0.6.1 (the tree the probe tests use): each trtllm-gen cubin's name says
    the target it was built for (`fmhaSm103aKernel_...`, `..._sm100f.cubin`); the census reads
    the same from the bytes, and on SM12x none of its 5,292 cubins has an image."""
    import re

    site = pristine_or_skip("flashinfer-cubin", "0.6.1")
    report = census.census([site], [Arch(10, 0), Arch(10, 3), SM121], cache_root=tmp_path, env={})
    fc = _row(report, "flashinfer-cubin")
    named = 0
    for gpu in ("sm_100", "sm_103", "sm_121"):
        modules = fc["gpus"][gpu]["modules"]
        for path, v in modules.items():
            m = re.findall(r"(?i)sm_?(\d{3})([af]?)(?![0-9])", Path(path).name)
            if not m:
                continue
            named += 1
            sm, suffix = int(m[-1][0]), m[-1][1].lower()
            want = {"sm_100": (10, 0), "sm_103": (10, 3), "sm_121": (12, 1)}[gpu]
            # the documented rules applied to the name's target, by hand
            runs = (sm // 10, sm % 10) == want if suffix == "a" else (sm // 10 == want[0] and sm % 10 <= want[1])
            assert (v["status"] == "ok") is runs, (path, gpu, v)
    assert named > 4000
    assert fc["gpus"]["sm_121"]["status"] == "none" and len(fc["gpus"]["sm_121"]["cannot_run"]) == 5292
    assert "Unsupported architecture" in next(p for p in report["problems"] if p["gpu"] == "sm_121")["note"]


def test_a_cpu_torch_is_named_as_such(tmp_path: Path) -> None:
    """A CPU torch (`2.13.0+cpu`, PyTorch's CPU index) carries shared objects but no CUDA code;
    the census says so instead of listing nothing. Built here, not installed: `pip install
    torch==2.13.0` from PyPI on Linux x86_64 is the CUDA 13.0 build (`+cu130`, gigabytes), so the
    CPU case is a dist-info of its own whose libraries are host ELFs cc builds without a fatbin."""
    cc = needs_tool("cc", "it builds the CPU library")
    site = tmp_path / "site"
    lib = site / "torch" / "lib"
    lib.mkdir(parents=True)
    (tmp_path / "cpu.c").write_text("int at_cpu_kernel(int x) { return x + 1; }\n")
    for name in ("libtorch_cpu.so", "libc10.so"):
        r = subprocess.run(
            [cc, "-shared", "-fPIC", "-o", str(lib / name), str(tmp_path / "cpu.c")], capture_output=True
        )
        assert r.returncode == 0, r.stderr
    info = site / "torch-2.13.0+cpu.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
    (info / "RECORD").write_text(
        "torch/lib/libtorch_cpu.so,,\ntorch/lib/libc10.so,,\ntorch-2.13.0+cpu.dist-info/RECORD,,\n"
    )
    report = census.census([site], [SM120], cache_root=tmp_path / "c", env={})
    assert not [r for r in report["distributions"] if r["name"] == "torch"]
    (note,) = [n for n in report["notes"] if n.startswith("torch ")]
    assert note.startswith("torch 2.13.0+cpu has no CUDA code in its 2 shared objects (a CPU build)"), note


# NVIDIA's CUDA 13 math libraries from PyPI. The oracle for 9.0 is the GPU: on an NVIDIA H200
# (driver 580.159.04) cuFFT fft/rfft2, cuSPARSE CSR x dense and cuBLAS/cuBLASLt matmuls ran
# (issue 30; tests/unit/test_census_calibration.py holds the recorded run). For 12.0/12.1 it is
# NVIDIA's support matrix: the CUDA 13.0 libraries support compute capability 7.5 to 12.1
# (CUDA 13.0 release notes, "Supported architectures"). Before issue 30 the census called
# cuFFT `NO` and cuSPARSE/cuBLAS `partial` on all three.
NVIDIA_GPUS = [Arch(9, 0), SM120, SM121]


def _nvidia(report: dict, name: str) -> dict:
    row = _row(report, name)
    assert not [p for p in report["problems"] if p["package"] == name], report["problems"]
    return row


def test_nvidia_cufft_12_keeps_its_kernels_where_the_headers_cannot_tell(tmp_path: Path) -> None:
    from sm120patch.probes.environment.elf import read_file_code

    site = _site("nvidia-cufft", "12.0.0.61", "manylinux2014_x86_64")
    lib = site / "nvidia" / "cu13" / "lib" / "libcufft.so.12"
    code = read_file_code(lib)
    # what made the old census say NO: its .nv_fatbin is one sm_75 cubin; the kernels are in .ldata
    assert [e.code for e in code.entries] == ["sass:sm_75"] and code.data_section.startswith(".ldata ")
    report = census.census([site], NVIDIA_GPUS, driver="580.159.04", cache_root=tmp_path, env={})
    row = _nvidia(report, "nvidia-cufft")
    for gpu in ("sm_90", "sm_120", "sm_121"):
        g = row["gpus"][gpu]
        assert g["status"] == "unknown", g
        v = g["modules"]["nvidia/cu13/lib/libcufft.so.12"]
        assert v["why"].startswith("cannot tell from the headers") and ".ldata" in v["why"], v
    assert "cannot tell from the headers" in "\n".join(render.render_lines(report))


def test_nvidia_cusparse_12_6_runs_with_its_single_arch_units_noted(tmp_path: Path) -> None:
    site = _site("nvidia-cusparse", "12.6.3.3", "manylinux2014_x86_64")
    report = census.census([site], NVIDIA_GPUS, driver="580.159.04", cache_root=tmp_path, env={})
    row = _nvidia(report, "nvidia-cusparse")
    for gpu, image in (("sm_90", "sm_90"), ("sm_120", "sm_120"), ("sm_121", "sm_120")):
        g = row["gpus"][gpu]
        v = g["modules"]["nvidia/cu13/lib/libcusparse.so.12"]
        assert (g["status"], v["status"], v["image"]) == ("ok", "ok", image), v
        assert v["other_arch_units"] > 0 and "only other architectures' code" in v["note"]


@pytest.mark.slow
def test_nvidia_cublas_13_1_runs_on_hopper_and_sm12x(tmp_path: Path) -> None:
    site = _site("nvidia-cublas", "13.1.0.3", "manylinux_2_27_x86_64")
    report = census.census([site], NVIDIA_GPUS, driver="580.159.04", cache_root=tmp_path, env={})
    row = _nvidia(report, "nvidia-cublas")
    for gpu in ("sm_90", "sm_120", "sm_121"):
        g = row["gpus"][gpu]
        assert g["status"] == "ok", g
        lt = g["modules"]["nvidia/cu13/lib/libcublasLt.so.13"]
        assert lt["status"] == "ok" and lt["other_arch_units"] > 100, lt  # sm_100-only, sm_103-only, ... units
