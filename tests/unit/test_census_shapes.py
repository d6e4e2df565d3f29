"""The census on the two shapes NVIDIA's own libraries have, built here by nvcc 13:

- a module of several translation units, one built only for an arch-specific target
  (`multi.so`: k.cu for sm_90 + sm_120 + compute_120, g.cu for sm_100a only, linked by
  `nvcc -shared`, which adds its own device-link unit for sm_75), as cuBLAS keeps sm_100a-only
  and cuSPARSE sm_80-only units;
- LTO IR (`-gencode arch=compute_90,code=lto_90`), as cuFFT 12 carries its kernels, in a loose
  `.fatbin` (nvcc -fatbin) and in the `.nv_fatbin` section of two host .so files (objcopy): one
  that never mentions nvJitLink, one that dlopens `libnvJitLink.so.13` as cuFFT does.

The oracle is what nvcc was asked to build and the documented rules, by hand: a unit for
sm_100a runs only on 10.0 [FEAT], so on 9.0 and 12.x its kernels are never launched and the
module runs (ok, with a note); on 10.0 k.cu's unit (sm_90, sm_120, compute_120) has no image
(sm_90/sm_120 SASS are other majors [BIN], compute_120 PTX is newer than 10.0 [PTX]), so the
module's general kernels fail there (partial); on 10.3 nothing fits (none). LTO IR is never
loaded by the driver: on the H200 (tests/data/census/census-h200.json, shape 7) an nvcc-built .so
with lto_90 + sm_100a failed with "no kernel image"; a library that links it itself through
nvJitLink [LTO] runs it on any GPU >= 9.0 with an nvJitLink of its CUDA major.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from sm120patch import census
from sm120patch.arch import Arch
from sm120patch.probes.environment.elf import read_file_code
from tests.conftest import needs_tool

K = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }\n'
G = 'extern "C" __global__ void g(float* x) { x[threadIdx.x] *= 2.0f; }\n'
K_FLAGS = ["-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_120,code=sm_120"]
K_FLAGS += ["-gencode", "arch=compute_120,code=compute_120"]
G_FLAGS = ["-gencode", "arch=compute_100a,code=sm_100a"]
LTO_FLAGS = ["-gencode", "arch=compute_90,code=lto_90"]


def _run(cmd: list[str], cwd: Path) -> None:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}: {r.stderr[-500:]}"


@pytest.fixture(scope="session")
def shapes() -> Path:
    """multi.so, lto_90.fatbin and lto_90.so, built once (cached by nvcc's version and the flags)."""
    nvcc = needs_tool("nvcc", "the census shapes are built with nvcc")
    needs_tool("objcopy", "the loose fatbin is cut out of an object with objcopy")
    needs_tool("cc", "the nvJitLink stand-in is built with cc")
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    key = hashlib.sha256(json.dumps([version, K, G, K_FLAGS, G_FLAGS, LTO_FLAGS, "jitlink"]).encode()).hexdigest()[:16]
    root = Path(os.environ.get("SM120PATCH_CACHE", Path.home() / ".cache" / "sm120patch")) / "census-shapes" / key
    if (root / ".complete").exists():
        return root
    tmp = root.with_name(root.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "k.cu").write_text(K)
    (tmp / "g.cu").write_text(G)
    (tmp / "host.c").write_text("int host_symbol(void) { return 1; }\n")
    (tmp / "jit.c").write_text('#include <dlfcn.h>\nvoid *load(void) { return dlopen("libnvJitLink.so.13", 2); }\n')
    _run([nvcc, "-c", "-Xcompiler", "-fPIC", "-o", "k.o", "k.cu", *K_FLAGS], tmp)
    _run([nvcc, "-c", "-Xcompiler", "-fPIC", "-o", "g.o", "g.cu", *G_FLAGS], tmp)
    _run([nvcc, "-shared", "-o", "multi.so", "k.o", "g.o"], tmp)
    _run([nvcc, "-fatbin", "-o", "lto_90.fatbin", "k.cu", *LTO_FLAGS], tmp)
    _run(["cc", "-shared", "-fPIC", "-o", "host.so", "host.c"], tmp)
    _run(["objcopy", "--add-section", ".nv_fatbin=lto_90.fatbin", "--set-section-flags",
          ".nv_fatbin=alloc,readonly,data", "host.so", "lto_90.so"], tmp)  # fmt: skip
    _run(["cc", "-shared", "-fPIC", "-o", "jit.so", "jit.c"], tmp)
    _run(["objcopy", "--add-section", ".nv_fatbin=lto_90.fatbin", "--set-section-flags",
          ".nv_fatbin=alloc,readonly,data", "jit.so", "lto_90_jitlink.so"], tmp)  # fmt: skip
    (tmp / ".complete").touch()
    try:
        os.rename(tmp, root)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _site(tmp_path: Path, files: dict[str, Path], dists: dict[str, str] | None = None) -> Path:
    """A site-packages: one distribution holding `files` (rel path -> built file), and empty
    dist-infos for `dists` (name -> version), e.g. nvidia-nvjitlink."""
    site = tmp_path / "site"
    info = site / "shapes-1.0.dist-info"
    info.mkdir(parents=True)
    for rel, src in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, site / rel)
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in files))
    for name, version in (dists or {}).items():
        d = site / f"{name.replace('-', '_')}-{version}.dist-info"
        d.mkdir()
        (d / "RECORD").write_text("")
    return site


def _module(report: dict, gpu: str) -> dict:
    (row,) = [r for r in report["distributions"] if r["name"] == "shapes"]
    (m,) = row["gpus"][gpu]["modules"].values()
    return {**m, "dist": row["gpus"][gpu]["status"], "notes": row["gpus"][gpu]["notes"]}


