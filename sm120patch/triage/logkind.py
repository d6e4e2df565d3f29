"""What kind of log this is: which framework wrote it, and which GPU it ran on.

Advice has to use the flags of the framework that crashed (SGLang's --mem-fraction-static
means nothing to vLLM), and a cause that fits several GPUs (a 99 KB shared-memory limit,
"no kernel image") is blamed on SM12x only when the log itself says the GPU is SM12x.
Both are read line by line, so a log of any size costs constant memory.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from sm120patch.triage import memo

FRAMEWORKS = ("sglang", "vllm", "tensorrt-llm", "pytorch")

# Marks a framework leaves in its logs (paths, process tags, log prefixes, env vars).
_MARKERS: dict[str, re.Pattern[str]] = {
    "tensorrt-llm": re.compile(r"\[TensorRT-LLM\]|\[TRT-LLM\]|tensorrt_llm|trtllm-(?:serve|build|bench)"),
    "sglang": re.compile(
        r"\bsglang\b|sgl[-_]kernel|SGLangWorker|SGLANG_|Received sigquit from a child|"
        r"\[\d{4}-\d\d-\d\d [\d:]+ (?:DP\d+ )?TP\d+\]|--mem-fraction-static"
    ),
    "vllm": re.compile(
        r"\bvllm\b|\bvLLM\b|EngineCore|\(Worker_TP|VllmWorker|\[(?:core|multiproc_executor|gpu_worker)\.py:\d+\]|"
        r"VLLM_|--gpu-memory-utilization"
    ),
    "pytorch": re.compile(r"\btorch\b|\btriton\b|TORCH_|torch\._inductor|TORCHDYNAMO"),
}


@memo.per_line
def _marks(line: str) -> tuple[str, ...]:
    """The frameworks whose marks the line shows."""
    return tuple(name for name, pattern in _MARKERS.items() if pattern.search(line))


_PRIORITY = ("tensorrt-llm", "sglang", "vllm", "pytorch")

# Statements about the device itself (not arch lists, not compile targets of other GPUs).
_SM12X_GPU = re.compile(
    r"RTX PRO \d{4}|RTX ?50[5-9]0|\bGB10\b|DGX Spark|"
    r"(?:[Cc]apability|compute_cap)\D{0,8}12\.[01]\b|capability sm_12[01]\b|capability\W{0,8}\(12, ?[01]\)|"
    r"(?:GPU|[Dd]evice|[Aa]rch(?:itecture)?)\s*[:=]\s*sm_?12[01]\b|"
    r"major 12 minor [01]|--gpu-name=sm_12[01]|for 'sm_12[01]a?'|"
    r"/flashinfer/[\w.]+/12[01][af]?/|_sm12[01][af]?_cute_dsl|'sm_12[01]a?' is not a recognized processor|"
    r"sm_12[01]a? \(consumer Blackwell\)"
)
_OTHER_GPU = re.compile(
    # (Thor: Jetson's sm_110; L4; AMD Instinct/Radeon and their gfx targets: a ROCm log is never SM12x)
    r"\b(?:H100|H200|H800|H20|GH200|A100|A800|A10G?|A30|A40|L40S?|L20|L4|V100|P100|T4|B200|B300|GB200|GB300|Thor|"
    r"Instinct|Radeon|MI[123]\d{2}X?|gfx(?:9\d[\da-c]|1[01]\d{2}))\b|"
    r"RTX ?(?:20|30|40)[5-9]0|RTX A\d000|RTX \d000 Ada|Quadro|GTX ?\d{3,4}|\bJetson\b|\bOrin\b|"
    r"(?:[Cc]ompute [Cc]apability|Device capability)[:=]?\s*\(?(?!12\b)\d{1,2}[.,]\s?\d\)?|"
    r"capability sm_(?!12)\d+\b|CUDA device capability: (?!12)\d+\b|(?:-arch=|--gpu-name=)sm_(?!12)\d+"
)
_CLIP = 200
# words before a GPU name or capability that make it a requirement, not the device ("only supported on H100",
# "requires compute capability 9.0"): such a line says nothing about the GPU the log ran on
_REQUIREMENT = re.compile(
    r"(?:only|support\w*|requir\w*|need\w*|expect\w*|least|minimum|min\.?|like|such as|e\.g\.|>=?|or newer|"
    r"built for|compiled for|designed for|written for|targets?|GPUs? with|cards? with|devices? with)"
    r"\W*(?:\w+\W+){0,4}$",
    re.I,
)


# ... or words after it that make it one ("capability 8.9 or higher required", "sm_90+")
_REQUIREMENT_AFTER = re.compile(
    r"^\W{0,3}(?:\+|or (?:higher|newer|above|later|greater)|and (?:above|newer|higher|later)|(?:is |are )?required|"
    r"(?:is |are )?needed)",
    re.I,
)


@memo.per_line
def _shows_other_gpu(line: str) -> bool:
    """A GPU other than SM12x is named as the device (not as what a path requires)."""
    return any(
        not _REQUIREMENT.search(line[max(0, m.start() - 60) : m.start()])
        and not _REQUIREMENT_AFTER.match(line[m.end() :])
        for m in _OTHER_GPU.finditer(line)
    )


@dataclass
class Evidence:
    line_no: int
    line: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class LogKind:
    """Fed every line; answers which framework wrote the log and what it says about the GPU."""

    hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FRAMEWORKS, 0))
    sm12x_gpu: Evidence | None = None
    other_gpu: Evidence | None = None

    def feed(self, line_no: int, line: str) -> None:
        self.feed_marks(line)
        if self.sm12x_gpu is None and _SM12X_GPU.search(line):
            self.sm12x_gpu = Evidence(line_no, line.strip()[:_CLIP])
        if self.other_gpu is None and _shows_other_gpu(line):
            self.other_gpu = Evidence(line_no, line.strip()[:_CLIP])

    def feed_marks(self, line: str) -> None:
        """Only the framework marks (every line of an SGLang log has its TP prefix)."""
        for name in _marks(line):
            self.hits[name] += 1

    @property
    def framework(self) -> str | None:
        """TensorRT-LLM if it shows at all (it runs on torch and may use FlashInfer), else the
        serving framework with more marks, else plain PyTorch/Triton, else unknown."""
        if self.hits["tensorrt-llm"]:
            return "tensorrt-llm"
        sglang, vllm = self.hits["sglang"], self.hits["vllm"]
        if sglang or vllm:
            return "sglang" if sglang >= vllm else "vllm"
        return "pytorch" if self.hits["pytorch"] else None

    @property
    def gpu(self) -> str:
        """'sm12x', 'other', 'mixed' (both shown: several GPUs, or a quoted comparison) or 'unknown'."""
        if self.sm12x_gpu and self.other_gpu:
            return "mixed"
        if self.sm12x_gpu:
            return "sm12x"
        return "other" if self.other_gpu else "unknown"

    def to_dict(self) -> dict[str, object]:
        return {
            "framework": self.framework,
            "gpu": self.gpu,
            "sm12x_evidence": self.sm12x_gpu.to_dict() if self.sm12x_gpu else None,
            "other_evidence": self.other_gpu.to_dict() if self.other_gpu else None,
        }
