"""Run check: FlashInfer's allreduce + residual add + RMSNorm fusion across the ranks, as SGLang calls it.

SGLang's fused path calls `trtllm_allreduce_fusion` with pattern kARResidualRMSNorm on an IPC
workspace from `trtllm_create_ipc_workspace_for_all_reduce_fusion`. We do the same on small
shapes that take both of its kernels, the one-shot Lamport kernel (few tokens) and the two-shot
kernel (many tokens), and compare with an NCCL all-reduce + residual add + RMSNorm computed in
float32. Outputs are poisoned with NaN first, so a kernel that launches and writes nothing (an
empty body compiled for the arch) is a mismatch, never a pass. The workspace is CUDA IPC
memory (cudaMalloc + IPC handles), never multicast or symmetric memory.

When every rank's numbers are right, it then times the fusion against the path SGLang takes
without it (communicator.py: tensor_model_parallel_all_reduce, then the layer's RMSNorm, whose
CUDA forward is sgl_kernel.fused_add_rmsnorm in 0.5.9): an NCCL all-reduce then FlashInfer's
in-place fused_add_rmsnorm, called as SGLang calls the fusion (launch_with_pdl, no fp32
accumulation), one-shot and two-shot, on hidden sizes of real models and decode to prefill
token counts. A wrong kernel is not timed. The timings decide nothing (kernel_timing.py).

Executed by harness.py under the target interpreter; never imported by the tool.
"""

import inspect
import time

BACKEND = "nccl"
HIDDEN = 4096
MAX_TOKENS = 1024
EPS = 1e-6
# (tokens, one-shot?): 16 and 128 tokens take the Lamport one-shot kernel, 1024 the two-shot one
CASES = ((16, True), (128, True), (1024, False))
# bf16 outputs of magnitude up to ~10 carry rounding errors of a few hundredths
ATOL, RTOL = 0.05, 0.02
# timing: hidden sizes of real models: 4096 (Llama 3 8B, Qwen3 235B-A22B), 6144 (Mixtral 8x22B), 7168 (DeepSeek V3)
TIMING_HIDDEN = (4096, 6144, 7168)
TIMING_TOKENS = (1, 16, 128, 1024, 8192)  # decode to prefill
TIMING = {"warmup": 20, "repeats": 30, "inner": 10}
SGLANG_MAX_TOKENS = 2048  # SGLang 0.5.9 communicator.py FUSE_ALLREDUCE_MAX_BATCH_SIZE: fused up to here
BASELINE = "nccl+rmsnorm"


def prepare(ctx):
    """Build (JIT) or load the trtllm_comm module once, before the ranks start."""
    import torch
    from flashinfer.comm import trtllm_ar

    torch.cuda.set_device(ctx.device)
    trtllm_ar.get_trtllm_comm_module()
    # the timing's baseline norm: built here once, not by two ranks racing
    from flashinfer.norm import fused_add_rmsnorm

    one = torch.ones(1, 128, dtype=torch.bfloat16, device="cuda")
    fused_add_rmsnorm(one, one.clone(), one[0], eps=EPS)
    torch.cuda.synchronize()
    return {"module": "trtllm_comm", "timing_baseline_module": "norm"}


def _workspace(ctx, comm, max_tokens=MAX_TOKENS, hidden=HIDDEN):
    kwargs = {"group": ctx.group}
    params = inspect.signature(comm.trtllm_create_ipc_workspace_for_all_reduce_fusion).parameters
    if "use_symm_dev_mem" in params:
        kwargs["use_symm_dev_mem"] = False  # plain IPC buffers: no symmetric memory, no multicast
    made = comm.trtllm_create_ipc_workspace_for_all_reduce_fusion(
        ctx.rank, ctx.world_size, max_tokens, hidden, **kwargs
    )
    return made[0], made[1]  # IPC handles, the workspace pointer tensor


def _reference(x, residual, gamma, group):
    """NCCL all-reduce of the float32 inputs, + residual, RMSNorm: all in float32."""
    import torch
    import torch.distributed as dist

    summed = x.float()
    dist.all_reduce(summed, group=group)
    res = summed + residual.float()
    norm = res * torch.rsqrt(res.pow(2).mean(-1, keepdim=True) + EPS) * gamma.float()
    return res, norm


