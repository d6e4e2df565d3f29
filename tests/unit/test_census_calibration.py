"""The census against what a real GPU did: tests/data/census/census-h200.json (see its README).

The lead ran one real operation per distribution of an image on an NVIDIA H200 (9.0, driver
580.159.04, torch 2.11.0+cu130; tools/census_calibrate.py) and recorded, per shared object, its
fatbin containers as read by that script's own walker (entry kind, SM, flags, version: not
elf.py), and nvcc-built shapes launched kernel by kernel. The oracle here is the GPU: for
every distribution whose op ran, the census's verdict for sm_90 from the recorded containers
must not say it fails; for every shape, a kernel's verdict must match whether it launched.

Run as a script it prints docs/census.md's calibration table (before / now / the GPU), which
a test checks is the one in the doc.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sm120patch.arch import Arch
from sm120patch.census.rules import Code, judge
from sm120patch.census.scan import OK_STATUSES
from sm120patch.census.verdicts import judge_site

DATA = Path(__file__).resolve().parents[1] / "data" / "census" / "census-h200.json"
DOC = Path(__file__).resolve().parents[2] / "docs" / "census.md"
RECORD: dict[str, Any] = json.loads(DATA.read_text())
H200 = Arch(9, 0)
DRIVER = RECORD["gpu"]["driver"]
KINDS = {1: "ptx", 2: "sass", 8: "lto"}  # the record's README: 1 PTX, 2 SASS, 8 LTO IR
DATA_SECTIONS = (".ldata", ".lrodata", ".rodata", ".data", ".data.rel.ro")


def entry_code(sig: str) -> str:
    """`k2:120:0x1208011:1.8` -> `sass:sm_120f`, by the record's README: 0x200000 `f`, 0x100000
    `a`; a PTX entry's major.minor is its ISA."""
    kind, sm, flags, version = sig[1:].split(":")
    f = int(flags, 16)
    suffix = "f" if f & 0x200000 else "a" if f & 0x100000 else ""
    name = KINDS.get(int(kind), f"kind{kind}")
    return f"{name}:sm_{sm}{suffix}" + (f":{version}" if name == "ptx" else "")


def _is_cudart_stub(entries: list[str]) -> bool:
    """A container of one uncompressed k2:75 entry: the one `nvcc -shared` adds to every .so (the
    record's README), which holds no kernel (the census reads that on the real libcufftw:
    test_census_wheels.py)."""
    if len(entries) != 1:
        return False
    kind, sm, flags, _ = entries[0][1:].split(":")
    return (kind, sm) == ("2", "75") and not int(flags, 16) & 0xA000


def scan_of(dist: str) -> dict[str, Any]:
    """The recorded containers of `dist` in the form census/scan.py hands to verdicts.py."""
    rec = RECORD["distributions"][dist]
    modules = []
    for rel, f in sorted(rec["files"].items()):
        groups: dict[tuple[str, ...], int] = {}
        for sig, n in (f.get("containers") or {}).items():
            entries = sig.split()
            if _is_cudart_stub(entries):
                continue
            key = tuple(sorted({entry_code(e) for e in entries}))
            groups[key] = groups.get(key, 0) + n
        other = [s for s in (f.get("fatbins_in_other_sections") or {}) if s in DATA_SECTIONS]
        # fatbins the census does not read, in a data section: what its "cannot tell" stands for
        data = f"{other[0]} (recorded)" if other and not any("sass:sm_90" in k for k in groups) else ""
        if groups:
            modules.append(
                {"path": rel, "groups": [[list(k), n] for k, n in sorted(groups.items())], "data": data,
                 "error": "", "note": "", "skipped": "", "nvjitlink": None}
            )  # fmt: skip
    return {"distributions": [{"name": dist, "version": rec["version"], "modules": modules}] if modules else []}


def census_now(dist: str, gpu: Arch = H200) -> str:
    rows = judge_site(scan_of(dist), [gpu], DRIVER)
    return rows[0]["gpus"][gpu.name]["status"] if rows else "-"


def exercised() -> Iterator[tuple[str, dict[str, Any]]]:
    for dist, rec in sorted(RECORD["distributions"].items()):
        if rec.get("result") is not None:
            yield dist, rec


