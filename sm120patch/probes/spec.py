"""Spec rung: ask FlashInfer itself whether it would build the module for the arch.

Calls the JIT generator in a subprocess of the target Python with
FLASHINFER_CUDA_ARCH_LIST set to the arch. The generator either returns a JitSpec or
raises FlashInfer's own "No supported CUDA architectures found for major versions
[...]", the exact error a server would hit. No GPU and no nvcc are needed.
"""

from __future__ import annotations

import json

from sm120patch.arch import Arch
from sm120patch.flashinfer_env import FlashInferEnv
from sm120patch.kernels import Kernel
from sm120patch.probes.subproc import child_env, own_dir, run_script
from sm120patch.rungs import Step

TIMEOUT_S = 120.0
NO_ARCH = "No supported CUDA architectures found"
MISSING_DEPS = ("torch", "flashinfer", "tvm_ffi")

SCRIPT = r"""
import importlib, json, sys
mod, gen, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
out = {}
try:
    m = importlib.import_module(mod)
    out["file"] = getattr(m, "__file__", None)
except BaseException as e:
    out.update(stage="import", error=f"{type(e).__name__}: {e}",
               missing=getattr(e, "name", None))
else:
    fn = getattr(m, gen, None)
    if fn is None:
        out.update(stage="lookup", error=f"{mod} has no {gen}")
    else:
        try:
            spec = fn(**kwargs)
            out.update(ok=True, type=type(spec).__name__, name=getattr(spec, "name", None))
        except BaseException as e:
            out.update(stage="call", error=f"{type(e).__name__}: {e}")
print(json.dumps(out))
"""


def check_spec(kernel: Kernel, arch: Arch, fi: FlashInferEnv, timeout: float = TIMEOUT_S) -> Step:
    """(result, reason) of calling the generator for `arch` under `fi.python`."""
    if not fi.python:
        return Step("unknown", "spec: no Python interpreter to run this FlashInfer tree under")
    sys_path = str(fi.sys_path) if fi.source == "tree" and fi.sys_path else None
    with own_dir("spec") as ws:
        env = child_env(arch, sys_path, str(ws))
        args = [kernel.module, kernel.generator, json.dumps(dict(kernel.generator_kwargs))]
        res = run_script(fi.python, SCRIPT, args, env, timeout)
    where = f"{kernel.module}.{kernel.generator}() with FLASHINFER_CUDA_ARCH_LIST={env['FLASHINFER_CUDA_ARCH_LIST']}"
    if res.timed_out:
        return Step("unknown", f"spec: {where} did not finish within {timeout:.0f} s")
    p = res.payload
    if p is None:
        return Step("unknown", f"spec: {fi.python} exited {res.returncode}: {res.stderr_tail[-300:]}")
    if p.get("ok"):
        return Step("pass", f"spec: {where} returned a {p.get('type')} ({res.elapsed_s:.1f} s)")
    err = str(p.get("error", ""))
    if p.get("stage") == "call" and NO_ARCH in err:
        return Step("fail", f"spec: {where} raised {err}")
    if p.get("stage") == "import":
        missing = p.get("missing")
        if missing and str(missing).split(".")[0] in MISSING_DEPS:
            return Step("unknown", f"spec: {fi.python} cannot import {missing} ({err})")
        return Step("unknown", f"spec: importing {kernel.module} under {fi.python} failed: {err}")
    if p.get("stage") == "lookup":
        return Step("unknown", f"spec: {err} (this FlashInfer has no such generator)")
    return Step("unknown", f"spec: {where} raised {err}")
