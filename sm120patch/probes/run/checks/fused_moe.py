"""Run check: FlashInfer's CUTLASS fused MoE (SGLang's flashinfer_cutlass backend) against torch.

A small MoE (4 experts, top-2 routing, SwiGLU) through `flashinfer.fused_moe.cutlass_fused_moe`,
which picks its JIT module from the GPU it runs on (fused_moe_90, fused_moe_100, fused_moe_120):
bf16 everywhere, and NVFP4 weights and activations where the arch has FP4 MMA (SM100, SM12x).
The reference is computed in float32 from the same inputs (for NVFP4: from the dequantized
inputs, the intermediate rounded through FP4 the way the kernel does). The output is poisoned
with NaN first, so a kernel that writes nothing is a mismatch.

Layout facts (read from FlashInfer's own tests, not copied): fc1 holds [w3; w1] per expert,
[E, 2*I, H], and SwiGLU is silu(x @ w1^T) * (x @ w3^T); fc2 is [E, H, I]. NVFP4 packs two e2m1
values a byte (low nibble first) and keeps one e4m3 scale per 16 values in 128x4 swizzled tiles.

Where the check runs bf16 alone (SM90), it builds a reduced module of its own (moe_reduced.py:
FlashInfer's own spec, only the bf16 units and instantiations; 30 of 181 units for 0.6.1) instead
of FlashInfer's whole fused_moe_90 (35 minutes on 16 cores), and puts it where
`get_cutlass_fused_moe_module` looks, so `cutlass_fused_moe` runs it. The result says what was
built and what was not. SM120PATCH_MOE_FULL=1, or an arch with the NVFP4 case, builds FlashInfer's
whole module as a server would.

Executed by harness.py under the target interpreter; never imported by the tool.
"""

import importlib.util
import os
import time
from pathlib import Path

BACKEND = None  # one process: no process group
EXPERTS, TOP_K, HIDDEN, INTER = 4, 2, 256, 256
TOKENS = (1, 64)
ATOL = {"bfloat16": 0.05, "nvfp4": 0.2}  # the same for rtol
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP8_MAX, FP4_MAX = 448.0, 6.0


def _module_arch(ctx):
    import torch

    major, minor = torch.cuda.get_device_capability(ctx.device)
    return major, f"{major * 10 + minor}"


GENERATORS = {"90": "gen_cutlass_fused_moe_sm90_module"}  # archs whose check runs bf16 only
REDUCED = {}  # the record of the reduced build, once made in this process


def _reduced_module(arch):
    """Build (or load) the reduced module and make FlashInfer's fused-MoE entry point use it."""
    import flashinfer.fused_moe.core as core
    import flashinfer.jit.fused_moe as jit_fused_moe

    here = Path(__file__).resolve().parent / "moe_reduced.py"
    spec = importlib.util.spec_from_file_location("sm120patch_moe_reduced", here)
    reduced = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reduced)
    full = getattr(jit_fused_moe, GENERATORS[arch])()  # FlashInfer's own spec (it generates the sources)
    work = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE") or Path.home()) / "sm120patch-moe-reduced" / arch
    module, record = reduced.build_and_load(full, work, f"fused_moe_{arch}_sm120patch_bf16")

    class Built:
        def build_and_load(self):
            return module

    setattr(core, GENERATORS[arch], lambda use_fast_build=False: Built())
    if hasattr(core.get_cutlass_fused_moe_module, "cache_clear"):
        core.get_cutlass_fused_moe_module.cache_clear()
    REDUCED.update(record)
    return record


def _use_reduced(major, arch):
    return arch in GENERATORS and major not in (10, 12) and os.environ.get("SM120PATCH_MOE_FULL") != "1"