@pytest.mark.parametrize("dist", [d for d, _ in exercised()])
def test_the_census_agrees_with_what_the_h200_ran(dist: str) -> None:
    rec = RECORD["distributions"][dist]
    now = census_now(dist)
    if rec["result"]["ran"]:
        assert now in (*OK_STATUSES, "-"), f"{dist} ran {rec['op']!r} on the H200; the census says {now}"
    else:
        assert now not in OK_STATUSES, f"{dist} failed on the H200 ({rec['result']}); the census says {now}"


def test_the_old_false_alarms_are_gone() -> None:
    """Six of the image's distributions were called broken on the GPU they ran on (issue 30)."""
    before = RECORD["census_said"]["by_dist"]
    alarms = sorted(d for d, g in before.items() if g["sm_90"]["status"] not in ("ok", "jit"))
    assert alarms == [
        "nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-cufft", "nvidia-cusparse", "nvidia-cusparselt-cu13",
        "nvidia-nccl-cu13",
    ]  # fmt: skip
    assert all(RECORD["distributions"][d]["result"]["ran"] for d in alarms)
    assert {d: census_now(d) for d in alarms} == {
        "nvidia-cublas": "ok", "nvidia-cudnn-cu13": "ok", "nvidia-cufft": "unknown", "nvidia-cusparse": "ok",
        "nvidia-cusparselt-cu13": "ok", "nvidia-nccl-cu13": "ok",
    }  # fmt: skip


@pytest.mark.parametrize("gpu", [Arch(12, 0), Arch(12, 1)])
def test_nvidias_cuda_13_libraries_are_not_called_broken_on_sm12x(gpu: Arch) -> None:
    """No SM12x GPU ran here; the oracle is NVIDIA's support matrix: the CUDA 13.0 libraries
    support compute capability 7.5 to 12.1 (CUDA 13.0 release notes). Before, the census said
    partial (cuBLAS, cuDNN, cuSPARSE, cuSPARSELt, NCCL) and NO (cuFFT) on both."""
    for dist in RECORD["distributions"]:
        if dist.startswith("nvidia-") and RECORD["distributions"][dist].get("result"):
            assert census_now(dist, gpu) in (*OK_STATUSES, "-"), (dist, gpu.name)


def _gencode_codes(gencode: str) -> list[Code]:
    """`arch=compute_90,code=sm_90` -> the image nvcc was asked for (sm_ SASS, compute_ PTX, lto_ LTO IR)."""
    code = gencode.split("code=")[1]
    kind = {"sm": "sass", "compute": "ptx", "lto": "lto"}[code.split("_")[0]]
    digits = code.split("_")[1]
    return [Code(kind, int(digits.rstrip("af")), digits[-1] if digits[-1] in "af" else "")]


@pytest.mark.parametrize("shape", RECORD["shapes"], ids=[s["shape"][:40] for s in RECORD["shapes"]])
def test_each_kernel_launch_is_what_the_rules_say(shape: dict[str, Any]) -> None:
    """The launched kernel's translation unit, from its -gencode list, judged for 9.0 (the .so
    files do not use nvJitLink): its verdict is whether it launched."""
    unit = dict(shape["units"])[shape["launched"]]
    codes = [c for g in unit for c in _gencode_codes(g)]
    v = judge(codes, H200, DRIVER, (None, "", False))
    assert v.ok is shape["ran"], (shape["shape"], v, shape.get("said"))
    if not shape["ran"]:
        assert v.error == shape["said"]


def table() -> str:
    """docs/census.md's calibration table, from the record."""
    before = RECORD["census_said"]["by_dist"]
    show = {"ok": "ok", "jit": "ok (JIT)", "lto": "ok (LTO)", "unknown": "? (cannot tell)", "partial": "partial",
            "some": "SOME", "none": "NO", "-": "- (no CUDA code)"}  # fmt: skip
    lines = ["| distribution | version | op run on the H200 | ran | census before (sm_90) | census now (sm_90) |"]
    lines.append("|---|---|---|---|---|---|")
    for dist, rec in exercised():
        was = before.get(dist, {}).get("sm_90", {}).get("status", "-")
        ran = "yes" if rec["result"]["ran"] else f"no ({rec['result'].get('error', '')})"
        op = rec["op"].replace("|", "\\|")
        lines.append(f"| {dist} | {rec['version']} | {op} | {ran} | {show[was]} | {show[census_now(dist)]} |")
    return "\n".join(lines)


def test_docs_census_md_holds_this_table() -> None:
    assert table() in DOC.read_text(), "regenerate: python -m tests.unit.test_census_calibration"


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
