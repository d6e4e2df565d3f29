"""The census on fatbins that nvcc builds here, one per loader rule.

The oracle is what nvcc was asked to build (the -gencode of each file) and the CUDA
documentation's rules, written out below as a table by hand (census/rules.py cites the
sections): sm_120 SASS runs on 12.0 and 12.1; sm_120a only on 12.0; sm_120f on 12.0 and
12.1; sm_121a only on 12.1; compute_120 PTX JIT-compiles on 12.x and later, not on 10.0;
compute_120a PTX only on 12.0. Files are built once per session, tiny kernels, and kept
in the cache keyed by nvcc's version and the flags so a re-run builds nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sm120patch import census
from sm120patch.arch import Arch
from sm120patch.census import ptxas as census_ptxas
from sm120patch.census import render as census_render
from sm120patch.census import scan
from sm120patch.probes.environment.elf import read_file_code
from tests.conftest import needs_tool, requires

KERNEL = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }\n'
# file -> nvcc flags; "cubin" files are loose cubins (nvcc --cubin), the rest host .so files
BUILDS: dict[str, list[str]] = {
    "sm_120.so": ["-gencode", "arch=compute_120,code=sm_120"],
    "sm_120a.so": ["-gencode", "arch=compute_120a,code=sm_120a"],
    "sm_120f.so": ["-gencode", "arch=compute_120f,code=sm_120f"],
    "sm_121a.so": ["-gencode", "arch=compute_121a,code=sm_121a"],
    "compute_120.so": ["-gencode", "arch=compute_120,code=compute_120"],
    "compute_120a.so": ["-gencode", "arch=compute_120a,code=compute_120a"],
    "mixed.so": [
        "-gencode", "arch=compute_90,code=sm_90",
        "-gencode", "arch=compute_120a,code=sm_120a",
        "-gencode", "arch=compute_90,code=compute_90",
    ],
    "compressed.so": ["-gencode", "arch=compute_120,code=sm_120", "-Xfatbin", "-compress-all"],
    "k_120a.cubin": ["-gencode", "arch=compute_120a,code=sm_120a"],
}  # fmt: skip

# The documented rules, by hand: file -> GPU -> "sass" (a cubin loads), "jit" (PTX), None (no image)
EXPECTED: dict[str, dict[str, str | None]] = {
    "sm_120.so": {"sm_90": None, "sm_100": None, "sm_120": "sass", "sm_121": "sass"},
    "sm_120a.so": {"sm_90": None, "sm_100": None, "sm_120": "sass", "sm_121": None},
    "sm_120f.so": {"sm_90": None, "sm_100": None, "sm_120": "sass", "sm_121": "sass"},
    "sm_121a.so": {"sm_90": None, "sm_100": None, "sm_120": None, "sm_121": "sass"},
    "compute_120.so": {"sm_90": None, "sm_100": None, "sm_120": "jit", "sm_121": "jit"},
    "compute_120a.so": {"sm_90": None, "sm_100": None, "sm_120": "jit", "sm_121": None},
    "mixed.so": {"sm_90": "sass", "sm_100": "jit", "sm_120": "sass", "sm_121": "jit"},
    "compressed.so": {"sm_90": None, "sm_100": None, "sm_120": "sass", "sm_121": "sass"},
    "k_120a.cubin": {"sm_90": None, "sm_100": None, "sm_120": "sass", "sm_121": None},
}
GPUS = [Arch(9, 0), Arch(10, 0), Arch(12, 0), Arch(12, 1)]
# PTX ISA of each nvcc release (PTX ISA manual, release notes table)
PTX_ISA_OF_NVCC = {"12.8": "8.7", "12.9": "8.8", "13.0": "9.0", "13.1": "9.1"}


def _nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    return out.split("release ")[1].split(",")[0] if "release " in out else "?"


@pytest.fixture(scope="session")
def built() -> Path:
    return build_fatbins()


def build_fatbins() -> Path:
    """The files of BUILDS, built once (kept in the cache, keyed by nvcc's version and the flags)."""
    nvcc = needs_tool(
        "nvcc", "the census fixtures are built with nvcc (CI's machines have it: tests/conftest.py CI_TOOLS)"
    )
    version = _nvcc_version(nvcc)
    key = hashlib.sha256(json.dumps([version, KERNEL, BUILDS]).encode()).hexdigest()[:16]
    root = Path(os.environ.get("SM120PATCH_CACHE", Path.home() / ".cache" / "sm120patch")) / "census-nvcc" / key
    if (root / ".complete").exists():
        return root
    tmp = root.with_name(root.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "k.cu").write_text(KERNEL)

    def build(name: str) -> None:
        mode = ["--cubin"] if name.endswith(".cubin") else ["-shared", "-Xcompiler", "-fPIC"]
        cmd = [nvcc, *mode, "-o", name, "k.cu", *BUILDS[name]]
        r = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{' '.join(cmd)}: {r.stderr[-500:]}"

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(build, BUILDS))
    (tmp / "nvcc-version").write_text(version)
    (tmp / ".complete").touch()
    try:
        os.rename(tmp, root)
    except OSError:  # another run got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _site(tmp_path: Path, built: Path) -> Path:
    """A site-packages with one distribution per built file, each listed in its RECORD."""
    site = tmp_path / "site"
    for name in BUILDS:
        dist = "tiny_" + name.replace(".", "_")
        pkg = site / dist
        pkg.mkdir(parents=True)
        os.link(built / name, pkg / name)
        info = site / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "RECORD").write_text(f"{dist}/{name},,\n{dist}-1.0.dist-info/RECORD,,\n")
    return site


