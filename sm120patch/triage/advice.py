"""Everything diagnose tells the user to do beyond a finding's own next step, added in one place (`add_advice`):
the CLI, guard and tools/fix_score.py all call it, so what is scored is what the user reads.

Besides our own recipes' commands (fixes.py), the releases that fixed a toolchain (versions.py) and the
release's own flag choices (choices.py), the next steps read from the evidence a finding's lines show: the CUDA
major a missing runtime library names (the wheel index that fits), Triton's knobs for a shared-memory limit, the
interface variable for a Gloo/NCCL socket failure. Each is added as a note only when the log shows its cue."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

from sm120patch.catalogue.recipes import Recipe
from sm120patch.triage import fixes
from sm120patch.triage.choices import add_alternatives
from sm120patch.triage.classes import SM12X_CLASSES
from sm120patch.triage.diagnose import Diagnosis, Finding
from sm120patch.triage.versions import add_fixed_versions

Warn = Callable[[str], None]

_CUDA_LIB = re.compile(
    r"\blib(?:cudart|cublas\w*|cusparse\w*|cufft\w*|nvrtc\w*|cudnn\w*|nccl)\.so\.(?P<major>1[2-9])\b"
)
_TORCH_INDEX = {"12": "cu128", "13": "cu130"}
_SMEM = re.compile(r"(?i)out of resource: shared memory|shared memory.{0,40}(?:exceed|limit)|num_stages")
_SOCKET = re.compile(
    r"(?i)\bgloo\b.{0,80}(?:connect|socket|interface|address|timed out)|socket.{0,20}interface|"
    r"\bbootstrap\b.{0,60}(?:socket|connect)|GLOO_SOCKET_IFNAME|NCCL_SOCKET_IFNAME"
)


def _cuda_runtime(text: str, f: Finding, d: Diagnosis) -> str | None:
    m = _CUDA_LIB.search(text)
    if m is None or not re.search(r"(?i)cannot open shared object|not found|no such file|undefined symbol", text):
        return None
    major = m.group("major")
    other = "13" if major == "12" else "12"
    index = _TORCH_INDEX.get(major, f"cu{major}x")
    return (
        f"{m.group(0)} is CUDA {major}'s runtime: a wheel built for CUDA {major} meets an environment without it "
        f"(a CUDA {other} torch?). Check `python -c 'import torch; print(torch.version.cuda)'`, then install the "
        f"package's build for that CUDA (torch itself: https://download.pytorch.org/whl/{index} for CUDA {major}, "
        f"https://download.pytorch.org/whl/{_TORCH_INDEX.get(other, 'cu130')} for CUDA {other})"
    )


_THREADS = re.compile(r"(?i)threads? per block|max_threads|too many (?:resources|threads)|block ?dim|blockDim")
_SM121 = re.compile(r"(?i)sm_?121|compute_121|\b12\.1\b|GB10|DGX Spark")


def _resource_knobs(text: str, f: Finding, d: Diagnosis) -> str | None:
    """A kernel sized for a GPU with more of a per-block resource: the knobs of its config that size it."""
    if f.cls != "resource-limit":
        return None
    if _THREADS.search(text) and not _SMEM.search(text):
        return (
            "the kernel is launched with more threads (or registers) per block than this GPU gives: lower its "
            "block size (threads per block, BLOCK_SIZE / num_warps), or pick another backend for that op"
        )
    if "triton" in text.lower():
        return (
            "a Triton kernel's config asks for more shared memory than this GPU has per block (the limit the log "
            "gives): lower its num_stages (e.g. 2) or its BLOCK_M/BLOCK_N/BLOCK_K, in the kernel's config or "
            "autotune list"
        )
    return (
        "the kernel's tile needs more shared memory than this GPU has per block (SM12x: about 99 KB, SM90/SM100: "
        "227 KB): pick a config with a smaller tile size / block size (e.g. K tile 64 instead of 128) or fewer "
        "pipeline stages (num_stages), or another backend for that op"
    )


# descriptive library labels (classes._LIBRARIES) that name no one package to upgrade
_NOT_A_PACKAGE = re.compile(r"^(?:a |an |another |the |CUDA math|quantization kernels)|\s")
_FRAMEWORKS = ("vllm", "sglang", "tensorrt_llm")


def _upgrade(text: str, f: Finding, d: Diagnosis) -> str | None:
    """An SM12x path or binary missing from the library the frames name: later releases add archs."""
    if f.cls not in ("arch-path-unsupported", "binary-lacks-arch", "kernel-fault", "resource-limit"):
        return None
    lib = f.details.get("library", "")
    named = [n for n in (lib.split(".")[0] if lib and not _NOT_A_PACKAGE.search(lib) else "", d.framework or "") if n]
    if not named or named[0] == "torch":
        return None
    names = " and ".join(dict.fromkeys(named))
    return (
        f"upgrade {names} to the newest release (pip install -U, or the project's newest image): SM12x "
        "kernels and paths are added release by release; check its release notes or issues for sm_120/sm_121"
    )


def _rebuild(text: str, f: Finding, d: Diagnosis) -> str | None:
    """A binary without this GPU's arch: a build from source needs the arch in its list (CMake or torch)."""
    if f.cls != "binary-lacks-arch":
        return None
    spark = bool(_SM121.search(text) or _SM121.search(str((d.gpu.get("sm12x_evidence") or {}).get("line", ""))))
    arch, dotted, cuda = ("121", "12.1", "12.9") if spark else ("120", "12.0", "12.8")
    return (
        f"built from source (or a wheel built elsewhere)? rebuild with this GPU's arch in the build's list, with "
        f'CUDA >= {cuda}: CMake projects -DCMAKE_CUDA_ARCHITECTURES={arch} (e.g. "89;{arch}" to keep others), '
        f'PyTorch extensions (setup.py) TORCH_CUDA_ARCH_LIST="{dotted}" then pip install --no-build-isolation .'
    )


