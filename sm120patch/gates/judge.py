"""What each site is for SM12x: covered by a recipe, open, a candidate, rightly shut, or unknown.

A shut site is a candidate only where the kernels behind it exist for SM12x in the FlashInfer
given. Which kernels are behind a site is read from the code it guards: the words below name the
kernel catalogue's entries (patches/kernels.toml), and each named kernel is judged by the probes'
static rung (its generator's `supported_major_versions`, its source checks) or by the catalogue's
`must_be_absent_on` (a kernel family that does not exist for SM12x: right to stay shut). A site
whose code names no catalogued kernel is `unknown`: reading it is the maintainer's job, and the
sort puts it right after the candidates.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from sm120patch.gates.evaluate import SM12X
from sm120patch.gates.site import CANDIDATE, COVERED, OPEN, SHUT, UNKNOWN, VERDICTS, Site

if TYPE_CHECKING:
    from sm120patch.catalogue.kernels import Kernel
    from sm120patch.probes.environment.flashinfer import FlashInferEnv

# words in the guarded code that name a catalogued kernel (kernel id -> regex, case-insensitive)
KERNEL_WORDS: dict[str, str] = {
    "flashinfer:trtllm_comm": r"allreduce_fusion|ar_fusion|trtllm_allreduce|comm_fusion|trtllm_custom_all_reduce",
    "flashinfer:cutlass_fused_moe_sm120": r"flashinfer_cutlass|cutlass_fused_moe",
    "flashinfer:trtllm_gen_moe": r"flashinfer_trtllm\b|flashinfer_trtllm_routed|trtllm_\w*block_scale_moe|"
    r"trtllm_fp8_per_tensor|trtllm_bf16_moe|trtllm_gen_\w*moe",
    "flashinfer:sparse_mla_sm120": r"sparse_mla",
    "flashinfer:fp4_gemm_b12x": r"\bmm_fp4\b|b12x",
    "flashinfer:gdn_prefill_sm120": r"gdn\w*prefill|chunk_gated_delta_rule",
    "flashinfer:pcie_ipc_comm": r"pcie_ipc",
    "flashinfer:fmha_v2": r"trtllm_mha|fmha_v2",
    "flashinfer:xqa": r"\bxqa\b|trtllm_mha",
}
_RX = {k: re.compile(v, re.I) for k, v in KERNEL_WORDS.items()}


def kernels_behind(site: Site, catalogue: dict[str, Kernel]) -> list[str]:
    """Catalogued kernels whose words appear in the code a site guards (or whose generator it is)."""
    found = [k for k, rx in _RX.items() if k in catalogue and rx.search(site.context)]
    if site.kind == "jit-majors":
        found += [k for k, kern in catalogue.items() if kern.generator == site.function.split(".")[-1]]
    return list(dict.fromkeys(found))


def _shut_to_sm12x(site: Site) -> bool:
    return site.path is not None and not any(a.name in site.path for a in SM12X)


def judge(site: Site, catalogue: dict[str, Kernel], fi: FlashInferEnv | None) -> None:
    """Set the site's verdict and reason."""
    if site.recipe is not None:
        site.verdict = COVERED
        site.reason = f"edited by {site.recipe} ({site.recipe_status} on this tree)"
        return
    if site.path is None:
        site.verdict, site.reason = UNKNOWN, "the test reads the GPU in a way the release's definitions do not say"
        return
    if not _shut_to_sm12x(site):
        out = [a.name for a in SM12X if a.name not in site.path]
        site.verdict = OPEN
        site.reason = "admits SM12x" + (f" except {', '.join(out)}" if out else "")
        return
    site.kernels = kernels_behind(site, catalogue)
    if not site.kernels:
        site.verdict, site.reason = UNKNOWN, "shut to SM12x; the code it guards names no catalogued kernel"
        return
    verdicts = [_kernel_verdict(catalogue[k], fi) for k in site.kernels]
    passed = [(k, why) for k, (ok, why) in zip(site.kernels, verdicts, strict=True) if ok is True]
    failed = [(k, why) for k, (ok, why) in zip(site.kernels, verdicts, strict=True) if ok is False]
    if passed and len(passed) == len(verdicts):
        site.verdict = CANDIDATE
        site.reason = "; ".join(f"{k}: {why}" for k, why in passed)
    elif failed and len(failed) == len(verdicts):
        site.verdict = SHUT
        site.reason = "; ".join(f"{k}: {why}" for k, why in failed)
    else:
        site.verdict = UNKNOWN
        site.reason = "; ".join(f"{k}: {why}" for k, (_, why) in zip(site.kernels, verdicts, strict=True))


def _kernel_verdict(kernel: Kernel, fi: FlashInferEnv | None) -> tuple[bool | None, str]:
    """True: the kernel exists for every SM12x arch; False: for none (the reason); None: unknown."""
    absent = [a for a in SM12X if kernel.absent_on(a)]
    if absent:
        return False, f"no {', '.join(a.name for a in absent)} kernels ({_first_sentence(kernel.why)})"
    if fi is None or not fi.found:
        return None, "no FlashInfer given (--flashinfer) to read its kernels from"
    from sm120patch.probes.static import check_static

    steps = [check_static(kernel, a, fi) for a in SM12X]
    if all(s.result == "pass" for s in steps):
        return True, steps[0].reason
    if all(s.result == "fail" for s in steps):
        return False, steps[0].reason
    return None, "; ".join(f"{a.name}: {s.result}" for a, s in zip(SM12X, steps, strict=True))


def _first_sentence(text: str) -> str:
    flat = " ".join(text.split())
    return flat.split(". ", 1)[0].rstrip(".")


ORDER = {v: i for i, v in enumerate(VERDICTS)}


def sort_key(site: Site) -> tuple[int, str, int]:
    return (ORDER.get(site.verdict, len(ORDER)), site.file, site.line)


def judge_all(sites: list[Site], catalogue: dict[str, Kernel], fi: FlashInferEnv | None) -> list[Site]:
    for s in sites:
        judge(s, catalogue, fi)
    return sorted(sites, key=sort_key)


__all__ = ["CANDIDATE", "COVERED", "OPEN", "SHUT", "UNKNOWN", "judge", "judge_all", "kernels_behind"]