def test_nvcc_writes_lto_ir_as_entry_kind_8(shapes: Path) -> None:
    """The raw header of the entry nvcc wrote for `code=lto_90`, read by hand: kind 8, sm 90."""
    data = (shapes / "lto_90.fatbin").read_bytes()
    magic, _v, hsize, _size = struct.unpack_from("<IHHQ", data)
    assert magic == 0xBA55ED50
    kind, _ev, _ehsize, _psize = struct.unpack_from("<HHIQ", data, hsize)
    sm = struct.unpack_from("<I", data, hsize + 28)[0]
    assert (kind, sm) == (8, 90)
    for name in ("lto_90.fatbin", "lto_90.so", "lto_90_jitlink.so"):
        code = read_file_code(shapes / name)
        assert [(e.kind, e.name) for e in code.entries] == [("lto", "sm_90")], (name, code)


def test_units_for_other_architectures_only_are_ok_with_a_note(tmp_path: Path, shapes: Path) -> None:
    code = read_file_code(shapes / "multi.so")
    units: dict[int, set[str]] = {}
    for e in code.entries:
        units.setdefault(e.container, set()).add(e.code.rsplit(":", 1)[0] if e.kind == "ptx" else e.code)
    assert sorted(map(sorted, units.values())) == [
        ["ptx:sm_120", "sass:sm_120", "sass:sm_90"],
        ["sass:sm_100a"],
        ["sass:sm_75"],  # nvcc -shared's device-link unit
    ]
    # that unit's cubin has no kernel (k and g are in the other two): no call needs it, not judged
    assert [e.kernels for e in code.entries if e.code == "sass:sm_75"] == [0]
    assert all(e.kernels > 0 for e in code.entries if e.kind == "sass" and e.sm != 75)
    site = _site(tmp_path, {"shapes/multi.so": shapes / "multi.so"})
    gpus = [Arch(9, 0), Arch(12, 0), Arch(12, 1), Arch(10, 0), Arch(10, 3)]
    report = census.census([site], gpus, driver="580.95.05", cache_root=tmp_path / "c", env={})
    for gpu in ("sm_90", "sm_120", "sm_121"):
        m = _module(report, gpu)
        assert (m["status"], m["dist"], m["units"], m["other_arch_units"]) == ("ok", "ok", 2, 1), (gpu, m)
        assert "1 of 2 translation units hold only other architectures' code (sm_100a)" in m["note"], m["note"]
        assert any("sm_100a" in n for n in m["notes"])
    on_100 = _module(report, "sm_100")
    assert (on_100["status"], on_100["missing_units"]) == ("partial", 1), on_100
    assert on_100["error"] == "no kernel image is available for execution on the device"
    assert _module(report, "sm_103")["status"] == "none"
    assert {(p["gpu"], p["status"]) for p in report["problems"]} == {("sm_100", "partial"), ("sm_103", "none")}


def _lto_census(tmp_path: Path, shapes: Path, name: str, dists: dict[str, str], where: str) -> dict:
    site = _site(tmp_path / where, {f"nvidia/cu13/lib/{name}": shapes / name}, dists)
    gpus = [Arch(9, 0), Arch(12, 0), Arch(8, 0)]
    return census.census([site], gpus, driver="580.95.05", cache_root=tmp_path / "c", env={})


def test_lto_ir_in_a_module_that_does_not_use_nvjitlink_cannot_run(tmp_path: Path, shapes: Path) -> None:
    report = _lto_census(tmp_path, shapes, "lto_90.so", {"nvidia-nvjitlink": "13.0.88"}, "plain")
    m = _module(report, "sm_90")
    assert (m["status"], m["error"]) == ("none", "no kernel image is available for execution on the device"), m
    assert "does not use nvJitLink" in m["why"]


def test_lto_ir_of_a_module_that_uses_nvjitlink_follows_the_nvjitlink_installed(tmp_path: Path, shapes: Path) -> None:
    name = "lto_90_jitlink.so"
    ok = _lto_census(tmp_path, shapes, name, {"nvidia-nvjitlink": "13.0.88"}, "with")
    for gpu in ("sm_90", "sm_120"):
        m = _module(ok, gpu)
        assert (m["status"], m["how"], m["dist"]) == ("ok", "lto", "lto"), m
        assert "nvJitLink of CUDA 13" in m["why"] and "13.0.88 is installed" in m["why"]
    assert _module(ok, "sm_80")["status"] == "none"  # compute_90 IR: nothing for 8.0
    none = _lto_census(tmp_path, shapes, name, {}, "without")
    m = _module(none, "sm_90")
    assert (m["status"], m["dist"]) == ("unknown", "unknown"), m
    assert "cannot tell" in m["why"] and "no nvidia-nvjitlink" in m["why"]
    assert not [p for p in none["problems"] if p["gpu"] == "sm_90"]
    old = _lto_census(tmp_path, shapes, name, {"nvidia-nvjitlink-cu12": "12.9.86"}, "old")
    m = _module(old, "sm_90")
    assert m["status"] == "none" and "12.9.86 cannot link it" in m["why"], m


def test_lto_ir_in_a_loose_fatbin_cannot_be_told(tmp_path: Path, shapes: Path) -> None:
    report = _lto_census(tmp_path, shapes, "lto_90.fatbin", {"nvidia-nvjitlink": "13.0.88"}, "loose")
    m = _module(report, "sm_90")
    assert m["status"] == "unknown" and "cannot tell from the headers who links it" in m["why"], m