def run_rank(ctx):
    import torch
    from flashinfer import comm

    dev = torch.device("cuda", ctx.device)
    ctx.phase("workspace")
    handles, workspace = _workspace(ctx, comm)
    cases = []
    for tokens, oneshot in CASES:
        mode = "oneshot" if oneshot else "twoshot"
        name = f"{mode}-{tokens}x{HIDDEN}"
        gen = torch.Generator(device=dev).manual_seed(1000 + tokens)  # shared by all ranks
        residual = torch.randn(tokens, HIDDEN, generator=gen, device=dev).to(torch.bfloat16)
        gamma = torch.randn(HIDDEN, generator=gen, device=dev).to(torch.bfloat16)
        own = torch.Generator(device=dev).manual_seed(7919 * (ctx.rank + 1) + tokens)
        x = torch.randn(tokens, HIDDEN, generator=own, device=dev).to(torch.bfloat16)
        residual_out = torch.full_like(x, float("nan"))
        norm_out = torch.full_like(x, float("nan"))
        ctx.phase("kernel", case=name)
        start = time.monotonic()
        comm.trtllm_allreduce_fusion(
            allreduce_in=x,
            world_size=ctx.world_size,
            world_rank=ctx.rank,
            token_num=tokens,
            hidden_dim=HIDDEN,
            workspace_ptrs=workspace,
            launch_with_pdl=False,
            trigger_completion_at_end=True,
            fp32_acc=True,
            pattern_code=comm.AllReduceFusionPattern.kARResidualRMSNorm,
            use_oneshot=oneshot,
            allreduce_out=None,
            residual_in=residual,
            residual_out=residual_out,
            norm_out=norm_out,
            quant_out=None,
            scale_out=None,
            rms_gamma=gamma,
            rms_eps=EPS,
            scale_factor=None,
            layout_code=None,
        )
        torch.cuda.synchronize(dev)
        kernel_s = round(time.monotonic() - start, 4)
        ctx.phase("compare", case=name)
        ref_res, ref_norm = _reference(x, residual, gamma, ctx.group)
        meta = {"shape": [tokens, HIDDEN], "dtype": "bfloat16", "mode": mode, "kernel_s": kernel_s}
        cases.append(ctx.compare(f"{name} norm_out", norm_out, ref_norm, ATOL, RTOL, **meta))
        cases.append(ctx.compare(f"{name} residual_out", residual_out, ref_res, ATOL, RTOL, **meta))
    # on success only: after a failed launch the process just exits, and a sticky CUDA
    # error would make this teardown raise over the error that matters
    ctx.phase("teardown-workspace")
    comm.trtllm_destroy_ipc_workspace_for_all_reduce_fusion(handles, ctx.group)
    return {
        "api": "trtllm_allreduce_fusion kARResidualRMSNorm",
        "gpu": torch.cuda.get_device_name(dev),
        "cases": cases,
        "timing": _timing(ctx, comm, dev, all(c["ok"] for c in cases)),
    }


def _picks(tokens, hidden, world_size):
    """Which path FlashInfer's heuristic takes when SGLang passes use_oneshot=None (None if unknown)."""
    import torch
    from flashinfer.comm import trtllm_ar

    pick = getattr(trtllm_ar, "_should_use_oneshot", None)
    try:
        return None if pick is None else ("oneshot" if pick(tokens, hidden, torch.bfloat16, world_size) else "twoshot")
    except Exception:  # a private helper: its signature may move
        return None


