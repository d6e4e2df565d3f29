"""What the probe ladder's costly rungs cost, against what they stand in for, in the same run.

  spec rung   `probe <every kernel> --arch sm_120 --probe spec` with a cold answer cache, against one
              bare `python -c "import flashinfer"` under the same interpreter (the issue's goal: the
              catalogue's spec probe costs about one import, not one per check); warm: the same with
              the verdicts dropped but the answers kept
  build rung  warm: `probe flashinfer:trtllm_comm --arch sm_120 --probe-level build` with every cubin
              and the compile commands cached, the verdict dropped (seconds; the goal is under 1 s);
              cold (`--cold-build`, many minutes on a small box): the same with empty caches, against
              FlashInfer's own JIT build of the same module for the same arch (`JitSpec.build()`),
              as a ratio of the two in one run

FlashInfer comes from the shared release cache: 0.6.1 for the spec rung (the spec venv's own),
0.6.17 for the cold build rung (its trtllm_comm builds for sm_120), 0.6.16 with its gate widened by
hand for the warm one (the build-rung tests leave its cubins in their shared cache); the interpreter is the tests' spec
venv (CPU torch). Needs nvcc for sm_120f for the build rung; it is skipped, saying so, without one.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.measure import CLI, env_with, run, summary
from sm120patch.arch import parse_arch
from sm120patch.catalogue.kernels import load_kernels
from sm120patch.probes.environment.device import can_build_for, find_cuda
from tests.integration.fi_releases import spec_venv
from tests.integration.test_build_releases import widened_by_hand
from tools.releases import cache_dir, pristine

BUILD_FI = "0.6.17"
SPEC_FI = "0.6.1"


def _drop_verdicts(cache: Path) -> None:
    """The verdict cache's entries (probes/*.json) only: answers/ and builds/ stay."""
    for f in (cache / "sm120patch" / "probes").glob("*.json"):
        f.unlink()


def _libcuda_stub(work: Path) -> Path | None:
    """A folder with an empty libcuda.so where neither the system nor the toolkit's stubs have one."""
    home = Path(find_cuda().home or "/usr/local/cuda")
    if (home / "lib64" / "stubs" / "libcuda.so").exists() or "libcuda.so" in run_text(["ldconfig", "-p"]):
        return None
    folder = work / "libcuda-stub"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "empty.c").write_text("void sm120patch_bench_libcuda_stub(void) {}\n")
    run(["cc", "-shared", "-fPIC", "-o", str(folder / "libcuda.so"), str(folder / "empty.c")])
    return folder