_FA3 = re.compile(r"(?i)hopper|sm_?90|\bFA3\b|flash_attn_interface|flash[-_ ]?attention[-_ ]?3|fa3")


def _flash_attention_3(text: str, f: Finding, d: Diagnosis) -> str | None:
    """FlashAttention 3 is a Hopper (SM90) build; FlashAttention 2 runs on SM12x."""
    if f.cls not in ("arch-path-unsupported", "binary-lacks-arch") or f.details.get("library") != "flash_attn":
        return None
    if not _FA3.search(text):
        return None
    return (
        "FlashAttention 3 (flash_attn_interface, built from hopper/) is a Hopper-only (SM90) path: on SM12x use "
        "FlashAttention 2 (the flash-attn 2.x wheel, FA2), or the framework's other attention backend (PyTorch SDPA)"
    )


def _xformers(text: str, f: Finding, d: Diagnosis) -> str | None:
    """xformers' kernels missing for the arch: frameworks run without it."""
    if f.cls not in SM12X_CLASSES or f.details.get("library") != "xformers":
        return None
    return (
        "xformers has no kernels for this GPU in this build: install an xformers built for CUDA 12.8+ (the one "
        "matching your torch), or uninstall xformers (pip uninstall xformers) so the framework falls back to "
        "PyTorch SDPA"
    )


_FLASHINFER_JIT = re.compile(r"(?i)flashinfer")


def _flashinfer_jit(text: str, f: Finding, d: Diagnosis) -> str | None:
    """FlashInfer's JIT builds SM12x kernels as compute_120f/121a, which need a newer nvcc than 12.8."""
    if f.cls != "toolchain-lacks-arch" or not _FLASHINFER_JIT.search(text):
        return None
    return (
        "FlashInfer's JIT builds its SM12x kernels for compute_120f (compute_121a on DGX Spark), which needs "
        "CUDA >= 12.9's nvcc: put a CUDA 12.9 or 13 toolkit first (CUDA_HOME, PATH) or use a FlashInfer with "
        "prebuilt kernels (flashinfer-jit-cache)"
    )


def _socket(text: str, f: Finding, d: Diagnosis) -> str | None:
    if f.cls != "communication" or not _SOCKET.search(text):
        return None
    return (
        "the ranks reach each other over a socket on the wrong interface: set GLOO_SOCKET_IFNAME and "
        "NCCL_SOCKET_IFNAME to the one that connects them (e.g. eth0; `ip -br addr` lists them)"
    )


Rule = Callable[[str, Finding, Diagnosis], "str | None"]
RULES: tuple[Rule, ...] = (
    _flash_attention_3,
    _xformers,
    _resource_knobs,
    _rebuild,
    _flashinfer_jit,
    _cuda_runtime,
    _socket,
    _upgrade,
)


def add_evidence_advice(result: Diagnosis) -> None:
    """A note per rule whose cue the finding's line, its details or the fatal lines near it show."""
    around = [e.line for e in result.unnamed_errors]
    for f in result.causes:
        text = " ".join([f.line, *f.details.values(), *around])
        for rule in RULES:
            note = rule(text, f, result)
            if note and note not in f.notes:
                f.notes.append(note)


def add_advice(
    result: Diagnosis, recipes: Sequence[Recipe], target: Path | None = None, warn: Warn | None = None
) -> Diagnosis:
    """Add every piece of advice to the diagnosis (in place; returned for chaining). Advice is a bonus: a step
    that fails is said through `warn` (one line, e.g. to stderr) and never hides the diagnosis."""

    def step(what: str, run: Callable[[], object]) -> None:
        try:
            run()
        except Exception as e:  # advice is a bonus: it must never hide the diagnosis
            if warn is not None:
                warn(f"could not {what} ({e})")

    if result.causes:
        if target is None:
            step("check which sm120patch recipe fixes this", lambda: fixes.advise_without_target(result, recipes))
        else:
            step("check which sm120patch recipe fixes this", lambda: fixes.advise(result, recipes, target))
    step("add the releases that fixed it", lambda: add_fixed_versions(result))
    step("add the advice from the log's evidence", lambda: add_evidence_advice(result))
    if target is not None:
        step("read the release's flag choices", lambda: add_alternatives(result, target))
    return result
