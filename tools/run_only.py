"""The run rung alone, for the GPU validation: `python3 run_only.py KERNEL ARCH`.

`sm120patch probe --probe run` climbs every rung first; for the CUTLASS fused-MoE module the
build rung alone compiles ~180 CUDA files to cubins, then the run rung builds the loadable
module (another ~180). On a lent GPU with 30 minutes that is one build too many, so this
asks only the run rung, exactly as the ladder would (same check, workspace and judgement),
and prints its Step as JSON. The cubin reading it skips is covered by the build-rung tests.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def installed_only(path: list[str]) -> list[str]:
    """`sys.path` without this repository's root: the sm120patch that runs is the installed one (a
    wheel, or an editable install, which maps the package itself), never the source tree found
    first because PYTHONPATH or the working folder names the repo: that tree has no
    `sm120patch.patches` (the wheel maps `patches/` there), so its catalogue would not load."""
    return [p for p in path if Path(p or ".").resolve() != REPO]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python3 run_only.py KERNEL ARCH  (e.g. flashinfer:cutlass_fused_moe_sm90 sm_90)", file=sys.stderr)
        return 2
    sys.path[:] = installed_only(sys.path)
    try:
        import sm120patch
        from sm120patch.arch import parse_arch
        from sm120patch.catalogue.kernels import get_kernel
        from sm120patch.errors import UserError
        from sm120patch.probes.environment.flashinfer import from_python
        from sm120patch.probes.run.rung import check_run
        from sm120patch.probes.verdict_cache import default_cache_dir
    except ImportError as e:
        print(
            f"run_only.py: {e}: sm120patch is not installed for {sys.executable}; install the wheel "
            "(`pip wheel --no-deps .` in the repo, then `pip install` it) or `pip install -e .`",
            file=sys.stderr,
        )
        return 2
    print(f"run_only.py: sm120patch from {Path(sm120patch.__file__).parent}", file=sys.stderr)
    try:
        kernel, arch = get_kernel(argv[0]), parse_arch(argv[1])
    except UserError as e:
        print(f"run_only.py: {e}", file=sys.stderr)
        return 2
    fi = from_python(sys.executable)
    t0 = time.monotonic()
    step = check_run(kernel, arch, fi, default_cache_dir())
    out = {**step.to_dict("run"), "evidence": step.evidence, "elapsed_s": round(time.monotonic() - t0, 1)}
    print(json.dumps(out, indent=1, default=str))
    return 0 if step.result == "pass" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
