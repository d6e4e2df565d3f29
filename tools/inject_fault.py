"""Put a known SM12x failure class, on purpose, into a scratch copy of FlashInfer's allreduce fusion.

For docs/gpu-validation.md: the run rung must catch, on a GPU we have (Hopper), the two ways the
allreduce fusion fails on SM12x with FlashInfer <= 0.6.16, while the static and spec rungs pass.

  (a) empty-body   the one-shot Lamport fusion kernel's body compiled out for __CUDA_ARCH__ >= 900,
                   as FlashInfer <= 0.6.16 compiled its Lamport kernels out for SM12x (`< 1200`):
                   it launches, returns, writes nothing
  (b) big-cluster  the fusion launcher asks for a cluster of 32 blocks, more than any Hopper can
                   launch (8 portable, 16 with opt-in), as the unclamped launcher's fixed cluster
                   of 8 is more than SM12x can be relied on to launch
  moe-empty-body   for the fused-MoE check: the CUTLASS MoE's expandInputRowsKernel (which puts the
                   tokens in expert order before the first GEMM) compiled out for __CUDA_ARCH__ >= 900

    python tools/inject_fault.py empty-body|big-cluster FLASHINFER_PACKAGE_DIR

Edits data/include/flashinfer/comm/trtllm_allreduce_fusion.cuh in place (a copy, never the
installed one: it refuses a path under site-packages) and fails loudly if the code it expects
is not there exactly once.
"""

from __future__ import annotations

import sys
from pathlib import Path

FILE = "data/include/flashinfer/comm/trtllm_allreduce_fusion.cuh"
ONESHOT = "__global__ void allreduce_fusion_kernel_oneshot_lamport(AllReduceFusionParams<T> params) {\n"
ONESHOT_END = (
    "\n}\n\ntemplate <AllReduceFusionPattern Pattern, typename T, int NRanks, bool Fp32Acc>\n"
    "__global__ void allreduce_fusion_kernel_twoshot_sync("
)
GRID = "  int grid_size = (std::min(sm_count, cluster_num * cluster_size) / cluster_size) * cluster_size;\n"


def _once(text: str, needle: str) -> int:
    if text.count(needle) != 1:
        raise SystemExit(f"{FILE}: expected exactly one {needle.strip()[:60]!r}, found {text.count(needle)}")
    return text.index(needle)


def empty_body(text: str) -> str:
    start = _once(text, ONESHOT) + len(ONESHOT)
    guard = "#if !(defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900))  // sm120patch fault (a)\n"
    text = text[:start] + guard + text[start:]
    end = _once(text, ONESHOT_END) + 1  # after the body's last newline, before its closing brace
    return text[:end] + "#endif  // sm120patch fault (a)\n" + text[end:]


def big_cluster(text: str) -> str:
    at = _once(text, GRID)
    return text[:at] + "  cluster_size = 32;  // sm120patch fault (b): more than the device can launch\n" + text[at:]


MOE_FILE = "data/csrc/fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh"
EXPAND = "__global__ void expandInputRowsKernel("


def moe_empty_body(text: str) -> str:
    start = text.index("{\n", _once(text, EXPAND)) + 2
    end = text.index("\n}\n", start) + 1  # the body's closing brace, at column 0
    guard = "#if !(defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900))  // sm120patch fault (moe)\n"
    return text[:start] + guard + text[start:end] + "#endif  // sm120patch fault (moe)\n" + text[end:]


FAULTS = {"empty-body": empty_body, "big-cluster": big_cluster, "moe-empty-body": moe_empty_body}
FILES = {"moe-empty-body": MOE_FILE}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in FAULTS:
        print(__doc__, file=sys.stderr)
        return 2
    pkg = Path(argv[2]).resolve()
    if "site-packages" in pkg.parts or "dist-packages" in pkg.parts:
        print(f"{pkg}: refusing to edit an installed FlashInfer; copy it first", file=sys.stderr)
        return 2
    path = pkg / FILES.get(argv[1], FILE)
    path.write_text(FAULTS[argv[1]](path.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"{argv[1]}: edited {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
