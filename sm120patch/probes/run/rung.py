"""Run rung (opt-in, needs the GPUs): execute the kernels a gate opens and check their numbers.

The only rung that catches a kernel that builds and launches but computes garbage (FlashInfer
once compiled SM12x allreduce kernels with empty bodies). Each catalogue `run` value names a
check script in `checks/`; it runs under the *target* interpreter, never in this process:
first a prepare step (which GPUs are of the arch asked for; the JIT build, once), then one
process per rank (`ranks.py`). A pass on an H200 says nothing about an RTX PRO 6000, so only
GPUs whose compute capability is the arch's count; too few of them is `unknown`, not a pass.

For tests, SM120PATCH_RUN_CHECKS may name a folder whose check files replace the shipped ones
(a fake kernel on CPU with gloo); the verdict then says so, and the cache key includes the
check files' hashes either way.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from sm120patch.arch import Arch
from sm120patch.catalogue.kernels import Kernel
from sm120patch.hashing import sha256_chunks, sha256_text
from sm120patch.probes.environment.device import find_cuda
from sm120patch.probes.environment.flashinfer import FlashInferEnv
from sm120patch.probes.run import ranks
from sm120patch.probes.run.ranks import RunCheck
from sm120patch.probes.run.verdict import judge_prepare, judge_ranks
from sm120patch.probes.rungs import Step
from sm120patch.probes.subproc import child_env

CHECKS_ENV = "SM120PATCH_RUN_CHECKS"
CHECKS_DIR = Path(__file__).resolve().parent / "checks"


CHECKS = {
    c.name: c
    for c in (
        RunCheck("rmsnorm", "rmsnorm.py", 1, 900.0, "flashinfer.norm.rmsnorm"),
        RunCheck("allreduce_fusion", "allreduce_fusion.py", 2, 1200.0, "trtllm_allreduce_fusion kARResidualRMSNorm"),
        RunCheck("pcie_ipc_allreduce", "pcie_ipc_allreduce.py", 2, 1200.0, "PcieIpcAllReduceWorkspace.all_reduce"),
        # the CUTLASS fused-MoE module is ~180 CUDA files: a cold JIT build takes far longer than the rest
        RunCheck("fused_moe", "fused_moe.py", 1, 7200.0, "cutlass_fused_moe"),
    )
}


def check_path(check: RunCheck) -> Path:
    """The check script to run: the shipped one, or the one in $SM120PATCH_RUN_CHECKS (tests)."""
    override = os.environ.get(CHECKS_ENV)
    if override and (Path(override) / check.file).is_file():
        return Path(override) / check.file
    return CHECKS_DIR / check.file


def run_fingerprint(kernel: Kernel) -> str:
    """sha256 of the check script, the harness and the timing library a run verdict would stand on
    ("" if none)."""
    if kernel.run not in CHECKS:
        return ""
    files = (check_path(CHECKS[kernel.run]), ranks.HARNESS, ranks.TIMING_LIB)
    return sha256_chunks(_bytes_or_missing(p) for p in files)


def _bytes_or_missing(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b"missing"


def workspace(kernel: Kernel, arch: Arch, fi: FlashInferEnv, cache_root: Path) -> Path:
    """Where FlashInfer JIT-builds the module for the run: a folder of its own per FlashInfer
    (version, location, interpreter) and arch, so a second run loads it instead of building.
    The build rung compiles device code only (cubins, to read them back), so the run builds the
    loadable module itself, once."""
    where = sha256_text(f"{fi.location}|{fi.python}")[:12]
    own = cache_root / "builds" / re.sub(r"[^A-Za-z0-9._-]+", "_", f"run-{fi.version}-{arch.name}-{where}")
    own.mkdir(parents=True, exist_ok=True)
    return own


def _say(text: str) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def check_run(kernel: Kernel, arch: Arch, fi: FlashInferEnv, cache_root: Path, timeout: float | None = None) -> Step:
    """Run the kernel's numeric check on GPUs of `arch`, under FlashInfer's interpreter."""
    if not kernel.run:
        return Step("unknown", f"run: {kernel.run_unavailable or 'no run check for this kernel'}")
    if not fi.python:
        return Step(
            "unknown",
            "run: no Python interpreter to run this FlashInfer under"
            ": pass --python EXE (the server's Python, with torch)",
        )
    check = CHECKS[kernel.run]
    path = check_path(check)
    budget = timeout if timeout is not None else check.timeout_s
    ws = workspace(kernel, arch, fi, cache_root)
    sys_path = str(fi.sys_path) if fi.source == "tree" and fi.sys_path else None
    env = child_env(arch, sys_path, str(ws))
    cuda = find_cuda()
    if cuda.home:
        env.setdefault("CUDA_HOME", cuda.home)
    args = {"capability": [arch.major, arch.minor], "need": check.world_size}
    origin = "" if path.parent == CHECKS_DIR else f" (check from ${CHECKS_ENV}: {path})"
    _say(f"run: {check.name} on {arch.name}: finding GPUs, building {'/'.join(kernel.jit_modules)} if needed")
    prep = ranks.prepare(fi.python, path, args, env, budget)
    stop = judge_prepare(check, arch, prep, budget)
    if stop is not None:
        stop.reason += origin
        return stop
    assert prep.children[0].result is not None  # judge_prepare stops otherwise
    args["devices"] = prep.children[0].result["matching"][: check.world_size]
    _say(f"run: {check.name} on {arch.name}: {check.world_size} rank(s) on GPU(s) {args['devices']}")
    run = ranks.run_ranks(
        fi.python, path, args, check.world_size, env, max(budget - prep.elapsed_s, 1.0), scratch=ws / "rendezvous"
    )
    step = judge_ranks(check, arch, prep, run)
    step.reason += origin
    # a check that built a module of its own (the fused MoE's reduced one) says what it built and what not
    built = next((c.result["reduced"] for c in run.children if c.result and c.result.get("reduced")), None)
    if built:
        step.evidence["run"]["reduced"] = built
    step.evidence["run"].update(
        kernel=kernel.id,
        check_file=str(path),
        check_sha256=run_fingerprint(kernel),
        workspace=str(ws),
        python=fi.python,
    )
    return step
