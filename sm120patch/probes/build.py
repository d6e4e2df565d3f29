"""Build rung (opt-in): compile the JIT module with nvcc for the arch, then read what came out.

Minutes of nvcc, so it is cached: the output folder is keyed by FlashInfer version,
arch, CUDA version and kernel. FlashInfer builds into a staging folder that is renamed
into place only after a successful build, so Ctrl-C or a crash never leaves a
half-written entry that a later run would trust. Compiling is not proof the kernel
works (FlashInfer once compiled an empty SM12x body), so a pass here says "built for
sm_NNN", and the fatbin of the .so is read to confirm the SASS is really there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from sm120patch.arch import Arch
from sm120patch.device import can_build_for, find_cuda
from sm120patch.elf import scan_file
from sm120patch.flashinfer_env import FlashInferEnv
from sm120patch.kernels import Kernel
from sm120patch.probes.spec import NO_ARCH
from sm120patch.probes.subproc import child_env, run_script
from sm120patch.rungs import Step

TIMEOUT_S = 3600.0

SCRIPT = r"""
import importlib, json, sys
mod, gen, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
out = {}
try:
    spec = getattr(importlib.import_module(mod), gen)(**kwargs)
    try:
        spec.build(verbose=False)
    except TypeError:
        spec.build()
    lib = spec.get_library_path() if hasattr(spec, "get_library_path") else spec.jit_library_path
    out.update(ok=True, library=str(lib))
except BaseException as e:
    out.update(error=f"{type(e).__name__}: {e}")
print(json.dumps(out))
"""


def _key(kernel: Kernel, arch: Arch, fi: FlashInferEnv, cuda: str | None) -> str:
    raw = f"{kernel.id}-{fi.version}-{arch.name}-cuda{cuda}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw)


def _built_library(folder: Path, kernel: Kernel) -> Path | None:
    for m in kernel.jit_modules:
        hits = sorted(folder.glob(f".cache/flashinfer/*/*/cached_ops/{m}/{m}.so"))
        if hits:
            return hits[0]
    return None


def _judge(lib: Path, arch: Arch, where: str) -> Step:
    found = scan_file(lib)
    sm = arch.major * 10 + arch.minor
    if sm in found.sass:
        return Step("pass", f"build: {lib.name} holds sm_{sm} SASS ({where})")
    return Step("fail", f"build: {lib.name} built but holds SASS for {found.sass}, not sm_{sm} ({where})")


def check_build(kernel: Kernel, arch: Arch, fi: FlashInferEnv, cache_root: Path, timeout: float = TIMEOUT_S) -> Step:
    """(result, reason) of compiling the module for `arch`; reuses a finished build."""
    if not fi.python:
        return Step("unknown", "build: no Python interpreter to run this FlashInfer under")
    cuda = find_cuda()
    ok, why = can_build_for(cuda, arch, family=arch.major == 12 and arch.minor == 0)
    if not ok:
        ok_a, _ = can_build_for(cuda, arch)
        if not ok_a:
            return Step("unknown", f"build: {why}")
    at_least_12_9 = ok
    key = _key(kernel, arch, fi, cuda.version)
    final = cache_root / "builds" / key
    if final.is_dir() and (lib := _built_library(final, kernel)):
        return _judge(lib, arch, f"cached build in {final}")
    staging = cache_root / "builds" / f"{key}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    sys_path = str(fi.sys_path) if fi.source == "tree" and fi.sys_path else None
    env = child_env(arch, sys_path, str(staging), at_least_12_9)
    if cuda.home:
        env.setdefault("CUDA_HOME", cuda.home)
    args = [kernel.module, kernel.generator, json.dumps(dict(kernel.generator_kwargs))]
    try:
        res = run_script(fi.python, SCRIPT, args, env, timeout, progress=f"building {kernel.id} for {arch.name}")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    p = res.payload or {}
    if not p.get("ok"):
        shutil.rmtree(staging, ignore_errors=True)
        err = str(p.get("error") or res.stderr_tail[-300:])
        if res.timed_out:
            return Step("unknown", f"build: nvcc did not finish within {timeout:.0f} s")
        if NO_ARCH in err:
            return Step("fail", f"build: {err}")
        return Step("unknown", f"build: failed after {res.elapsed_s:.0f} s: {err[-300:]}")
    if final.exists():
        shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    lib = _built_library(final, kernel)
    if lib is None:
        return Step("unknown", f"build: finished, but no {'/'.join(kernel.jit_modules)}.so in {final}")
    return _judge(lib, arch, f"built in {res.elapsed_s:.0f} s with CUDA {cuda.version}")