def test_entries_are_what_nvcc_was_asked_for(built: Path) -> None:
    isa = PTX_ISA_OF_NVCC.get((built / "nvcc-version").read_text())
    codes = {name: read_file_code(built / name) for name in BUILDS}
    assert all(not c.error for c in codes.values())
    names = {n: sorted({(e.kind, e.name) for e in c.entries}) for n, c in codes.items()}
    assert names["sm_120.so"] == [("sass", "sm_120")]
    assert names["sm_120a.so"] == [("sass", "sm_120a")]
    assert names["sm_120f.so"] == [("sass", "sm_120f")]
    assert names["sm_121a.so"] == [("sass", "sm_121a")]
    assert names["compute_120.so"] == [("ptx", "sm_120")]
    assert names["compute_120a.so"] == [("ptx", "sm_120a")]
    assert names["mixed.so"] == [("ptx", "sm_90"), ("sass", "sm_120a"), ("sass", "sm_90")]
    assert names["k_120a.cubin"] == [("sass", "sm_120a")]
    assert codes["k_120a.cubin"].kind == "cubin"
    # -Xfatbin -compress-all compresses the SASS; the headers still say what it is
    assert all(e.compressed for e in codes["compressed.so"].entries)
    assert not any(e.compressed for e in codes["sm_120.so"].entries)
    if isa:
        assert {e.isa for e in codes["compute_120.so"].entries} == {isa}


def test_census_verdicts_follow_the_documented_rules(tmp_path: Path, built: Path) -> None:
    site = _site(tmp_path, built)
    report = census.census([site], GPUS, cache_root=tmp_path / "cache", env={})
    by_file = {r["modules"][0].split("/")[-1]: r for r in report["distributions"]}
    assert set(by_file) == set(BUILDS)
    for name, want in EXPECTED.items():
        for gpu, how in want.items():
            g = by_file[name]["gpus"][gpu]
            m = next(iter(g["modules"].values()))
            got = m["how"] if m["status"] != "none" else None
            assert got == how, f"{name} on {gpu}: {got} ({m['why']}), the docs say {how}"
            if how is None:
                assert g["you_will_see"] == ["CUDA error: no kernel image is available for execution on the device"]
                assert g["fix"]


