"""One combined regex that says whether a log line can matter to triage at all.

A 50 MB server log is mostly decode-progress lines. Running every signature, the generic
fatal classes and the structural cues over each of them cost minutes; one search of the
lower-cased line for the words any of those need is cheap, and the full matchers run only
on the lines it passes. The keywords are a superset: a line the prefilter passes may still
match nothing. tests/unit/test_diagnose_prefilter.py checks that diagnose gives the same
answer with and without it on every corpus excerpt and on one real line per signature.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Lower-case words the signatures, fatal classes (fatal.py), GPU/framework evidence (logkind.py)
# and structural cues (triage_classes.py) need. Keep them specific: "cuda" alone or "gpu" would
# pass every decode-progress line ("cuda graph: True", "GPU KV cache usage").
KEYWORDS = (
    "error",
    "fail",
    "fatal",
    "abort",
    "assert",
    "except",
    "traceback",
    "killed",
    "fault",
    "dump",
    "terminat",
    "signal",
    "exited",
    "sigquit",
    "died",
    "crash",
    "panic",
    "unsupported",
    "support",
    "compatib",
    "require",
    "kernel",
    "illegal",
    "misalign",
    "out of",
    "resource",
    "free memory",
    "allocate",
    "oom",
    "nccl",
    "gloo",
    "ptxas",
    "nvcc",
    "nvrtc",
    "llvm",
    "ptx",
    "cubin",
    "sm_",
    "sm1",
    "sm9",
    "sm8",
    "sm7",
    "sm 1",
    "sm 9",
    "compute_",
    "capabilit",
    "blackwell",
    "hopper",
    "ampere",
    "rtx",
    "gb10",
    "spark",
    "h100",
    "h200",
    "h800",
    "h20",
    "a100",
    "a800",
    "a10",
    "a30",
    "a40",
    "l40",
    "l20",
    "l4",
    "v100",
    "p100",
    "t4",
    "b200",
    "b300",
    "gb200",
    "gb300",
    "quadro",
    "gtx",
    "jetson",
    "orin",
    "cuda e",
    "cuda_",
    "cudaerror",
    "cuda out",
    "cuda runtime",
    "cuda driver",
    "cuda capab",
    "cuda kernel",
    "cuda device",
    "cuda arch",
    "cuda graph fail",
    "cuda-capable",
    "cuda gpus",
    'file "',
    "backend",
    "quantization",
    "kv_cache",
    "kv-cache",
    "arch",
    "not found",
    "no such",
    "no module",
    "import",
    "undefined",
    "symbol",
    "denied",
    "refused",
    "already in use",
    "errno",
    "tokeniz",
    "gated",
    "401",
    "403",
    "client",
    "invalid",
    "cannot",
    "can't",
    "could not",
    "unable",
    "enable flashinfer",
    "xid",
    "trap",
    "mismatch",
    "version",
    "too new",
    "too old",
    "no operator",
    "not built",
    "untagged enum",
    "deep_gemm",
    "deepgemm",
    "flashinfer",
    "trtllm",
    "tensorrt",
    "[trt",
    "tllm",
    "bitsandbytes",
    "xformers",
    "flash_attn",
    "ggml",
    "llama",
    "nvidia",
    "gpu-name",
    "multicast",
    "cluster",
    "shared memory",
    "smem",
    "timeout",
    "timed out",
    "watchdog",
    "mem-fraction",
    "memory-utilization",
    "compiled",
    "eaddrinuse",
    "smxx",
    "per-block",
    "major",
    "exit",
    "not implemented",
    "not available",
    "no longer",
    "not include",
    "probe routine",
    "initialized",
    "unknown",
    "expected",
    "critical",
    "only",
    "did not run",
    # the loader, the driver and Windows (DLLs, NVRM, nvidia-smi, SEH exceptions)
    "dll",
    "winerror",
    "nvrm",
    "no devices",
    "no gpu",
    "no nvidia",
    "no cuda",
    "is_available",
    "err!",
    "available: false",
    "available false",
    "xc0000",  # 0xC0000005 (a leading digit would send every number of a decode line into the trie)
    "curesult",
    # absl/XLA status codes and CUTLASS status strings
    "internal:",
    "unimplemented",
    # structural cues (classes.py)
    "not valid for",
    "current platform",
    "built for",
    "wgmma",
    "feature '",
    "=nan",
    "loss",
    "inf or nan",
    "detected",
    "encountered",
    "garbage",
    "black",
    "blank",
    "zeros",
    "unterstützt",
    "pris en charge",
    "supporté",
    "no soportad",
    "no es compatible",
    "suportad",
    "サポート",
    "지원하지",
    "non-zero status",
    "[e:",
    "[f:",
    "sigsegv",
    "sigabrt",
    "sigill",
    "sigbus",
    "sigfpe",
    "uncaught",
    "build stopped",
    "paging file",
    "nvvm",
    # logs in other languages: error, failed, exception, not supported
    "错误",
    "失败",
    "异常",
    "不支持",
    "報錯",
    "エラー",
    "失敗",
    "例外",
    "サポートされていません",
    "오류",
    "실패",
    "지원되지",
    "fehler",
    "fehlgeschlagen",
    "erreur",
    "échec",
    "échoué",
    "erro",
    "falhou",
    "falló",
    "fallo",
    "fallido",
    "ошибка",
    "сбой",
    "не удалось",
    "не поддерживается",
)


def trie_pattern(words: Iterable[str]) -> str:
    """One regex for any of `words`, factored by common prefix (a trie): Python's re tries the
    alternatives of a branch one by one, so 150 flat words cost ~3x more per character."""
    root: dict[str, dict] = {}
    for w in words:
        node = root
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, dict]) -> str:
        alts = [re.escape(ch) + emit(sub) for ch, sub in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(root)


class Prefilter:
    """`passes(line)`: could this line matter? One regex search of the lower-cased line."""

    def __init__(self, extra: Iterable[str] = ()) -> None:
        words = {*KEYWORDS, *(w.lower() for w in extra if w)}
        self._re = re.compile(trie_pattern(words))
        # most lines are ASCII: a pattern of ASCII words only keeps re's first-character test a bitmap (the
        # words in other scripts made every line ~40% slower); a line with other characters gets all words
        self._ascii = re.compile(trie_pattern(w for w in words if w.isascii()))

    def passes(self, line: str) -> bool:
        low = line.lower()
        return (self._ascii if low.isascii() else self._re).search(low) is not None
