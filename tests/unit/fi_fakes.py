"""Small fake FlashInfer trees and CUDA binaries for the probe tests (our own code, not upstream's)."""

from __future__ import annotations

import struct
from pathlib import Path

COMM = """
import os

MAJORS = {majors}


def _flags(supported_major_versions):
    arch = os.environ.get("FLASHINFER_CUDA_ARCH_LIST", "")
    majors = [int(a.split(".")[0]) for a in arch.split()]
    if not [m for m in majors if m in supported_major_versions]:
        raise RuntimeError(
            f"No supported CUDA architectures found for major versions {{supported_major_versions}}."
        )
    return ["-gencode"]


class JitSpec:
    name = "trtllm_comm"


def gen_trtllm_comm_module():
    _flags(supported_major_versions={gate})
    return JitSpec()
"""


# Host-code stand-ins for the files kernels.toml's source checks read: the shape of the facts
# (a launcher that clamps its cluster to the device, or one that fixes it at 8), not FlashInfer code.
CLAMPED = "int launch() {\n  int max_cluster = GetMaxClusterSize(kernel_ptr, 128);\n  return max_cluster;\n}\n"
FIXED_8 = "int launch() {\n  int cluster_size;\n  cluster_size = 8;\n  return cluster_size;\n}\n"
STRIDE_OK = "void set(P& p, int i) { p.lamport_peer_comm_buffer_ptrs[i + MAX_RANKS_PER_NODE] = q; }\n"
STRIDE_BAD = "void set(P& p, int i, int tp_size) { p.lamport_peer_comm_buffer_ptrs[i + tp_size] = q; }\n"
GUARD_OPEN = "#if (defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900))\n#endif\n"
GUARD_SHUT = "#if (defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && (__CUDA_ARCH__ < 1200))\n#endif\n"
HOST_FILES = {
    "data/include/flashinfer/comm/trtllm_allreduce_fusion.cuh": (CLAMPED, FIXED_8),
    "data/include/flashinfer/comm/trtllm_moe_allreduce_fusion.cuh": (CLAMPED, FIXED_8),
    "data/include/flashinfer/comm/trtllm_allreduce.cuh": (CLAMPED + GUARD_OPEN, FIXED_8 + GUARD_SHUT),
    "data/csrc/trtllm_allreduce.cu": (STRIDE_OK, STRIDE_BAD),
}


def make_tree(
    root: Path,
    gate: str = "[9, 10]",
    majors: str = "[9, 10, 12]",
    version: str = "0.6.1",
    layout: str = "wheel",
    host: str = "fixed",
) -> Path:
    """A fake FlashInfer: `wheel` (package + dist-info + _build_meta), or `repo` (version.txt).
    `host`: "fixed" (the PR 3903 facts hold), "broken" (a fixed cluster of 8, the old stride)
    or "absent" (no host files)."""
    pkg = root / "flashinfer"
    (pkg / "jit").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "jit" / "__init__.py").write_text("")
    (pkg / "jit" / "comm.py").write_text(COMM.format(gate=gate, majors=majors))
    if host != "absent":
        for rel, (good, bad) in HOST_FILES.items():
            (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
            (pkg / rel).write_text(good if host == "fixed" else bad)
    if layout == "wheel":
        (pkg / "_build_meta.py").write_text(f'__version__ = "{version}"\n')
        info = root / f"flashinfer_python-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Name: flashinfer-python\nVersion: {version}\n")
    else:
        (root / "version.txt").write_text(version + "\n")
    return root


def elf64_header(machine: int, flags: int, abiversion: int, shoff: int = 0, shnum: int = 0, shstrndx: int = 0) -> bytes:
    ident = b"\x7fELF" + bytes([2, 1, 1, 0x41 if machine == 190 else 0, abiversion]) + b"\0" * 7
    return ident + struct.pack("<HHIQQQIHHHHHH", 2, machine, 1, 0, 0, shoff, flags, 64, 0, 0, 64, shnum, shstrndx)


def cubin(sm: int, abiversion: int = 8) -> bytes:
    flags = (sm << 8) | 0x02 if abiversion >= 8 else sm | 0x500
    return elf64_header(190, flags, abiversion) + b"\0" * 32