def test_ptx_newer_than_the_driver_does_not_count(tmp_path: Path, built: Path) -> None:
    isa = PTX_ISA_OF_NVCC.get((built / "nvcc-version").read_text())
    requires(isa == "9.0", "the driver cut-off below is written for nvcc 13.0's PTX ISA 9.0")
    site = _site(tmp_path, built)
    # 575.x ships CUDA 12.9 (PTX ISA 8.8), 580.x CUDA 13.0 (ISA 9.0): CUDA Toolkit release notes
    old = census.census([site], [Arch(12, 1)], driver="575.51.03", cache_root=tmp_path / "c", env={})
    new = census.census([site], [Arch(12, 1)], driver="580.95.05", cache_root=tmp_path / "c", env={})
    pick = {r["modules"][0].split("/")[-1]: r["gpus"]["sm_121"] for r in old["distributions"]}
    assert pick["compute_120.so"]["status"] == "none"
    assert pick["compute_120.so"]["you_will_see"] == [
        "CUDA error: the provided PTX was compiled with an unsupported toolchain."
    ]
    pick = {r["modules"][0].split("/")[-1]: r["gpus"]["sm_121"] for r in new["distributions"]}
    assert pick["compute_120.so"]["status"] == "jit"


def test_warm_census_reads_nothing_and_rereads_what_changed(tmp_path: Path, built: Path) -> None:
    site = _site(tmp_path, built)
    cache = tmp_path / "cache"
    cold = census.census([site], GPUS, cache_root=cache, env={})
    warm = census.census([site], GPUS, cache_root=cache, env={})
    assert (cold["files_read"], cold["files_cached"]) == (len(BUILDS), 0)
    assert (warm["files_read"], warm["files_cached"]) == (0, len(BUILDS))
    assert warm["distributions"] == cold["distributions"]
    # a rebuilt extension (new inode, other bytes) is read again, and its new answer shows
    target = next(site.glob("tiny_sm_120a_so/sm_120a.so"))
    target.unlink()
    shutil.copy(built / "sm_121a.so", target)
    again = census.census([site], GPUS, cache_root=cache, env={})
    assert (again["files_read"], again["files_cached"]) == (1, len(BUILDS) - 1)
    row = next(r for r in again["distributions"] if r["name"] == "tiny-sm-120a-so")
    assert row["sass"] == ["sm_121a"]


def test_reads_headers_only(tmp_path: Path, built: Path) -> None:
    """A 600 MB extension costs a few kilobytes: the fatbin payload is skipped, not read.
    (Counted by the kernel: /proc/self/io's rchar, bytes this process read.)"""
    requires(Path("/proc/self/io").exists(), "/proc/self/io (Linux) counts the bytes read")
    import struct

    from tests.unit.fi_fakes import host_so

    big = 600 << 20
    header = struct.pack("<HHIQIIHHIIIQ", 2, 0x101, 64, big, 0, 0, 8, 1, 120, 0, 0, 0x11).ljust(64, b"\0")
    fat = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 64 + big) + header
    so = host_so(fat + b"\0" * 16)  # the section claims 600 MB more than this: grow the file sparsely
    path = tmp_path / "big.so"
    with open(path, "wb") as f:
        f.write(so)
    # put the section table past a 600 MB hole, so the payload really is in the file
    data = bytearray(so)
    shoff = struct.unpack_from("<Q", data, 40)[0]
    table = data[shoff:]
    new_shoff = shoff + big
    struct.pack_into("<Q", data, 40, new_shoff)
    size_off = 64 * 2 + 32  # the third section header's sh_size
    struct.pack_into("<Q", table, size_off, len(fat) + big + 16)
    with open(path, "wb") as f:
        f.write(data[:shoff])
        f.seek(new_shoff)
        f.write(table)
    assert path.stat().st_size > big

    def rchar() -> int:
        lines = Path("/proc/self/io").read_text().splitlines()
        return int(next(ln for ln in lines if ln.startswith("rchar")).split()[1])

    before = rchar()
    code = read_file_code(path)
    spent = rchar() - before
    assert [e.name for e in code.entries] == ["sm_120"], code
    assert spent < 1 << 20, f"read {spent} bytes of a {path.stat().st_size}-byte file"


