"""Run rung (opt-in, needs the GPU): launch a kernel and compare it with a torch reference.

The only rung that catches a kernel that compiles and returns garbage. Runs in a
subprocess of the target Python; checks that the visible GPU really is the arch
asked for, because a pass on an H200 says nothing about an RTX PRO 6000.
"""

from __future__ import annotations

from pathlib import Path

from sm120patch.arch import Arch
from sm120patch.flashinfer_env import FlashInferEnv
from sm120patch.kernels import Kernel
from sm120patch.probes.subproc import child_env, run_script
from sm120patch.rungs import Step

TIMEOUT_S = 900.0

RMSNORM = r"""
import json, sys
ATOL, RTOL = 1e-2, 1e-2
want = tuple(int(x) for x in sys.argv[1].split("."))
out = {}
try:
    import torch
    if not torch.cuda.is_available():
        out.update(skip="torch sees no CUDA GPU")
    else:
        dev = next((i for i in range(torch.cuda.device_count())
                    if torch.cuda.get_device_capability(i) == want), None)
        if dev is None:
            caps = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
            out.update(skip=f"no GPU with compute capability {want}; visible: {caps}")
        else:
            import flashinfer
            torch.manual_seed(0)
            x = torch.randn(64, 4096, dtype=torch.bfloat16, device=f"cuda:{dev}")
            w = torch.randn(4096, dtype=torch.bfloat16, device=f"cuda:{dev}")
            y = flashinfer.norm.rmsnorm(x, w, eps=1e-6)
            xf = x.float()
            ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
            diff = (y.float() - ref).abs()
            # bf16 keeps ~3 significant digits: judge |y - ref| <= atol + rtol * |ref|
            excess = (diff - (ATOL + RTOL * ref.abs())).max().item()
            out.update(ok=True, max_abs_err=diff.max().item(), excess=excess,
                       gpu=torch.cuda.get_device_name(dev))
except BaseException as e:
    out.update(error=f"{type(e).__name__}: {e}")
print(json.dumps(out))
"""

CHECKS = {"rmsnorm": RMSNORM}


def check_run(kernel: Kernel, arch: Arch, fi: FlashInferEnv, cache_root: Path, timeout: float = TIMEOUT_S) -> Step:
    """(result, reason) of a numeric check on the real GPU."""
    if not kernel.run:
        return Step("unknown", f"run: {kernel.run_unavailable or 'no run check for this kernel'}")
    if not fi.python:
        return Step("unknown", "run: no Python interpreter to run this FlashInfer under")
    ws = cache_root / "builds" / f"run-{fi.version}-{arch.name}"
    ws.mkdir(parents=True, exist_ok=True)
    sys_path = str(fi.sys_path) if fi.source == "tree" and fi.sys_path else None
    res = run_script(
        fi.python,
        CHECKS[kernel.run],
        [f"{arch.major}.{arch.minor}"],
        child_env(arch, sys_path, str(ws)),
        timeout,
        progress=f"running {kernel.run} on {arch.name}",
    )
    p = res.payload or {}
    if res.timed_out:
        return Step("unknown", f"run: did not finish within {timeout:.0f} s")
    if "skip" in p:
        return Step("unknown", f"run: {p['skip']}")
    if not p.get("ok"):
        return Step("fail", f"run: {kernel.run} raised {p.get('error') or res.stderr_tail[-300:]}")
    err = float(p["max_abs_err"])  # type: ignore[arg-type]
    verdict = "pass" if float(p["excess"]) <= 0 else "fail"  # type: ignore[arg-type]
    return Step(
        verdict,
        f"run: {kernel.run} on {p.get('gpu')}: max abs error {err:.5f} vs a torch "
        f"reference (|err| <= 0.01 + 0.01*|ref| required) in {res.elapsed_s:.1f} s",
    )