def prepare(ctx):
    """Build (JIT) or load the fused-MoE module for this GPU (and the FP4 quantizer where used)."""
    import torch
    from flashinfer.fused_moe.core import get_cutlass_fused_moe_module

    torch.cuda.set_device(ctx.device)
    major, arch = _module_arch(ctx)
    if _use_reduced(major, arch):
        record = _reduced_module(arch)
        get_cutlass_fused_moe_module(arch)
        return {"module": record["module"], "reduced": record}
    get_cutlass_fused_moe_module(arch)
    if major in (10, 12):
        from flashinfer import fp4_quantize

        fp4_quantize(torch.ones(128, 64, dtype=torch.bfloat16, device="cuda"), torch.ones(1, device="cuda"))
    return {"module": f"fused_moe_{arch}"}


def _built(major, arch):
    """What the api line says about the module the check ran."""
    if not REDUCED:
        return f"fused_moe_{arch}"
    r = REDUCED
    inst = sum(b.get("kept", 0) for b in r["built"] if b["file"] != "cutlass_fused_moe_instantiation.cu")
    return (
        f"fused_moe_{arch} reduced to bf16: {r['units']} of {r['of_units']} units built "
        f"({inst} bf16 GEMM instantiations), {len(r['dropped'])} not built, {r['stubbed_symbols']} symbols stubbed"
    )


def _routing(logits):
    import torch

    weights, experts = torch.topk(torch.softmax(logits.float(), dim=-1), TOP_K, dim=-1)
    return weights / weights.sum(-1, keepdim=True), experts.to(torch.int32)


def _moe_reference(x, w31, w2, weights, experts, round_inter=None):
    """float32 MoE: each token through its top-k experts, SwiGLU, weighted sum."""
    import torch

    x, out = x.float(), torch.zeros(x.shape[0], w2.shape[1], device=x.device)
    for e in range(w31.shape[0]):
        rows, slot = torch.where(experts == e)
        if rows.numel() == 0:
            continue
        w3, w1 = w31[e].float().chunk(2, dim=0)
        inter = torch.nn.functional.silu(x[rows] @ w1.t()) * (x[rows] @ w3.t())
        if round_inter is not None:
            inter = round_inter(inter)
        out[rows] += weights[rows, slot, None] * (inter @ w2[e].float().t())
    return out