def test_progress_only_after_two_seconds() -> None:
    now = [0.0]
    out = io.StringIO()
    p = scan._Progress(10, out, clock=lambda: now[0])
    p.tick(1, "torch")
    now[0] = 1.9
    p.tick(2, "torch")
    assert out.getvalue() == ""
    now[0] = 2.5
    p.tick(3, "torch")
    p.finish(3)
    assert out.getvalue().splitlines() == ["census: 3/10 files checked (torch)", "census: done, 3 files read in 2.5 s"]


def test_triton_ptxas_is_found_and_asked_its_version(tmp_path: Path) -> None:
    """The real ptxas next to nvcc, placed where Triton bundles its own; then TRITON_PTXAS_PATH wins."""
    nvcc = needs_tool("nvcc", "the real ptxas next to nvcc is what Triton's lookup is checked against")
    real = next((p for p in (shutil.which("ptxas"), "/usr/local/cuda/bin/ptxas") if p and Path(p).exists()), None)
    requires(real is not None, "no ptxas next to nvcc")
    version = _nvcc_version(nvcc)
    site = tmp_path / "site"
    bundled = site / "triton" / "backends" / "nvidia" / "bin" / "ptxas"
    bundled.parent.mkdir(parents=True)
    bundled.symlink_to(Path(str(real)).resolve())
    info = census_ptxas.triton_ptxas([site], env={})
    assert info is not None and (info["source"], info["cuda"]) == ("bundled with triton", version)
    targets = census_ptxas.ptxas_targets(info, [Arch(12, 0), Arch(12, 1)])
    # sm_120a needs CUDA >= 12.8, sm_121a CUDA >= 12.9 (CUDA release notes; device.min_cuda_for)
    want = tuple(int(x) for x in version.split("."))
    assert targets["sm_120"]["ok"] is (want >= (12, 8))
    assert targets["sm_121"]["ok"] is (want >= (12, 9))
    other = tmp_path / "ptxas"
    other.symlink_to(Path(str(real)).resolve())
    info = census_ptxas.triton_ptxas([site], env={"TRITON_PTXAS_PATH": str(other)})
    assert info is not None and (info["source"], info["path"]) == ("TRITON_PTXAS_PATH", str(other))
    assert census_ptxas.triton_ptxas([tmp_path / "empty"], env={}) is None


def test_bad_files_and_a_bad_cache_are_reported_not_raised(tmp_path: Path, built: Path) -> None:
    site = _site(tmp_path, built)
    broken = site / "tiny_sm_120_so" / "sm_120.so"
    data = broken.read_bytes()
    broken.unlink()
    broken.write_bytes(data[:4096])  # truncated: the section table is gone
    info = site / "gone-1.0.dist-info"
    info.mkdir()
    (info / "RECORD").write_text("gone/missing.so,,\n")  # listed, not there
    (site / "norecord-1.0.dist-info").mkdir()
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("x.json",):
        (cache / name).write_text("{not json")
    r = census.census([site], GPUS, cache_root=cache, env={})
    row = next(x for x in r["distributions"] if x["name"] == "tiny-sm-120-so")
    assert row["unreadable"] and "out of bounds" in row["unreadable"][0]["error"]
    assert any("norecord-1.0.dist-info: no RECORD" in n for n in r["notes"])
    assert not any(x["name"] == "gone" for x in r["distributions"])
    text = "\n".join(census_render.render_lines(r))
    assert "tiny_sm_120_so/sm_120.so could not be read" in text
    # a cache file of the wrong shape is re-read, not trusted
    for f in cache.glob("*.json"):
        f.write_text(json.dumps({"schema": scan.SCHEMA, "site": str(site), "files": {"x": 1}, "records": {"y": 2}}))
    again = census.census([site], GPUS, cache_root=cache, env={})
    assert again["files_read"] == r["files_read"] and again["distributions"] == r["distributions"]
