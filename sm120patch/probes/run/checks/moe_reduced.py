"""A fused-MoE JIT module of only what the run check launches, selected from FlashInfer's own at probe time.

FlashInfer's `gen_cutlass_fused_moe_sm{90,100,120}_module()` lists ~180 CUDA units (every dtype,
weight format and tile shape the CUTLASS MoE supports; 35 minutes on 16 cores for SM90). The check
runs bf16 activations and weights only, so this keeps, from the spec FlashInfer itself returns
(same flags, include paths and generated sources):

- every generated instantiation whose types are all bf16 (every tile shape and epilogue, so any
  tactic FlashInfer picks for bf16 is there), each generated file filtered in its own copy;
- the bf16 x bf16 GEMM runner (`moe_gemm_kernels_bf16_bf16.cu`) and the fused-MoE runner's bf16
  instantiation (a filtered copy of `cutlass_fused_moe_instantiation.cu`);
- every other unit as it is (the binding, routing, common code);

and drops the rest (other dtypes' runners, FP8 block-scale GEMM, non-bf16 instantiations). What
the binding still references from the dropped units is defined by a generated stub that aborts
with the symbol's name, so the module loads; a call into it (a dtype the check never asks for)
dies loudly instead of computing anything. Nothing here is FlashInfer's code: it reads and
filters FlashInfer's own files in the target interpreter, and every choice is in `plan`'s result.

Loaded by fused_moe.py under the target interpreter (and by the unit tests, which need no torch).
"""

import dataclasses
import re
import subprocess
from pathlib import Path

KEEP_TYPE = "bfloat16"
# any element type but bf16 (searched with "bfloat16" taken out): FlashInfer spells them many ways
OTHER_TYPES = re.compile(r"half|float|double|fp8|fp4|e4m3|e5m2|e2m1|ue8m0|uint\d|int\d|uint4b|mxf\d|nvf\d", re.I)
# one instantiation in a generated file: an INSTANTIATE_*(...) macro (inside its #if/#endif) or an
# explicit `template void ...;`
INSTANCE = re.compile(r"(#if[^\n]*\n\s*)?(INSTANTIATE_\w+\s*\([^;]*\)\s*;|template\s+void\s[^;]*;)(\s*\n\s*#endif)?")
RUNNER_LINE = re.compile(r"^\s*template\s+class\s+CutlassMoeFCRunner\s*<([^;]*)>\s*;", re.M)
RUNNER_FILE = "cutlass_fused_moe_instantiation.cu"
GEMM_RUNNER = re.compile(r"^moe_gemm_kernels_(\w+?)_(\w+)\.cu$")
DROP_FILES = ("fp8_blockscale_gemm.cu",)


def _types(text: str) -> str:
    """The template/macro argument text of one instantiation, without the function's parameter list."""
    m = re.search(r"INSTANTIATE_\w+\s*\(([^;]*)\)", text)
    if m:
        return m.group(1)
    m = re.search(r"template\s+void\s+\w+\s*<(.*?)>\s*\(", text, re.S)
    return m.group(1) if m else text


def keeps(instance: str) -> bool:
    """An instantiation the bf16 check can launch: bf16, and no other element type."""
    args = _types(instance)
    return KEEP_TYPE in args and not OTHER_TYPES.search(args.replace("bfloat16", ""))


def filter_generated(text: str) -> tuple[str, int, int]:
    """A generated file with only the instantiations `keeps` accepts: (text, kept, of)."""
    found = list(INSTANCE.finditer(text))
    if not found:
        return text, 0, 0
    head, tail = text[: found[0].start()], text[found[-1].end() :]
    kept = [m.group(0) for m in found if keeps(m.group(0))]
    return head + "\n\n".join(kept) + tail, len(kept), len(found)


def filter_runner(text: str) -> tuple[str, int, int]:
    """cutlass_fused_moe_instantiation.cu with only CutlassMoeFCRunner<bf16, bf16>: (text, kept, of)."""
    found = list(RUNNER_LINE.finditer(text))
    kept = sum(keeps(f"INSTANTIATE_X({m.group(1)});") for m in found)

    def one(m: re.Match) -> str:
        return m.group(0) if keeps(f"INSTANTIATE_X({m.group(1)});") else "// sm120patch: not built"

    return RUNNER_LINE.sub(one, text), kept, len(found)


QUOTED_INCLUDE = re.compile(r'^(\s*#\s*include\s*)"([^"]+)"', re.M)


