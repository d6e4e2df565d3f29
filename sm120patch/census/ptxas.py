"""The ptxas Triton would run, and whether it knows the GPUs' `sm_XYa` targets.

Triton JIT-compiles its kernels through ptxas (its bundled one unless TRITON_PTXAS_PATH says
otherwise); one older than the GPU fails every Triton kernel with "Value 'sm_121a' is not
defined for option 'gpu-name'", whatever the wheels carry.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sm120patch.arch import Arch


def triton_ptxas(sites: Sequence[Path], env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The ptxas Triton would run (TRITON_PTXAS_PATH, else the one bundled under
    triton/backends/nvidia/bin, else triton/third_party/cuda/bin for Triton < 3.0), its CUDA
    release from `ptxas --version`; None when Triton is not installed and no override is set."""
    env = os.environ if env is None else env
    override = env.get("TRITON_PTXAS_PATH")
    if override:
        path, source = Path(override), "TRITON_PTXAS_PATH"
    else:
        found = [
            s / rel
            for s in sites
            for rel in ("triton/backends/nvidia/bin/ptxas", "triton/third_party/cuda/bin/ptxas")
            if (s / rel).is_file()
        ]
        if not found:
            return None
        path, source = found[0], "bundled with triton"
    info: dict[str, Any] = {"path": str(path), "source": source, "cuda": None, "error": ""}
    try:
        p = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL
        )
        m = re.search(r"release (\d+\.\d+)", p.stdout)
        info["cuda"] = m.group(1) if m else None
        if not m:
            info["error"] = f"`{path} --version` said no release (exit {p.returncode})"
    except (OSError, subprocess.SubprocessError) as e:
        info["error"] = f"{path}: {e}"
    return info


def ptxas_targets(info: dict[str, Any], archs: Sequence[Arch]) -> dict[str, dict[str, Any]]:
    """Whether that ptxas knows the `sm_XYa` Triton compiles for (Triton targets sm_120a on 12.0,
    sm_121a on 12.1); the error it gives when not (diagnose: ptxas-unknown-sm12x)."""
    from sm120patch.probes.environment.device import CudaToolkit, can_build_for

    out = {}
    for a in archs:
        ok, why = can_build_for(CudaToolkit(version=info.get("cuda"), nvcc=info["path"]), a)
        target = f"{a.name}a" if a.major >= 9 else a.name
        out[a.name] = {
            "ok": ok,
            "why": why.replace("nvcc", "ptxas"),
            "you_will_see": "" if ok else f"ptxas fatal   : Value '{target}' is not defined for option 'gpu-name'",
        }
    return out
