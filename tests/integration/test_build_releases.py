"""The build rung on real FlashInfer releases, for SM120, on a machine with no SM120 GPU.

FlashInfer 0.6.16 with only `supported_major_versions` widened by hand (what a by-hand edit
of jit/comm.py does) builds trtllm_comm for sm_120f, but its Lamport all-reduce kernels come
out with empty bodies and its launchers keep the unclamped cluster of 8: the probe must fail
and name both. FlashInfer 0.6.17 (PR 3903) must pass. nvcc compiles device code only, so
this runs wherever CUDA >= 12.9 is installed; the cubins are cached (by command, nvcc and the
sha256 of every header read) under the shared test cache, so a warm run reads hashes only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sm120patch.arch import parse_arch
from sm120patch.probes.environment.device import can_build_for, find_cuda
from tests.conftest import fetch_or_skip
from tests.integration.fi_releases import spec_venv, unpacked
from tools.releases import cache_dir

# `long`: minutes of nvcc; make test starts this file first so it overlaps the rest (tests/conftest.py)
pytestmark = [pytest.mark.releases, pytest.mark.long]

NVCC_OK, NVCC_WHY = can_build_for(find_cuda(), parse_arch("sm_120"), family=True)
needs_nvcc = pytest.mark.skipif(not NVCC_OK, reason=f"the build rung needs an nvcc for sm_120f: {NVCC_WHY}")
CLI = [sys.executable, "-m", "sm120patch"]


def widened_by_hand(version: str, dest: Path) -> Path:
    """A copy of FlashInfer `version` with jit/comm.py's gate widened to [9, 10, 12], and
    nothing else changed: the edit a user makes by hand."""
    src = unpacked("flashinfer-python", version) / "flashinfer"
    pkg = dest / "flashinfer"
    shutil.copytree(src, pkg, copy_function=os.link)  # hard links: never write one in place
    comm = pkg / "jit" / "comm.py"
    head, sep, tail = comm.read_text().partition("def gen_trtllm_comm_module(")
    assert sep and "supported_major_versions=[9, 10]" in tail.split("\ndef ")[0], "the gate moved: update this test"
    comm.unlink()
    tail = tail.replace("supported_major_versions=[9, 10]", "supported_major_versions=[9, 10, 12]", 1)
    comm.write_text(head + sep + tail)
    return dest


def XDG_PROBES() -> Path:  # noqa: N802
    return cache_dir() / "xdg" / "sm120patch" / "probes"


def probe_build(tree: Path) -> tuple[int, dict]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_dir() / "xdg")}  # shared, so CI reruns are warm
    args = ["probe", "flashinfer:trtllm_comm", "--arch", "sm_120", "--probe-level", "build"]
    args += ["--flashinfer", str(tree), "--python", str(spec_venv()), "--json"]
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=3 * 3600, env=env)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


@needs_nvcc
def test_flashinfer_0_6_16_widened_by_hand_fails_on_empty_bodies_and_the_cluster(tmp_path: Path) -> None:
    code, out = probe_build(widened_by_hand("0.6.16", tmp_path / "fi"))
    assert code == 1
    (v,) = out["verdicts"]
    assert (v["result"], v["rung"], v["asked"]) == ("fail", "build", "build"), v["reason"]
    reason = v["reason"]
    assert "480 of 480 lamport_style_one_shot_all_reduce_norm_kernel instantiations have an empty body" in reason
    assert "cluster of 8" in reason and "PR 3903" in reason
    assert [s["rung"] for s in v["steps"]] == ["static", "artifact", "spec", "build"]
    build = v["evidence"]["build"]
    assert build["sms"] == [120] and build["empty_size"] > 0
    assert {"family": "lamport_style_one_shot_all_reduce_norm_kernel", "empty": 480, "of": 480} in build["empty"]


@needs_nvcc
def test_flashinfer_0_6_17_passes_the_build_rung(tmp_path: Path) -> None:
    code, out = probe_build(unpacked("flashinfer-python", "0.6.17"))
    (v,) = out["verdicts"]
    assert (v["result"], v["rung"], v["asked"]) == ("pass", "build", "build"), v["reason"]
    assert code == 0
    assert "none with an empty body" in v["reason"] and v["evidence"]["build"]["empty"] == []
    assert v["evidence"]["build"]["kernels"] > 900


@needs_nvcc
def test_a_warm_build_verdict_on_a_real_release_starts_neither_flashinfer_nor_nvcc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once built (here or by the test above, in the shared cache), the build rung answers from hashes:
    FlashInfer's compile commands from the answer cache, every cubin from the cubin cache."""
    from sm120patch.catalogue.kernels import get_kernel
    from sm120patch.probes import build, spec
    from sm120patch.probes.environment.flashinfer import from_tree

    tree = widened_by_hand("0.6.16", tmp_path / "fi")
    code, out = probe_build(tree)
    assert code == 1 and out["verdicts"][0]["rung"] == "build"

    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("a warm build rung started the interpreter or nvcc")

    monkeypatch.setattr(spec, "run_script", refuse)
    monkeypatch.setattr(build, "_run_nvcc", refuse)
    fi = from_tree(tree, python=str(spec_venv()))
    step = build.check_build(get_kernel("flashinfer:trtllm_comm"), parse_arch("sm_120"), fi, XDG_PROBES())
    assert step.result == "fail" and "all from cache" in step.reason
    assert "480 of 480 lamport_style_one_shot_all_reduce_norm_kernel" in step.reason