def _unswizzle(sf, rows, cols):
    """e4m3 scales from 128x4 swizzled tiles [row tile, col tile, 32, 4, 4] to a [rows, cols] matrix."""
    t = sf.reshape(rows // 128, cols // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return t.reshape(rows, cols)


def _dequant_fp4(packed, sf, global_scale):
    """NVFP4 [M, K/2] bytes + swizzled scales -> float32 [M, K]."""
    import torch

    m, k = packed.shape[0], packed.shape[1] * 2
    nibbles = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(m, k).long()
    table = torch.tensor(E2M1, device=packed.device)
    vals = table[nibbles & 7] * torch.where((nibbles & 8) > 0, -1.0, 1.0)
    scales = _unswizzle(sf.view(torch.uint8).flatten(), m, k // 16).view(torch.float8_e4m3fn).float()
    return (vals.reshape(m, k // 16, 16) * (scales / global_scale).unsqueeze(-1)).reshape(m, k)


def _quant_fp4(t, global_scale):
    from flashinfer import fp4_quantize

    return fp4_quantize(t.contiguous(), global_scale)


def _case_bf16(ctx, fused_moe, x, w31, w2, weights, experts):
    import torch

    out = torch.full((x.shape[0], HIDDEN), float("nan"), dtype=torch.bfloat16, device=x.device)
    fused_moe.cutlass_fused_moe(x, experts, weights, w31, w2, torch.bfloat16, quant_scales=None, output=out)
    return out, _moe_reference(x, w31, w2, weights, experts)


def _case_nvfp4(ctx, fused_moe, x, w31, w2, weights, experts):
    import torch

    dev, one = x.device, torch.ones(1, device=x.device)
    w31_q, w2_q, w31_sf, w2_sf, w31_gs, w2_gs, w31_d, w2_d = [], [], [], [], [], [], [], []
    for e in range(EXPERTS):
        for w, q, sf, gs, d in ((w31[e], w31_q, w31_sf, w31_gs, w31_d), (w2[e], w2_q, w2_sf, w2_gs, w2_d)):
            g = (FP8_MAX * FP4_MAX / w.float().abs().max()).reshape(1)
            wq, wsf = _quant_fp4(w, g)
            q.append(wq)
            sf.append(wsf.view(torch.float8_e4m3fn).reshape(w.shape[0], w.shape[1] // 16))
            gs.append(g)
            d.append(_dequant_fp4(wq, wsf, g))
    w31_gs, w2_gs = torch.cat(w31_gs), torch.cat(w2_gs)
    quant_scales = [
        one,
        torch.stack(w31_sf).view(torch.int32),
        1.0 / (one * w31_gs),
        one,
        torch.stack(w2_sf).view(torch.int32),
        1.0 / (one * w2_gs),
    ]
    out = torch.full((x.shape[0], HIDDEN), float("nan"), dtype=torch.bfloat16, device=dev)
    fused_moe.cutlass_fused_moe(
        x,
        experts,
        weights,
        torch.stack(w31_q).contiguous().view(torch.long),
        torch.stack(w2_q).contiguous().view(torch.long),
        torch.bfloat16,
        quant_scales=quant_scales,
        output=out,
    )

    def through_fp4(t):
        q, sf = _quant_fp4(t.to(torch.bfloat16), one)
        return _dequant_fp4(q, sf, one)

    x_d = _pad_through_fp4(x, through_fp4)
    ref = _moe_reference(x_d, torch.stack(w31_d), torch.stack(w2_d), weights, experts, _rows_through_fp4(through_fp4))
    return out, ref


def _pad_through_fp4(t, through_fp4):
    """The swizzled scale layout works on 128-row tiles: pad, round, cut."""
    import torch

    rows = -(-t.shape[0] // 128) * 128
    padded = torch.zeros(rows, t.shape[1], dtype=t.dtype, device=t.device)
    padded[: t.shape[0]] = t
    return through_fp4(padded)[: t.shape[0]]


def _rows_through_fp4(through_fp4):
    return lambda t: _pad_through_fp4(t, through_fp4)


def run_rank(ctx):
    import torch
    from flashinfer import fused_moe

    torch.cuda.set_device(ctx.device)
    major, arch = _module_arch(ctx)
    if _use_reduced(major, arch):
        _reduced_module(arch)  # built by prepare: ninja finds it up to date, then it is loaded
    dev = torch.device("cuda", ctx.device)
    kinds = [("bfloat16", _case_bf16)] + ([("nvfp4", _case_nvfp4)] if major in (10, 12) else [])
    cases = []
    for tokens in TOKENS:
        gen = torch.Generator(device=dev).manual_seed(4242 + tokens)
        x = torch.randn(tokens, HIDDEN, generator=gen, device=dev).to(torch.bfloat16)
        w31 = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen, device=dev) / 10).to(torch.bfloat16)
        w2 = (torch.randn(EXPERTS, HIDDEN, INTER, generator=gen, device=dev) / 10).to(torch.bfloat16)
        weights, experts = _routing(torch.randn(tokens, EXPERTS, generator=gen, device=dev))
        for dtype, run in kinds:
            name = f"{dtype}-{tokens}x{HIDDEN}"
            ctx.phase("kernel", case=name)
            start = time.monotonic()
            out, ref = run(ctx, fused_moe, x, w31, w2, weights, experts)
            torch.cuda.synchronize(dev)
            ctx.phase("compare", case=name)
            meta = {
                "shape": [tokens, HIDDEN],
                "dtype": dtype,
                "mode": f"E{EXPERTS} top{TOP_K} I{INTER}",
                "kernel_s": round(time.monotonic() - start, 4),
            }
            cases.append(ctx.compare(name, out, ref, ATOL[dtype], ATOL[dtype], **meta))
    api = f"cutlass_fused_moe ({_built(major, arch)})"
    return {"api": api, "gpu": torch.cuda.get_device_name(dev), "cases": cases, "reduced": REDUCED or None}