def run_text(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def spec_rung(work: Path, reps: int) -> dict[str, Any]:
    py = str(spec_venv())
    tree = pristine("flashinfer-python", SPEC_FI)
    kernels = sorted(load_kernels())
    probe = [*CLI, "probe", *kernels, "--arch", "sm_120", "--probe", "spec", "--flashinfer", str(tree), "--python", py]
    bare = [py, "-c", "import flashinfer"]
    rounds = []
    for i in range(reps + 1):
        env = env_with(work / f"spec-cold-{i}")
        r = {"import flashinfer": run(bare, env={**env, "PYTHONPATH": str(tree)})}
        r["spec cold"] = run(probe, ok=(0, 1), env=env)
        _drop_verdicts(work / f"spec-cold-{i}")
        r["spec warm"] = run(probe, ok=(0, 1), env=env)
        if i:  # round 0 warms the page cache, unrecorded
            rounds.append(r)
    out = {k: summary([r[k] for r in rounds]) for k in rounds[0]}
    out["spec cold"]["ratio"] = statistics.median(r["spec cold"][0] / r["import flashinfer"][0] for r in rounds)
    out["checks"] = len(kernels)
    return out


def build_rung(work: Path, reps: int, cold: bool) -> dict[str, Any]:
    ok, why = can_build_for(find_cuda(), parse_arch("sm_120"), family=True)
    if not ok:
        return {"skipped": f"no nvcc for sm_120f: {why}"}
    py = str(spec_venv())
    if cold:
        tree, label = pristine("flashinfer-python", BUILD_FI), BUILD_FI
    else:  # the tree whose cubins the build-rung tests leave in their shared cache
        tree, label = widened_by_hand("0.6.16", work / "fi-0.6.16-widened"), "0.6.16 widened by hand"
    probe = [*CLI, "probe", "flashinfer:trtllm_comm", "--arch", "sm_120", "--probe-level", "build"]
    probe += ["--flashinfer", str(tree), "--python", py]
    out: dict[str, Any] = {"flashinfer": label, "cpus": os.cpu_count()}
    cache = work / "build-cache"
    if cold:
        fi_ws = work / "fi-own-build"
        own = [py, "-c", "from flashinfer.jit.comm import gen_trtllm_comm_module as g; g().build(verbose=False)"]
        own_env = {
            **os.environ,
            "PYTHONPATH": str(tree),
            "FLASHINFER_CUDA_ARCH_LIST": "12.0f",
            "FLASHINFER_WORKSPACE_BASE": str(fi_ws),
            "CUDA_HOME": find_cuda().home or "/usr/local/cuda",
            "MAX_JOBS": str(os.cpu_count() or 1),
        }
        stub = _libcuda_stub(work)
        if stub:  # no driver here: an empty libcuda for FlashInfer's link step (its compile is what counts)
            own_env["FLASHINFER_EXTRA_LDFLAGS"] = f"-L{stub}"
            out["libcuda_stub"] = True
        print("bench: build rung cold (sm120patch)", file=sys.stderr, flush=True)
        ours = run(probe, ok=(0, 1), env=env_with(cache))
        print("bench: build rung cold (FlashInfer's own JIT build)", file=sys.stderr, flush=True)
        theirs = run(own, env=own_env)
        out["cold"] = {"sm120patch": list(ours), "flashinfer": list(theirs), "ratio": ours[0] / theirs[0]}
        shutil.rmtree(fi_ws, ignore_errors=True)
    else:  # warm needs the cubins: take them from the tests' shared cache if it has them
        shared = cache_dir() / "xdg"
        if (shared / "sm120patch" / "probes" / "builds").is_dir() and not cache.exists():
            shutil.copytree(shared / "sm120patch" / "probes" / "builds", cache / "sm120patch" / "probes" / "builds")
    warm = []
    for i in range(reps + 1):
        _drop_verdicts(cache)
        t = run(probe, ok=(0, 1), env=env_with(cache))
        if i:  # round 0 fills what was missing (the compile commands, any cubin), unrecorded
            warm.append(t)
    out["warm"] = summary(warm)
    return out


def measure(work: Path, reps: int, cold_build: bool) -> dict[str, Any]:
    print("bench: spec rung", file=sys.stderr, flush=True)
    res = {"spec": spec_rung(work, reps)}
    print(report({**res, "build": {"skipped": "next"}}), file=sys.stderr, flush=True)
    print("bench: build rung", file=sys.stderr, flush=True)
    res["build"] = build_rung(work, reps, cold_build)
    return res


def report(res: dict[str, Any]) -> str:
    s, b = res["spec"], res["build"]
    lines = [
        "probe rungs (wall seconds, median of the rounds)",
        f"  spec, {s['checks']} kernels for sm_120, cold answer cache: {s['spec cold']['median']:.2f} s = "
        f"{s['spec cold']['ratio']:.2f}x one bare `import flashinfer` ({s['import flashinfer']['median']:.2f} s)",
        f"  spec, warm (verdicts dropped, answers kept): {s['spec warm']['median']:.2f} s",
    ]
    if "skipped" in b:
        lines.append(f"  build: skipped ({b['skipped']})")
        return "\n".join(lines)
    lines.append(
        f"  build, trtllm_comm sm_120 (FlashInfer {b['flashinfer']}), warm (verdict dropped): "
        f"{b['warm']['median']:.2f} s (min {b['warm']['min']:.2f}, max {b['warm']['max']:.2f})"
    )
    if "cold" in b:
        c = b["cold"]
        lines.append(
            f"  build, cold on {b['cpus']} cores: {c['sm120patch'][0]:.0f} s against FlashInfer's own JIT build "
            f"{c['flashinfer'][0]:.0f} s = {c['ratio']:.2f}x"
            + (" (FlashInfer's link against an empty libcuda: no driver here)" if b.get("libcuda_stub") else "")
        )
    else:
        lines.append("  build, cold: not measured (run with --cold-build; many minutes on a small box)")
    return "\n".join(lines)