def backported(version: str, dest: Path) -> Path:
    """A copy of FlashInfer `version` with the flashinfer-trtllm-comm-sm120 recipe applied (as a user
    would: `sm120patch apply`), its probe skipped so the build rung below is what judges it."""
    tree = fetch_or_skip("flashinfer", version, dest)
    r = subprocess.run(
        [*CLI, "apply", str(tree), "--arch", "sm_120", "--probe", "none", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    statuses = {x["id"]: x["status"] for x in json.loads(r.stdout)["recipes"]}
    assert statuses == {"flashinfer-trtllm-comm-sm120": "applied"}, r.stderr
    return tree


def rewrite(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text()
    assert text.count(old) >= count, f"{old!r} not in {path}"
    path.unlink()  # a file the cache shares by hard link is never written in place
    path.write_text(text.replace(old, new, count))


@needs_nvcc
def test_the_backport_on_0_6_16_passes_the_build_rung(tmp_path: Path) -> None:
    code, out = probe_build(backported("0.6.16", tmp_path / "fi"))
    (v,) = out["verdicts"]
    assert (v["result"], v["rung"]) == ("pass", "build"), v["reason"]
    assert code == 0 and v["evidence"]["build"]["empty"] == []
    assert "5 source check(s) hold" in v["steps"][0]["reason"]


@needs_nvcc
def test_a_backport_that_leaves_one_guard_behind_fails(tmp_path: Path) -> None:
    """One of the 13 `< 1200` clauses back, on the Lamport kernel's body: the build rung sees empty
    bodies in the cubin, the static rung the guard in the source."""
    tree = backported("0.6.16", tmp_path / "fi")
    header = tree / "flashinfer/data/include/flashinfer/comm/trtllm_allreduce.cuh"
    body = "lamport_style_one_shot_all_reduce_norm_kernel(AllReduceParams<T> params) {\n"
    rewrite(
        header,
        body + "#if (defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900))",
        body + "#if (defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && (__CUDA_ARCH__ < 1200))",
    )
    code, out = probe_build(tree)
    (v,) = out["verdicts"]
    assert code == 1 and (v["result"], v["rung"]) == ("fail", "build"), v["reason"]
    assert "lamport_style_one_shot_all_reduce_norm_kernel instantiations have an empty body" in v["reason"]
    assert "__CUDA_ARCH__ < 1200" in v["reason"]


def test_a_backport_that_leaves_the_cluster_of_8_behind_fails(tmp_path: Path) -> None:
    """The fusion launcher SGLang calls, as 0.6.16 ships it (a fixed cluster of 8), in an otherwise
    backported tree: the static rung's source check fails it, no compiler needed."""
    tree = backported("0.6.16", tmp_path / "fi")
    rel = "flashinfer/data/include/flashinfer/comm/trtllm_allreduce_fusion.cuh"
    (tree / rel).unlink()
    (tree / rel).write_bytes((unpacked("flashinfer-python", "0.6.16") / rel).read_bytes())
    args = ["probe", "flashinfer:trtllm_comm", "--arch", "sm_120", "--probe-level", "static", "--flashinfer", str(tree)]
    r = subprocess.run([*CLI, *args, "--json"], capture_output=True, text=True, timeout=120)
    (v,) = json.loads(r.stdout)["verdicts"]
    assert r.returncode == 1 and v["result"] == "fail"
    assert "trtllm_allreduce_fusion.cuh" in v["reason"] and "cluster of 8" in v["reason"]


# --- the fused-MoE run check's reduced module, selected from real releases' own specs ---------------

REDUCE = r"""
import dataclasses, importlib.util, json, os, shlex, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("moe_reduced", sys.argv[1])
reduced = importlib.util.module_from_spec(spec); spec.loader.exec_module(reduced)
import flashinfer.jit.fused_moe as jit
full = jit.gen_cutlass_fused_moe_sm90_module()
chosen = reduced.plan(list(full.sources), Path(sys.argv[2]))
small = dataclasses.replace(full, name="fused_moe_90_sm120patch_bf16", sources=chosen["sources"])
def flags(s):
    return {Path(c["file"]).name: shlex.split(c["command"]) for c in s.get_compile_commands()}
chosen["sources"] = [str(p) for p in chosen["sources"]]
print(json.dumps({"full": [str(p) for p in full.sources], "chosen": chosen,
                  "full_flags": flags(full), "small_flags": flags(small)}))
"""
TMA_BF16 = re.compile(
    r"INSTANTIATE_TMA_WARP_SPECIALIZED_MOE_GEMM\(\s*Sm90,\s*__nv_bfloat16,\s*__nv_bfloat16,\s*__nv_bfloat16,"
)
SM80_BF16 = re.compile(
    r"template void sm80_generic_fused_moe_gemm_kernelLauncher<\s*cutlass::bfloat16_t,\s*cutlass::bfloat16_t,"
)
ANY_INSTANCE = re.compile(r"INSTANTIATE_TMA_WARP_SPECIALIZED_MOE_GEMM\(|template void \w+<")


def reduced_plan(version: str, tmp_path: Path) -> dict:
    """FlashInfer `version`'s own SM90 fused-MoE spec, and the reduced one the run check builds from it
    (in a private copy: 0.6.1 generates its CUTLASS sources into the package)."""
    tree = tmp_path / "fi"
    shutil.copytree(unpacked("flashinfer-python", version) / "flashinfer", tree / "flashinfer", copy_function=os.link)
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "FLASHINFER_CUDA_ARCH_LIST": "9.0a",
        "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws"),
        "CUDA_HOME": find_cuda().home or "/usr/local/cuda",
    }
    checks = Path(__file__).resolve().parents[2] / "sm120patch" / "probes" / "run" / "checks" / "moe_reduced.py"
    r = subprocess.run(
        [str(spec_venv()), "-c", REDUCE, str(checks), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@needs_nvcc
@pytest.mark.parametrize(("version", "units"), [("0.6.1", 181), ("0.7.4", 248)])
def test_the_reduced_fused_moe_module_keeps_every_bf16_instantiation_and_nothing_else(
    version: str, units: int, tmp_path: Path
) -> None:
    p = reduced_plan(version, tmp_path)
    full, chosen = [Path(s) for s in p["full"]], p["chosen"]
    assert len(full) == units
    names = {Path(s).name for s in chosen["sources"]}
    assert len(chosen["sources"]) <= 31 and len(chosen["dropped"]) == units - len(chosen["sources"])
    # the bf16 runners stay, every other dtype's runner and the FP8 block-scale GEMM go
    assert {"moe_gemm_kernels_bf16_bf16.cu", "flashinfer_cutlass_fused_moe_binding.cu"} <= names
    assert {"moe_gemm_kernels_fp8_fp8.cu", "moe_gemm_kernels_fp16_fp16.cu", "fp8_blockscale_gemm.cu"} <= set(
        chosen["dropped"]
    )
    # counted here from FlashInfer's own generated files, not by the code under test
    generated = [f for f in full if f.name.endswith(".generated.cu")]
    want = sum(len(TMA_BF16.findall(f.read_text())) + len(SM80_BF16.findall(f.read_text())) for f in generated)
    copies = [Path(s) for s in chosen["sources"] if s.endswith(".generated.cu")]
    got = [f.read_text() for f in copies]
    assert want == 102 and sum(len(TMA_BF16.findall(t)) + len(SM80_BF16.findall(t)) for t in got) == want
    assert sum(len(ANY_INSTANCE.findall(t)) for t in got) == want  # nothing but bf16 in the copies
    runner = next(Path(s) for s in chosen["sources"] if s.endswith("cutlass_fused_moe_instantiation.cu"))
    kept = re.findall(r"^\s*template class CutlassMoeFCRunner<([^;]*)>;", runner.read_text(), re.M)
    assert kept == ["__nv_bfloat16, __nv_bfloat16"]
    # every unit is compiled with the flags FlashInfer itself gives it (output path aside)
    for name, argv in p["small_flags"].items():
        theirs = p["full_flags"][name]
        assert [a for a in argv if not a.endswith((".o", ".cu", ".cpp"))] == [
            a for a in theirs if not a.endswith((".o", ".cu", ".cpp"))
        ], name
