"""Run check: FlashInfer's PCIe-IPC all-reduce (FlashInfer >= 0.7.0) across the ranks, as SGLang calls it.

SGLang 0.5.21+ (device_communicators/pcie_ipc_ar.py) builds one `PcieIpcAllReduceWorkspace` on
the first eligible tensor, sized for the widest decode reduction (rows x hidden), sends a
reduction there when `supports()` says the kernels can run it and keeps everything larger on
NCCL. We do the same per hidden size: bf16 inputs, outputs poisoned with NaN, compared with an
NCCL all-reduce of the same inputs in float32. The workspace is CUDA IPC memory (cudaMalloc +
IPC handles); nothing here asks for multicast or symmetric memory.

When every rank's numbers are right, it times `all_reduce` against NCCL's (torch.distributed,
in place) on the decode sizes the workspace takes (kernel_timing.py). Not tuned: FlashInfer's
seed launch policy, or what a tune cache of this machine already holds (SGLang tunes at start
unless told not to), so the times can understate the tuned kernel. A wrong kernel is not timed.

Executed by harness.py under the target interpreter; never imported by the tool.
"""

BACKEND = "nccl"
HIDDEN = (4096, 6144, 7168)  # Llama 3 8B / Qwen3 235B-A22B, Mixtral 8x22B, DeepSeek V3
ROWS = 256  # the workspace's decode width (SGLang: the largest captured decode batch x draft tokens)
CASES = (1, 16, 128, 256)  # tokens, checked at every hidden size, then timed
TIMING = {"warmup": 20, "repeats": 30, "inner": 10}
# a sum of two bf16 values rounded to bf16: half an ulp, ~0.4% relative
ATOL, RTOL = 0.02, 0.01
BASELINE = "nccl"


def prepare(ctx):
    """Build (JIT) or load the pcie_ipc_comm module once, before the ranks start."""
    import torch
    from flashinfer.comm import pcie_ipc_ar

    torch.cuda.set_device(ctx.device)
    pcie_ipc_ar.get_pcie_ipc_comm_module()
    return {"module": "pcie_ipc_comm"}


def _inputs(ctx, dev, tokens, hidden):
    import torch

    own = torch.Generator(device=dev).manual_seed(7919 * (ctx.rank + 1) + tokens + hidden)
    return torch.randn(tokens, hidden, generator=own, device=dev).to(torch.bfloat16)


def _check(ctx, ws, dev, hidden):
    """The numbers of every supported case at this hidden size, and the cases the kernels declined."""
    import torch
    import torch.distributed as dist

    cases, declined = [], []
    for tokens in CASES:
        name = f"{tokens}x{hidden}"
        x = _inputs(ctx, dev, tokens, hidden)
        if not ws.supports(x):  # a pure function of shape: every rank takes the same branch
            declined.append([tokens, hidden])
            continue
        out = torch.full_like(x, float("nan"))
        ctx.phase("kernel", case=name)
        ws.all_reduce(x, out=out)
        torch.cuda.synchronize(dev)
        ctx.phase("compare", case=name)
        ref = x.float()
        dist.all_reduce(ref, group=ctx.group)
        cases.append(ctx.compare(name, out, ref, ATOL, RTOL, shape=[tokens, hidden], dtype="bfloat16"))
    return cases, declined


def _time(ctx, ws, dev, hidden, group, timer):
    import torch
    import torch.distributed as dist
    from kernel_timing import compare, measure

    rows = []
    for tokens in CASES:
        x = _inputs(ctx, dev, tokens, hidden)
        if not ws.supports(x):
            continue
        out, buf = torch.empty_like(x), x.clone()
        contenders = {
            "pcie_ipc": lambda x=x, out=out: ws.all_reduce(x, out=out),
            BASELINE: lambda buf=buf: dist.all_reduce(buf, group=ctx.group),
        }
        ctx.phase("kernel", case=f"timing {tokens}x{hidden}")
        samples = measure(contenders, group, timer, **TIMING)
        rows.append({"shape": [tokens, hidden], "dtype": "bfloat16", **compare(samples, "pcie_ipc", BASELINE)})
    return rows


def run_rank(ctx):
    import torch
    from flashinfer import comm

    dev = torch.device("cuda", ctx.device)
    api = "PcieIpcAllReduceWorkspace.all_reduce"
    return {"api": api, "gpu": torch.cuda.get_device_name(dev), **_run(ctx, comm, dev)}


def _run(ctx, comm, dev):
    """Per hidden size: a decode-sized workspace, its numbers, then (all ranks right) its timing."""
    import torch
    from kernel_timing import CudaEventTimer, Group, topology

    group, timer = Group(ctx.group, dev), CudaEventTimer(dev)
    cases, declined, spaces, rows, wrong = [], [], [], [], False
    for hidden in HIDDEN:
        ctx.phase("workspace", hidden=hidden)
        ws = comm.PcieIpcAllReduceWorkspace(group=ctx.group, max_numel=ROWS * hidden, dtype=torch.bfloat16)
        spaces.append(
            {"hidden": hidden, "max_numel": ROWS * hidden, "profile": getattr(ws, "profile", None),
             "tune_cache_found": getattr(ws, "_tune_cache_exists", None)}
        )  # fmt: skip
        got, no = _check(ctx, ws, dev, hidden)
        cases, declined = cases + got, declined + no
        # every rank agrees before the collectives of the timing, or none enters them
        wrong = wrong or group.min([1.0 if all(c["ok"] for c in got) else 0.0])[0] < 1.0
        if not wrong:
            rows += _time(ctx, ws, dev, hidden, group, timer)
        ctx.phase("teardown-workspace", hidden=hidden)
        torch.cuda.synchronize(dev)
        ws.destroy()
    timing = {
        "what": "PcieIpcAllReduceWorkspace.all_reduce against NCCL all-reduce",
        "candidate_api": "flashinfer.comm.PcieIpcAllReduceWorkspace (decode-sized, untuned unless a cache exists)",
        "baseline": BASELINE,
        "baseline_api": "torch.distributed.all_reduce (nccl), in place",
        "timer": timer.name,
        "unit": "ms per call",
        **TIMING,
        "world_size": ctx.world_size,
        "workspaces": spaces,
        "declined": declined,
        "topology": topology(ctx.devices[: ctx.world_size]) if ctx.rank == 0 else None,
        "rows": rows,
    }
    if wrong:
        timing = {"skipped": "the numbers were wrong on a rank: a wrong kernel is not timed"}
    return {"cases": cases, "declined": declined, "timing": timing}
