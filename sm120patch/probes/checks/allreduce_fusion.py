"""Run check: FlashInfer's allreduce + residual add + RMSNorm fusion across the ranks, as SGLang calls it.

SGLang's fused path calls `trtllm_allreduce_fusion` with pattern kARResidualRMSNorm on an IPC
workspace from `trtllm_create_ipc_workspace_for_all_reduce_fusion`. We do the same on small
shapes that take both of its kernels, the one-shot Lamport kernel (few tokens) and the two-shot
kernel (many tokens), and compare with an NCCL all-reduce + residual add + RMSNorm computed in
float32. Outputs are poisoned with NaN first, so a kernel that launches and writes nothing (an
empty body compiled for the arch) is a mismatch, never a pass. The workspace is CUDA IPC
memory (cudaMalloc + IPC handles), never multicast or symmetric memory.

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


def prepare(ctx):
    """Build (JIT) or load the trtllm_comm module once, before the ranks start."""
    import torch
    from flashinfer.comm import trtllm_ar

    torch.cuda.set_device(ctx.device)
    trtllm_ar.get_trtllm_comm_module()
    return {"module": "trtllm_comm"}


def _workspace(ctx, comm):
    kwargs = {"group": ctx.group}
    params = inspect.signature(comm.trtllm_create_ipc_workspace_for_all_reduce_fusion).parameters
    if "use_symm_dev_mem" in params:
        kwargs["use_symm_dev_mem"] = False  # plain IPC buffers: no symmetric memory, no multicast
    made = comm.trtllm_create_ipc_workspace_for_all_reduce_fusion(
        ctx.rank, ctx.world_size, MAX_TOKENS, HIDDEN, **kwargs
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
    }
