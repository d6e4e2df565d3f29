"""Run check: FlashInfer's RMSNorm on one GPU against a float32 torch reference.

The cheapest module to build and run: it proves the toolchain, the JIT and the GPU work end
to end. Executed by harness.py under the target interpreter; never imported by the tool.
"""

import time

BACKEND = None  # one process: no process group
ROWS, HIDDEN, EPS = 64, 4096, 1e-6
ATOL, RTOL = 0.01, 0.01  # bf16 keeps ~3 significant digits


def prepare(ctx):
    """JIT-build the norm module with one tiny call (the same in every FlashInfer release)."""
    import flashinfer
    import torch

    torch.cuda.set_device(ctx.device)
    one = torch.ones(1, 128, dtype=torch.bfloat16, device="cuda")
    flashinfer.norm.rmsnorm(one, one[0], eps=EPS)
    torch.cuda.synchronize()
    return {"module": "norm"}


def run_rank(ctx):
    import flashinfer
    import torch

    dev = torch.device("cuda", ctx.device)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(ROWS, HIDDEN, generator=gen, device=dev).to(torch.bfloat16)
    w = torch.randn(HIDDEN, generator=gen, device=dev).to(torch.bfloat16)
    name = f"rmsnorm-{ROWS}x{HIDDEN}"
    ctx.phase("kernel", case=name)
    start = time.monotonic()
    y = flashinfer.norm.rmsnorm(x, w, eps=EPS)
    torch.cuda.synchronize(dev)
    ctx.phase("compare", case=name)
    xf = x.float()
    ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()
    meta = {"shape": [ROWS, HIDDEN], "dtype": "bfloat16", "kernel_s": round(time.monotonic() - start, 4)}
    return {
        "api": "flashinfer.norm.rmsnorm",
        "gpu": torch.cuda.get_device_name(dev),
        "cases": [ctx.compare(name, y, ref, ATOL, RTOL, **meta)],
    }