def _anchor_includes(text: str, folder: Path) -> str:
    """A copy lives elsewhere: its `#include "x"` that meant a file beside the original names it in full."""
    return QUOTED_INCLUDE.sub(
        lambda m: f'{m.group(1)}"{folder / m.group(2)}"' if (folder / m.group(2)).is_file() else m.group(0), text
    )


def plan(sources: list[Path], out_dir: Path) -> dict:
    """Which of FlashInfer's units to build, as they are or as a filtered copy in `out_dir`.

    Returns {"sources": [...], "built": [{"file", "kept", "of"}], "dropped": [file names]}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    keep: list[Path] = []
    built: list[dict] = []
    dropped: list[str] = []
    for src in sources:
        name = src.name
        gemm = GEMM_RUNNER.match(name)
        if name in DROP_FILES or (gemm and gemm.groups() != ("bf16", "bf16")):
            dropped.append(name)
            continue
        if name.endswith(".generated.cu") or name == RUNNER_FILE:
            text = src.read_text(encoding="utf-8")
            new, kept, of = (filter_runner if name == RUNNER_FILE else filter_generated)(text)
            if kept == 0:
                dropped.append(name)
                continue
            new = _anchor_includes(new, src.parent)
            copy = out_dir / src.parent.name / name
            copy.parent.mkdir(parents=True, exist_ok=True)
            if not copy.is_file() or copy.read_text(encoding="utf-8") != new:
                copy.write_text(new, encoding="utf-8")
            keep.append(copy)
            built.append({"file": name, "kept": kept, "of": of})
            continue
        keep.append(src)
        built.append({"file": name})
    return {"sources": keep, "built": built, "dropped": dropped}


def stub_source(symbols: list[str]) -> str:
    """C++ (top-level asm) defining each symbol as a function that aborts naming it; vtables and
    typeinfo as zeroed objects. Never called by the bf16 check."""
    lines = [
        "#include <cstdio>",
        "#include <cstdlib>",
        'extern "C" __attribute__((visibility("hidden"), noreturn, used)) void sm120patch_not_built(const char* s) {',
        '  std::fprintf(stderr, "sm120patch reduced fused-MoE module: %s was not built\\n", s);',
        "  std::abort();",
        "}",
    ]
    for i, sym in enumerate(symbols):
        if sym.startswith(("_ZTV", "_ZTI", "_ZTS", "_ZTT")):
            body = f".data\n.globl {sym}\n.type {sym},@object\n.size {sym},256\n{sym}:\n.zero 256\n.text"
        else:
            body = (
                f".text\n.globl {sym}\n.type {sym},@function\n{sym}:\n"
                f"leaq .Lsm120patch_{i}(%rip), %rdi\njmp sm120patch_not_built\n"
                f'.section .rodata\n.Lsm120patch_{i}:\n.asciz "{sym}"\n.text'
            )
        lines.append(f'asm(R"sm120patch(\n{body}\n)sm120patch");')
    return "\n".join(lines) + "\n"


def missing_symbols(so_path: Path) -> list[str]:
    """The TensorRT-LLM symbols the linked module still needs from units this build dropped."""
    out = subprocess.run(["nm", "-D", "--undefined-only", str(so_path)], capture_output=True, text=True, check=True)
    syms = [line.split()[-1] for line in out.stdout.splitlines() if line.strip()]
    return sorted({s.split("@")[0] for s in syms if "tensorrt_llm" in s})


def build_and_load(full_spec, work: Path, name: str):  # noqa: ANN001, ANN201
    """Build the reduced module (FlashInfer's own JIT, ninja), stub what it dropped, load it.
    Returns (module, record): record says what was built and what was not."""
    chosen = plan(list(full_spec.sources), work / "sources")
    spec = dataclasses.replace(full_spec, name=name, sources=chosen["sources"])
    spec.write_ninja()
    spec.build(verbose=False)
    symbols = missing_symbols(spec.jit_library_path)
    if symbols:
        stub = work / "sources" / "sm120patch_not_built_stubs.cpp"
        text = stub_source(symbols)
        if not stub.is_file() or stub.read_text() != text:
            stub.write_text(text)
        spec = dataclasses.replace(full_spec, name=name, sources=[*chosen["sources"], stub])
        spec.write_ninja()
        spec.build(verbose=False)
    record = {
        "module": name,
        "built": chosen["built"],
        "dropped": chosen["dropped"],
        "of_units": len(full_spec.sources),
        "units": len(chosen["sources"]),
        "stubbed_symbols": len(symbols),
    }
    return spec.load(spec.jit_library_path), record
