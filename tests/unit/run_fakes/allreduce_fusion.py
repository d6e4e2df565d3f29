"""A fake run check for the unit tests: "all-reduce + residual + RMSNorm" in torch on CPU over gloo.

It stands where sm120patch/probes/run/checks/allreduce_fusion.py stands (same file name, same entry
points) and misbehaves on request, through FAKE_RUN:
ok (right numbers), garbage (rank 1 off by 1), nan (rank 0 writes nothing: NaN poison stays),
hang (rank 1 never returns from the kernel), die (rank 1 is killed in the kernel), raise (rank 0
raises in the kernel), setup (rank 1 raises before the kernel), noarch (the build refuses the arch).
FAKE_GPUS lists the compute capabilities the fake machine has ("9.0,9.0").
FAKE_TIMING=1 times, through the shipped kernel_timing.py, fakes of known relative cost: per call
"oneshot" sleeps 3x as long as the baseline, "twoshot" a third as long (FAKE_UNIT_MS, default 9 ms,
is the baseline's sleep), each after a real gloo all-reduce; sleeping, not spinning, so a loaded
box stretches all three alike.
"""

import os
import signal
import sys
import time

BACKEND = "gloo"
MODE = os.environ.get("FAKE_RUN", "ok")
HIDDEN = 64
COST = {"oneshot": 3.0, "twoshot": 1.0 / 3.0, "nccl+rmsnorm": 1.0}  # x FAKE_UNIT_MS per call


def devices():
    caps = [c for c in os.environ.get("FAKE_GPUS", "9.0,9.0").split(",") if c]
    return [{"index": i, "name": "Fake GPU", "capability": [int(x) for x in c.split(".")]} for i, c in enumerate(caps)]


def prepare(ctx):
    if MODE == "noarch":
        raise RuntimeError("No supported CUDA architectures found for major versions [9, 10].")
    return {"module": "fake", "devices": ctx.devices}


def run_rank(ctx):
    import torch
    import torch.distributed as dist

    if MODE == "setup" and ctx.rank == 1:
        ctx.phase("workspace")
        raise OSError("cannot open IPC handle")
    cases = []
    for tokens in (4, 32):
        name = f"fake-{tokens}x{HIDDEN}"
        gen = torch.Generator().manual_seed(tokens)
        residual, gamma = torch.randn(tokens, HIDDEN, generator=gen), torch.randn(HIDDEN, generator=gen)
        x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(100 * ctx.rank + tokens))
        ctx.phase("kernel", case=name)
        if MODE == "hang" and ctx.rank == 1:
            time.sleep(3600)
        if MODE == "die" and ctx.rank == 1:
            sys.stderr.write("fake: illegal instruction in the fused kernel\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if MODE == "raise" and ctx.rank == 0:
            raise RuntimeError("allreduce_fusion_op failed with error code cluster misconfiguration")
        summed = x.clone()
        dist.all_reduce(summed)
        res = summed + residual
        out = res * torch.rsqrt(res.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma
        if MODE == "garbage" and ctx.rank == 1:
            out = out + 1.0
        if MODE == "nan" and ctx.rank == 0:
            out = torch.full_like(out, float("nan"))
        ctx.phase("compare", case=name)
        ref_sum = x.double()
        dist.all_reduce(ref_sum)
        ref_res = ref_sum + residual.double()
        ref = ref_res * torch.rsqrt(ref_res.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma.double()
        cases.append(ctx.compare(name, out, ref, 0.05, 0.02, shape=[tokens, HIDDEN], dtype="float32", mode="fake"))
    names = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
    env = {k: os.environ.get(k) for k in names}
    out = {"api": "fake_allreduce_fusion", "gpu": "Fake GPU", "cases": cases, "env": env, "pid": os.getpid()}
    if os.environ.get("FAKE_TIMING") == "1":
        out["timing"] = _timing(ctx, all(c["ok"] for c in cases))
    return out


def _timing(ctx, ok):
    import torch
    import torch.distributed as dist
    from kernel_timing import Group, WallTimer, compare, measure

    group = Group(ctx.group)
    if group.min([1.0 if ok else 0.0])[0] < 1.0:
        return {"skipped": "the numbers were wrong on a rank: a wrong kernel is not timed"}
    unit = float(os.environ.get("FAKE_UNIT_MS", "9")) / 1e3
    rows = []
    for tokens in (1, 64):
        buf = torch.ones(tokens, HIDDEN)

        def call(name, buf=buf):
            return lambda: (dist.all_reduce(buf), time.sleep(unit * COST[name]))

        contenders = {"oneshot": call("oneshot"), "nccl+rmsnorm": call("nccl+rmsnorm")}
        if tokens > ctx.world_size:
            contenders = {"oneshot": contenders["oneshot"], "twoshot": call("twoshot"), **contenders}
        ctx.phase("kernel", case=f"timing {tokens}x{HIDDEN}")
        samples = measure(contenders, group, WallTimer(), warmup=1, repeats=7, inner=1)
        rows += [
            {"shape": [tokens, HIDDEN], "dtype": "float32", **compare(samples, c, "nccl+rmsnorm"), "sglang_fuses": True,
             "flashinfer_picks": None}
            for c in contenders if c != "nccl+rmsnorm"
        ]  # fmt: skip
    return {"what": "fake fusion against fake NCCL + RMSNorm", "baseline": "nccl+rmsnorm", "timer": "perf_counter",
            "unit": "ms per call", "repeats": 7, "inner": 1, "world_size": ctx.world_size,
            "topology": {"p2p": {"0->1": True, "1->0": True}, "links": {"0-1": "FAKE"}} if ctx.rank == 0 else None,
            "rows": rows}  # fmt: skip
