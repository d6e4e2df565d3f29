"""Runs one run-rung check under the target interpreter: its prepare step, or one of its ranks.

    python harness.py prepare CHECK.py ARGS_JSON   list the GPUs, pick those of the arch, JIT-build
    python harness.py rank CHECK.py ARGS_JSON      one rank (SM120PATCH_RANK of SM120PATCH_WORLD_SIZE)

Started by sm120patch.probes.run.ranks, never imported by the tool (it imports torch). It speaks
JSON lines on stdout: {"phase": ...} as it goes (so a rank that dies or hangs still says where),
then one {"result": ...} or {"error": ...}. The numbers are compared here, on the GPU, and only
the comparison travels back.

A check module defines `prepare(ctx)` (build or load the kernel's module once, before the ranks
start, so N ranks never race to compile it) and `run_rank(ctx)` (returns {"api": ..., "cases":
[ctx.compare(...), ...]}); optionally BACKEND (the torch.distributed backend, "nccl" by default,
None for no process group) and `devices()` (what GPUs there are; default: torch.cuda).
"""

import importlib.util
import json
import os
import sys
import time
import traceback

# NVLink multicast can take a shared host's GPUs out of service: never let NCCL, torch's
# symmetric memory or NVSHMEM use it, whatever the environment we were started with says.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(NO_MULTICAST)


def emit(obj):
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def _finite(x):
    return x if x is None or x == x and abs(x) != float("inf") else None


class Ctx:
    """What a check sees: its rank, its GPU(s), the tool's arguments, and two helpers."""

    def __init__(self, mode, args):
        self.mode = mode
        self.args = args
        self.rank = int(os.environ.get("SM120PATCH_RANK", "0"))
        self.world_size = int(os.environ.get("SM120PATCH_WORLD_SIZE", "1"))
        self.devices = list(args.get("devices") or [])
        self.device = self.devices[self.rank] if self.rank < len(self.devices) else None
        self.group = None
        self.current = "start"
        self.case = None

    def phase(self, name, **info):
        """Say where we are: a rank that dies or hangs is judged by the last phase it named."""
        self.current = name
        self.case = info.get("case", self.case if name == "compare" else None)
        emit({"phase": name, **info})

    def compare(self, name, out, ref, atol, rtol, **meta):
        """One case's numbers: |out - ref| <= atol + rtol * |ref| elementwise; NaN/inf never pass."""
        import torch

        out, ref = out.detach().float().cpu(), ref.detach().float().cpu()
        if out.shape != ref.shape:
            return {
                "name": name,
                "ok": False,
                "numel": out.numel(),
                "n_bad": out.numel(),
                "error": f"shape {list(out.shape)} != reference {list(ref.shape)}",
                **meta,
            }
        diff = (out - ref).abs()
        finite = torch.isfinite(out)
        allowed = atol + rtol * ref.abs()
        bad = ~(diff <= allowed)  # a NaN compares False, so it is bad
        n_bad = int(bad.sum())
        max_abs = float(diff[finite].max()) if bool(finite.any()) else None
        excess = float((diff - allowed)[finite].max()) if bool(finite.any()) else None
        return {
            "name": name,
            "ok": n_bad == 0 and out.numel() > 0,
            "numel": out.numel(),
            "n_bad": n_bad,
            "n_nonfinite": int((~finite).sum()),
            "max_abs_err": _finite(max_abs),
            "max_excess": _finite(excess),
            "ref_max_abs": _finite(float(ref.abs().max())) if ref.numel() else None,
            "atol": atol,
            "rtol": rtol,
            **meta,
        }


def load_check(path):
    spec = importlib.util.spec_from_file_location("sm120patch_check", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load check {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def torch_devices():
    import torch

    if not torch.cuda.is_available():
        return []
    return [
        {"index": i, "name": torch.cuda.get_device_name(i), "capability": list(torch.cuda.get_device_capability(i))}
        for i in range(torch.cuda.device_count())
    ]


def prepare(ctx, check):
    ctx.phase("devices")
    found = check.devices() if hasattr(check, "devices") else torch_devices()
    want, need = list(ctx.args["capability"]), int(ctx.args.get("need", 1))
    matching = [d["index"] for d in found if list(d["capability"]) == want]
    result = {"devices": found, "matching": matching}
    if len(matching) < need:
        return result  # the tool says why: we do not build for GPUs that are not there
    ctx.devices, ctx.device = matching[:need], matching[0]
    ctx.phase("build")
    start = time.monotonic()
    result["prepare"] = check.prepare(ctx) or {}
    result["build_s"] = round(time.monotonic() - start, 3)
    return result


def run_rank(ctx, check):
    backend = getattr(check, "BACKEND", "nccl")
    ctx.phase("setup", device=ctx.device, backend=backend)
    if backend is not None:
        import datetime

        import torch
        import torch.distributed as dist

        if backend == "nccl":
            torch.cuda.set_device(ctx.device)
        if ctx.world_size > 1:
            dist.init_process_group(
                backend,
                init_method=os.environ["SM120PATCH_INIT"],
                rank=ctx.rank,
                world_size=ctx.world_size,
                timeout=datetime.timedelta(seconds=float(ctx.args.get("pg_timeout_s", 300))),
            )
            ctx.group = dist.group.WORLD
    result = check.run_rank(ctx)
    ctx.phase("teardown")
    if ctx.group is not None:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    return result


def main(argv):
    mode, check_path, args = argv[1], argv[2], json.loads(argv[3])
    ctx = Ctx(mode, args)
    try:
        ctx.phase("import")
        check = load_check(check_path)
        result = prepare(ctx, check) if mode == "prepare" else run_rank(ctx, check)
    except BaseException as e:  # the tool decides what it means from the phase it happened in
        emit(
            {
                "error": f"{type(e).__name__}: {e}"[-2000:],
                "phase": ctx.current,
                "case": ctx.case,
                "traceback": traceback.format_exc()[-3000:],
            }
        )
        return 1
    emit({"result": result})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
