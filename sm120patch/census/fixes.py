"""What to install when a distribution has no code for a GPU: one line, a command or a build flag.

Known packages get the fix their upstream documents (a wheel index that carries the arch,
a JIT fallback); anything else that builds through torch.utils.cpp_extension gets the
TORCH_CUDA_ARCH_LIST rebuild. The arch list asked for follows what the package already
used for other GPUs: arch-specific (`a`) SASS elsewhere means its kernels use
arch-specific instructions, so the rebuild asks for `12.0a`/`12.1a`; otherwise a plain
`12.0` (whose SASS also runs on 12.1, rules [BIN]).
"""

from __future__ import annotations

from collections.abc import Sequence

from sm120patch.arch import Arch

_TORCH_INDEX = "https://download.pytorch.org/whl/cu128"  # first CUDA with sm_120 (torch >= 2.7)

# distribution -> fix template ({arch}, {archs}, {list}, {dist}, {version} filled in)
_KNOWN = {
    "torch": "pip install --upgrade torch --index-url " + _TORCH_INDEX + " (or newer cuXYZ; torch >= 2.7 carries "
    "sm_120 SASS, which runs on 12.0 and 12.1), then python -c 'import torch; print(torch.cuda.get_arch_list())'",
    "torchvision": "pip install --upgrade torchvision --index-url " + _TORCH_INDEX + " (the torch index's build, "
    "matching your torch)",
    "torchaudio": "pip install --upgrade torchaudio --index-url " + _TORCH_INDEX + " (matching your torch)",
    "flashinfer-jit-cache": "FlashInfer JIT-compiles any module its AOT cache does not supply: pip uninstall "
    "flashinfer-jit-cache (needs a CUDA toolkit that builds for {arch}; see 'build for' above), or install the "
    "flashinfer-jit-cache built for your CUDA from https://flashinfer.ai/whl/",
    "flashinfer-cubin": "these are prebuilt trtllm-gen/cubin kernels; FlashInfer uses them only for the GPUs they "
    "name: pick a FlashInfer backend that JIT-compiles for {arch} (or a flashinfer-cubin release that ships {arch})",
    "sglang-kernel": "install an sglang-kernel build that carries {arch} (check with `sm120patch preflight`), or build "
    "it from source (sglang's sgl-kernel/: python -m uv build --wheel -Cbuild-dir=build .) with a CUDA toolkit "
    "that emits {arch}",
    "sgl-kernel": "install sglang-kernel (sgl-kernel's successor) in a build that carries {arch}, or build sgl-kernel "
    "from source with a CUDA toolkit that emits {arch}",
    "vllm": 'build vLLM from source for your GPU: TORCH_CUDA_ARCH_LIST="{list}" pip install --no-build-isolation -e . '
    "(in a vLLM checkout, with torch for CUDA >= 12.8 installed)",
    "flash-attn": 'TORCH_CUDA_ARCH_LIST="{list}" pip install --no-build-isolation --no-binary flash-attn '
    "flash-attn=={version}",
    "xformers": 'TORCH_CUDA_ARCH_LIST="{list}" pip install --no-build-isolation --no-binary xformers '
    "xformers=={version}",
}


# What the user meets instead of the CUDA error, where the package picks its images per GPU itself
_NOTES = {
    "flashinfer-cubin": "FlashInfer picks these cubins by the GPU they are named for (Sm100a, sm100f, ...), so "
    "missing ones are expected on other GPUs: a trtllm-gen backend asked for on {arch} stops with its own "
    "'Unsupported architecture' (diagnose: trtllm-gen-unsupported-arch) before any CUDA error; backends that "
    "JIT-compile for {arch} do not use these",
}


def note_for(dist: str, gpu: Arch) -> str:
    """How the failure shows instead, for packages that choose their images themselves ("" if none)."""
    return _NOTES.get(dist, "").format(arch=gpu.name)


def arch_list(gpu: Arch, carried_sass: Sequence[str]) -> str:
    """TORCH_CUDA_ARCH_LIST for a rebuild that covers `gpu` (and its family, for SM12x)."""
    specific = any(n.endswith("a") for n in carried_sass)
    members = ["12.0", "12.1"] if gpu.major == 12 else [f"{gpu.major}.{gpu.minor}"]
    return ";".join(m + ("a" if specific else "") for m in members)


def fix_for(dist: str, version: str, gpu: Arch, carried_sass: Sequence[str]) -> str:
    """The fix line for `dist` lacking code for `gpu`."""
    if dist.startswith("nvidia-"):
        return f"install the {dist} wheel of a CUDA release that supports {gpu.name} (CUDA >= 12.8 for SM12x)"
    template = _KNOWN.get(
        dist,
        'rebuild it for your GPU: TORCH_CUDA_ARCH_LIST="{list}" pip install --no-build-isolation --no-binary {dist} '
        "{dist}=={version} (torch extensions), or install a wheel/index that carries {arch}",
    )
    return template.format(arch=gpu.name, list=arch_list(gpu, carried_sass), dist=dist, version=version)