def _fused(ctx, comm, workspace, x, residual, gamma, oneshot):
    """The candidate, called as SGLang 0.5.9 calls it (flashinfer_comm_fusion.py), outputs reused."""
    import torch

    residual_out, norm_out = torch.empty_like(x), torch.empty_like(x)
    return lambda: comm.trtllm_allreduce_fusion(
        allreduce_in=x, world_size=ctx.world_size, world_rank=ctx.rank, token_num=x.shape[0], hidden_dim=x.shape[1],
        workspace_ptrs=workspace, launch_with_pdl=True, trigger_completion_at_end=False, fp32_acc=False,
        pattern_code=comm.AllReduceFusionPattern.kARResidualRMSNorm, use_oneshot=oneshot, allreduce_out=None,
        residual_in=residual, residual_out=residual_out, norm_out=norm_out, quant_out=None, scale_out=None,
        rms_gamma=gamma, rms_eps=EPS, scale_factor=None, layout_code=None,
    )  # fmt: skip


def _unfused(ctx, x, residual, gamma):
    """The path without the fusion: NCCL all-reduce, then the add + RMSNorm, both in place as in
    SGLang (the norm writes x back normalized, so repeated calls stay finite)."""
    import torch.distributed as dist
    from flashinfer.norm import fused_add_rmsnorm

    def call():
        dist.all_reduce(x, group=ctx.group)
        fused_add_rmsnorm(x, residual, gamma, eps=EPS)

    return call


def _timing(ctx, comm, dev, ok):
    """Every rank's times of the fusion and of NCCL + RMSNorm (the slowest rank's per sample)."""
    import torch
    from kernel_timing import CudaEventTimer, Group, compare, measure, topology

    group = Group(ctx.group, dev)
    if group.min([1.0 if ok else 0.0])[0] < 1.0:  # every rank agrees, or none enters the collectives
        return {"skipped": "the numbers were wrong on a rank: a wrong kernel is not timed"}
    timer = CudaEventTimer(dev)
    rows = []
    for hidden in TIMING_HIDDEN:
        ctx.phase("timing-workspace", hidden=hidden)
        handles, workspace = _workspace(ctx, comm, max(TIMING_TOKENS), hidden)
        for tokens in TIMING_TOKENS:
            gen = torch.Generator(device=dev).manual_seed(tokens + hidden)
            x = torch.randn(tokens, hidden, generator=gen, device=dev).to(torch.bfloat16)
            residual = torch.randn(tokens, hidden, generator=gen, device=dev).to(torch.bfloat16)
            gamma = torch.randn(hidden, generator=gen, device=dev).to(torch.bfloat16)
            contenders = {"oneshot": _fused(ctx, comm, workspace, x, residual, gamma, True)}
            if tokens > ctx.world_size:  # FlashInfer's two-shot needs more tokens than ranks
                contenders["twoshot"] = _fused(ctx, comm, workspace, x, residual, gamma, False)
            contenders[BASELINE] = _unfused(ctx, x.clone(), residual.clone(), gamma)
            ctx.phase("kernel", case=f"timing {tokens}x{hidden}")
            samples = measure(contenders, group, timer, **TIMING)
            picks = _picks(tokens, hidden, ctx.world_size)
            for cand in contenders:
                if cand != BASELINE:
                    rows.append(
                        {
                            "shape": [tokens, hidden],
                            "dtype": "bfloat16",
                            **compare(samples, cand, BASELINE),
                            "sglang_fuses": tokens <= SGLANG_MAX_TOKENS,
                            "flashinfer_picks": None if picks is None else picks == cand,
                        }
                    )
        ctx.phase("timing-teardown", hidden=hidden)
        torch.cuda.synchronize(dev)
        comm.trtllm_destroy_ipc_workspace_for_all_reduce_fusion(handles, ctx.group)
    return {
        "what": "trtllm_allreduce_fusion kARResidualRMSNorm against NCCL all-reduce + fused_add_rmsnorm",
        "candidate_api": "flashinfer.comm.trtllm_allreduce_fusion (launch_with_pdl, fp32_acc off, as SGLang 0.5.9)",
        "baseline": BASELINE,
        "baseline_api": "torch.distributed.all_reduce (nccl) + flashinfer.norm.fused_add_rmsnorm, in place",
        "timer": timer.name,
        "unit": "ms per call",
        **TIMING,
        "world_size": ctx.world_size,
        "sglang_max_tokens": SGLANG_MAX_TOKENS,
        "topology": topology(ctx.devices[: ctx.world_size]) if ctx.rank == 0 else None,
        "rows": rows,
    }