def fatbin(entries: list[tuple[int, int, int]]) -> bytes:
    """A fatbin container; entries are (kind, sm, flags) with a 16-byte dummy payload."""
    body = b""
    for kind, sm, flags in entries:
        header = struct.pack("<HHIQIIHHIIIQ", kind, 0x101, 64, 16, 0, 0, 8, 1, sm, 0, 0, flags)
        header += b"\0" * (64 - len(header))
        body += header + b"\x7fELF" + b"\0" * 12
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def host_so(fat: bytes) -> bytes:
    """An x86-64 ELF with a `.nv_fatbin` section holding `fat`."""
    names = b"\0.shstrtab\0.nv_fatbin\0"
    data_off = 64
    names_off = data_off + len(fat)
    shoff = (names_off + len(names) + 7) // 8 * 8
    out = bytearray(elf64_header(62, 0, 0, shoff=shoff, shnum=3, shstrndx=1))
    out += fat + names
    out += b"\0" * (shoff - len(out))

    def sh(name: int, typ: int, off: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, typ, 0, 0, off, size, 0, 0, 1, 0)

    out += sh(0, 0, 0, 0) + sh(1, 3, names_off, len(names)) + sh(11, 1, data_off, len(fat))
    return bytes(out)


# --- a fake FlashInfer whose module the build rung can really compile (tiny kernels, seconds) -----

BUILD_COMM = """
import os

class JitSpec:
    name = "trtllm_comm"

    def get_compile_commands(self):
        here = os.path.dirname(os.path.abspath(__file__))
        data = os.path.join(here, "..", "data")
        arch = os.environ["FLASHINFER_CUDA_ARCH_LIST"].split()[0]
        major, minor = arch.split(".")
        code = f"{{major}}{{minor}}"
        gencode = f"-gencode=arch=compute_{{code}},code=sm_{{code}}"
        nvcc = os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
        out = []
        for name in ("fake_comm.cu", "fake_other.cu"):
            src = os.path.normpath(os.path.join(data, "csrc", name))
            inc = os.path.normpath(os.path.join(data, "include"))
            cmd = f"{{nvcc}} -c {{src}} -isystem {{inc}} {{gencode}} -O3 -o /nonexistent/x.o"
            out.append({{"file": src, "command": cmd}})
        return out


def _flags(supported_major_versions):
    arch = os.environ.get("FLASHINFER_CUDA_ARCH_LIST", "")
    if int(arch.split(".")[0]) not in supported_major_versions:
        raise RuntimeError(
            f"No supported CUDA architectures found for major versions {{supported_major_versions}}."
        )


def gen_trtllm_comm_module():
    _flags(supported_major_versions={gate})
    return JitSpec()
"""

# Our own tiny kernels in the shape of the failure: a template whose body only exists below
# __CUDA_ARCH__ 1200 (what FlashInfer <= 0.6.16 did to its Lamport kernels), or for every arch.
BODY_GUARDED = """#pragma once
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 1200)
#define FAKE_BODY(p, n) p[n] = p[n] * 2.0f + 1.0f;
#else
#define FAKE_BODY(p, n)
#endif
"""
BODY_OPEN = """#pragma once
#define FAKE_BODY(p, n) p[n] = p[n] * 2.0f + 1.0f;
"""
FAKE_COMM_CU = """#include <fake/body.cuh>
template <int N>
__global__ void fake_lamport_kernel(float* p) { FAKE_BODY(p, N) }
template __global__ void fake_lamport_kernel<1>(float*);
template __global__ void fake_lamport_kernel<2>(float*);
template __global__ void fake_lamport_kernel<3>(float*);
"""
FAKE_OTHER_CU = """__global__ void fake_two_shot_kernel(float* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += 1.0f;
}
"""


def make_buildable_tree(root: Path, guarded: bool, gate: str = "[9, 10, 12]", version: str = "0.6.16") -> Path:
    """A fake FlashInfer whose trtllm_comm generator lists two small CUDA units to compile."""
    make_tree(root, gate=gate, version=version, host="fixed")
    pkg = root / "flashinfer"
    (pkg / "jit" / "comm.py").write_text(BUILD_COMM.format(gate=gate))
    (pkg / "data" / "include" / "fake").mkdir(parents=True)
    (pkg / "data" / "include" / "fake" / "body.cuh").write_text(BODY_GUARDED if guarded else BODY_OPEN)
    (pkg / "data" / "csrc" / "fake_comm.cu").write_text(FAKE_COMM_CU)
    (pkg / "data" / "csrc" / "fake_other.cu").write_text(FAKE_OTHER_CU)
    return root
