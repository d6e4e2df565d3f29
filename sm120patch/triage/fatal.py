"""Which log lines say a run failed, and the generic class of one that no signature names.

A fatal line that no catalogue signature or recipe names must never be answered with
silence: diagnose reports it under a clearly labelled generic class and exits 1. Framework
log prefixes are peeled off first, and lines logged at INFO/WARNING level never count as
fatal (vLLM and SGLang warn "not supported on more than two PCIe-only GPUs" on healthy runs).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sm120patch.triage import memo
from sm120patch.triage.prefilter import trie_pattern

# Prefixes frameworks put before the message, peeled off in any order (up to a few times).
_PREFIXES = (
    re.compile(r"^\s*\((?:EngineCore\w*|Worker\w*|VllmWorker\w*|SGLangWorker|APIServer|\w+) pid=\d+\)\s?"),
    re.compile(r"^\s*(?P<lvl>ERROR|WARNING|WARN|INFO|DEBUG)\s+\d\d-\d\d [\d:.]+\s+(?:\[[^\]]+\]\s?)?"),
    re.compile(r"^\s*\[\d{4}-\d\d-\d\d[ T|][\d:.|]+[^\]]*\]\s*"),
    re.compile(r"^\s*(?P<glog>[EWIF])\d{4} [\d:.]+\s+\d+ [^\]]+\]\s?"),
    re.compile(r"^\s*\d{4}-\d\d-\d\d [\d:.]+: (?P<glog>[EWIF]) (?=\S+:\d+\])\S+\]\s?"),  # TensorFlow/XLA
    re.compile(r"^\s*\[rank\d+\]:\s*"),
    # NCCL's debug lines ("host:pid:tid [0] NCCL INFO ..."): INFO is chatter; WARN is how NCCL reports its errors
    re.compile(r"^\s*(?:[\w.-]+:\d+:\d+ )?(?:\[\d+\] )?NCCL (?P<lvl>INFO)\b\s?"),
    re.compile(r"^\s*[\w.-]+-\d+\s+\|\s+"),
    re.compile(r"^\s*[>|\s]*\|\s*\[[\dT:.Z-]+\]\s*"),
    re.compile(r"^E {2,}"),
    # a one-letter level tag in angle brackets or parentheses ("<E> ...", "(W) ...")
    re.compile(r"^\s*(?:<(?P<tag>[EWIDFVT])>|\((?P<tag2>[EWIDFVT])\))\s+"),
)
_TAG_QUIET = {"W", "I", "D", "V", "T"}
_LEVEL = re.compile(
    r"^(?:(?P<lvl>INFO|WARNING|WARN|DEBUG|NOTICE)\b[:\s]|\[(?:TensorRT-LLM|TRT-LLM)\]\s?\[?(?P<trt>[IWVD])\]?\s|"
    r"\[(?P<trt2>[IWVD])\] \[TRT\]|\S*:\d+: \w*Warning\b|\[W\d{3,4} )"
)
_GLOG_QUIET = {"W", "I"}
_QUOTES = ('"', "'", "\u201c", "\u201d", "\u2018", "\u2019", "\u300c")


# The CUDA runtime's error strings (cudaGetErrorString; the driver API's cuGetErrorString says the same). The ones
# only CUDA says are an error wherever they stand; the plain English ones ("invalid argument", "unknown error")
# only after an error tag or a CUDA word, or as the whole message.
CUDA_ONLY_STRINGS = (
    "invalid device symbol",
    "invalid device function",
    "invalid device ordinal",
    "invalid device pointer",
    "invalid device context",
    "invalid resource handle",
    "invalid configuration argument",
    "invalid pitch argument",
    "invalid texture reference",
    "invalid surface reference",
    "invalid channel descriptor",
    "invalid copy direction for memcpy",
    "invalid program counter",
    "invalid kernel image",
    "device kernel image is invalid",
    "no kernel image is available for execution on the device",
    "unspecified launch failure",
    "the launch timed out and was terminated",
    "too many resources requested for launch",
    "too many blocks in cooperative launch",
    "device-side assert triggered",
    "an illegal memory access was encountered",
    "an illegal instruction was encountered",
    "misaligned address",
    "hardware stack error",
    "uncorrectable ECC error encountered",
    "uncorrectable NVLink error",
    "peer access is not supported between these two devices",
    "peer mapping resources exhausted",
    "PTX JIT compiler library not found",
    "a PTX JIT compilation failed",
    "PTX JIT compilation was disabled",
    "the provided PTX was compiled with an unsupported toolchain",
    "CUDA driver version is insufficient for CUDA runtime version",
    "CUDA driver is a stub library",
    "no CUDA-capable device is detected",
    "CUDA-capable device(s) is/are busy or unavailable",
    "all CUDA-capable devices are busy or unavailable",
    "system has unsupported display driver / cuda driver combination",
    "forward compatibility was attempted on non supported HW",
    "API call is not supported in the installed CUDA driver",
    "operation not permitted when stream is capturing",
    "operation failed due to a previous error during capture",
    "__global__ function call is not configured",
    "named symbol not found",
    "shared object symbol not found",
    "shared object initialization failed",
    "limit is not supported on this architecture",
    "operation not supported on global/shared address space",
    "mapping of buffer object failed",
)
CUDA_PLAIN_STRINGS = (
    "invalid argument",
    "invalid value",
    "initialization error",
    "unknown error",
    "operation not supported",
    "operation not permitted",
    "driver shutting down",
    "out of memory",
    "not supported",
    "device not ready",
    "system not yet initialized",
)
CUDA_ERROR_STRING = re.compile(
    r"(?i:" + trie_pattern(t.lower() for t in CUDA_ONLY_STRINGS) + r")|"
    # a plain string after an error tag, a CUDA word or a call's name and its code ("cudaMemcpy returned 1 (...)")
    r"(?:\b[Ee]rror\b|\bERROR\b|\b[Ff]ail(?:ed|ure)\b|\bFAILED\b|\b[Cc]uda\w*|\bCUDA\w*|\bcu[A-Z]\w+|\bGPUassert|"
    r"\(\d{1,3}\))\W{0,4}(?:\w+\W{1,3}){0,2}(?i:" + trie_pattern(CUDA_PLAIN_STRINGS) + r")\b"
)


class _Gated:
    """A pattern searched only in lines holding one of its words (a cheap trie search of the lower-cased line):
    the sixth round's long alternations cost ~100 us a line, and most lines the prefilter passes are healthy."""

    def __init__(self, words: Sequence[str], pattern: re.Pattern[str]) -> None:
        self._gate = re.compile(trie_pattern(words))
        self.pattern = pattern

    def search(self, text: str) -> re.Match[str] | None:
        return self.pattern.search(text) if self._gate.search(text.lower()) else None


# A line that says the program goes on another way (a fallback, a feature switched off): a warning, however
# worded, unless it also names an error ("RuntimeError: ... use X instead" is advice in a real failure)
_FALLBACK = re.compile(
    r"(?i:^\W*using\b.{1,80}\b(?:since|because|as)\b|\bfall(?:s|ing)? ?back\b|\bfallback\b|"
    r"\b(?:switching|defaulting|reverting) to\b|"
    r"(?<!please )(?<!try )(?<!consider )(?<!must )(?<!should )"
    r"\busing [^.;]{1,60} instead\b|"
    r"(?:,|;|\s-)\s*(?:disabling|skipping|ignoring)\b|\bwill (?:use|fall back|be (?:disabled|skipped|ignored))\b|"
    r"\bis deprecated\b|\busing (?:the )?defaults?\b|\bunable to find image \S+ locally\b)"
)
_HARD = re.compile(r"(?:Error|Exception|Exit)\b|\b(?:error|failed|fatal|abort\w*|traceback|crash\w*)\b", re.I)


_FALLBACK_WORDS = re.compile(
    trie_pattern(
        [
            "back",
            "instead",
            "switching",
            "defaulting",
            "reverting",
            "disabling",
            "skipping",
            "ignoring",
            "will ",
            "deprecated",
            "using",
            "locally",
        ]
    )
)


def _fallback(body: str) -> bool:
    """A warning that the program chose another way (not a failure): "FP8 is not supported, using bf16 instead"."""
    low = body.lower()
    return bool(_FALLBACK_WORDS.search(low) and _FALLBACK.search(body)) and not _HARD.search(body)


@dataclass(frozen=True)
class FatalClass:
    """A generic class: an id for data, a label for people."""

    id: str
    label: str


# First match wins; order: most telling first.
_CLASSES: tuple[tuple[str, str, re.Pattern[str] | _Gated], ...] = (
    (
        "traceback",
        "Python traceback",
        # also glued to the end of the line before it by a bad paste ("...failedTraceback (most recent ...")
        re.compile(r"^\s*(?:\w+\s+)?Traceback \(most recent call last\)|(?<=[\w.)\]:])Traceback \(most recent call"),
    ),
    (
        "error-trailer",
        "the tail of an error message",
        # lines that only ever follow an error (its first line may be cut off above): a runtime's hint for a fuller
        # trace, ggml's and a sanitizer's location lines, Triton's shared-memory hint, a hub's access refusal,
        # c10's Windows frames, Chinese "Aborted"/"core dumped"
        _Gated(
            [
                "during handling",
                "torchdynamo_verbose",
                "hydra_full_error",
                "removed its internal frames",
                "current device",
                "out of bounds",
                "by thread",
                "fault is of type",
                "num_stages",
                "hardware limit",
                "restricted",
                "authenticated",
                "is gated",
                "torchcheckfail",
                "c10_cuda_check",
                "exception in ",
                "已放弃",
                "核心已转储",
                "吐核",
                "faulting",
                "reserved by pytorch",
            ],
            re.compile(
                r"^\s*During handling of the above exception|TORCHDYNAMO_VERBOSE=1 for the internal stack trace|"
                r"HYDRA_FULL_ERROR=1 for a complete stack trace|has removed its internal frames from the traceback|"
                r"^\s*(?:\S+\s+[EF]\s+)?current device: \d+, in function \w+|"
                r"^=+\s+(?:Access at 0x[\da-fA-F]+ is out of bounds|by thread \(\d+,\d+,\d+\) in block)|"
                r"Fault is of type FAULT_\w+|Reducing block sizes or .?num_stages.? may help|"
                r"Required: \d+, Hardware limit: \d+|"
                r"\b(?:is|are) (?:restricted|gated)\b.{0,80}\b(?:must|need to) (?:be authenticated|have access|log in)|"
                r"\bYou must be authenticated to access\b|\btorchCheckFail\b|\bc10_cuda_check_implementation\b|"
                r"^\s*Exception in (?:thread )?[\w.-]+:?\s*$|已放弃|核心已转储|吐核|"
                # a debugger's fault report (cuda-gdb), PyTorch's allocator tail under an out-of-memory error
                r"\bat faulting (?:PC|address|instruction)\b|\bis reserved by PyTorch but unallocated\b"
            ),
        ),
    ),
    ("gpu-driver-error", "GPU driver error (Xid)", re.compile(r"NVRM: Xid \(|\bXid \d+\b|GPU has fallen off the bus")),
    (
        "gpu-driver-error",
        "GPU driver error",
        re.compile(r"NVRM: .{0,200}(?i:\bfailed\b|\brequires\b|\bnot supported\b|\bunable\b|\berror\b|crash\w*)"),
    ),
    (
        "sanitizer-error",
        "compute-sanitizer error",
        re.compile(r"^=+ (?:Invalid|Misaligned|Out-of-range|Program hit|Error|Barrier error|Race|Malloc|Leaked)"),
    ),
    ("trtllm-error", "TensorRT-LLM error", re.compile(r"\[TensorRT-LLM\]\[ERROR\]|\[TRT-LLM\] \[E\]|\[[EF]\] \[TRT\]")),
    (
        "cuda-error",
        "CUDA error",
        re.compile(
            r"(?i:\bcuda(?: runtime| driver)? (?:error|failure)\b)|cudaError\w+|CUDA_ERROR_\w+|CUresult|"
            # the CUDA libraries' status codes (cuDNN, cuBLAS, ...), any but success
            r"\b(?:CUDNN|CUBLAS|CUBLASLT|CUSPARSE|CUSOLVER|CUFFT|CURAND|NVJPEG)_STATUS_(?!SUCCESS\b)[A-Z_]+|"
            r"(?i:\bcuda\w* failed\b)"
        ),
    ),
    (
        "compiler-error",
        "compiler error (ptxas/nvcc/LLVM)",
        re.compile(
            r"\bptxas\b.*\b(?:error|fatal)\b|\bnvcc fatal\b|ptxas fatal|\bLLVM ERROR\b|"
            # any CUDA tool's refusal of an arch it does not know, with or without the tool's name before it
            r"\b[Vv]alue '[^']{1,40}' is not defined for option '-{0,2}(?:gpu-architecture|gpu-name|gpu-code|arch)'"
        ),
    ),
    (
        "assertion",
        "assertion failed",
        re.compile(
            r"Assertion (?:failed|error|fail\b)|\bAssertionError\b|\bCheck failed\b|\bAssertion\b.{0,300}\bfailed\b|"
            r"_ASSERT\b.{0,200}\bfailed\b|(?i:\bassert(?:ion)? failed\b)|\bTORCH_CHECK\b.{0,200}failed|"
            r"(?i:\bassertion\b.{0,60}\bviolated\b)|\bassert\w*\(.{0,200}\) failed"
        ),
    ),
    (
        "python-exception",
        "Python exception",
        re.compile(r"(?:^|[\s:\]'(`\">*),;])(?:[\w.]+\.)?(?P<name>_?[A-Z]\w*(?:Error|Exception|Exit))(?::|$|`)"),
    ),
    ("dotted-exception", "Python exception", re.compile(r"^\s*(?:[a-z_]\w*\.)+(?P<name>[A-Z]\w+): ")),
    (
        "server-error",
        "server error",
        re.compile(
            r"^\s*(?:ERROR|Error|FATAL|Fatal)\b(?! (?:rates?|counts?|handling)\b):?\s|^\s*error:\s|"
            r"\blevel=(?:ERROR|FATAL|error|fatal)\b|\[\s*(?:ERROR|FATAL)\b|^\s*(?:\[[^\]]*\]\s*)?\[[EF]\]\s"
        ),
    ),
    ("http-error", "HTTP error", re.compile(r"\b[45]\d\d Client Error\b")),
    (
        "process-died",
        "process died",
        re.compile(
            r"Segmentation fault|core dumped|Fatal Python error|"
            # not a cleanup's count ("Killed 0 zombie processes": SGLang's process-tree cleanup)
            r"\bKilled\b(?! \d+ (?:zombie|orphan|stale|child|leftover))|"
            r"\bAborted\b|terminate called|"
            r"Received sigquit from a child|exited (?:early )?with code (?!0\b)-?\d+|Signal: \w+ \(\d+\)|"
            r"\bBus error\b|Floating point exception|^\s*Illegal instruction\b|"
            # the shell's report of a child killed by a signal ("./run.sh: line 3: 1234 Illegal instruction  ./app")
            r"\bline \d+: +\d+ +(?:Illegal instruction|Segmentation fault|Aborted|Bus error|Killed)\b|"
            r"did not run successfully|"
            r"\bexit code:? -?[1-9]\d*|non-zero exit (?:status|code)|"
            # Windows: faulthandler, the access-violation status, an unhandled SEH exception
            r"Windows fatal exception|(?i:access violation|0xC0000005|0xC0000409|0xC000001D|0xC0000374)|"
            r"Unhandled exception at 0x|STATUS_STACK_BUFFER_OVERRUN|"
            r"(?<!handler for )(?<!handlers for )\bSIG(?:SEGV|ABRT|ILL|BUS|FPE)\b"
            # not a signal named as what a handler takes ("SIGILL handler installed", "SIGSEGV, SIGBUS handlers")
            r"(?!(?:[ ,/]+(?:and |or )?SIG[A-Z]+)*[ ,/]+(?:signal )?handl(?:er|ers|ing)\b)|"
            # the same statuses as a signed or unsigned decimal exit code (0xC0000005, 0xC0000409, 0xC000001D)
            r"(?:exit|error|return|status) ?code\W{0,3}(?:-1073741819|3221225477|-1073740791|3221226505|-1073741795|"
            r"3221225501)\b|"
            # other runtimes: Rust, Node, .NET; containers and Kubernetes
            r"\bpanicked at\b|\bUnhandled (?:exception|error|rejection|promise rejection)\b|"
            r"\bOOMKilled\b|\bCrashLoopBackOff\b|Back-off restarting failed container|\bFailedScheduling\b|"
            r"\b(?:exitCode|Exit Code|ExitCode):? [1-9]\d*|\bExited \([1-9]\d*\)|"
            r"\bAbort trap\b|terminating due to uncaught exception|\buncaught exception\b|"
            # builds: ninja, make, CMake, setuptools
            r"\bbuild stopped\b|subcommand failed|\b[Bb]uild failed\b|compilation terminated|"
            r"is not recognized as an internal or external command|\bcommand not found\b|"
            r"Check failure stack trace|"
            r"\*\*\* \[[^\]]+\] Error \d+|"
            # C++: an exception that left main, std::abort, a c10 error's origin line
            r"\babort\(\) (?:has been )?called|^\s*Exception raised from \w+ at |"
            r"\bstd::(?:runtime_error|logic_error|invalid_argument|out_of_range|bad_alloc)\b"
        ),
    ),
    (
        "fatal-message",
        "fatal message",
        re.compile(
            r"(?i:\bfatal\b)|No compiled \w+|CMake Error\b|"
            r"\b[Ff]ailed to (?:initialize|launch|load|run|create|execute|compile|build|start)\b|"
            r"not supported on \.?target|\bis not supported\b|"
            r"Unsupported (?:architecture|SM)\b|\bonly supported on\b|\brequires SM ?\d+|No kernel found|"
            r"not compatible with the current|\bnot supported (?:on|for|by) (?:SM ?|sm_?)?\d|\bcompilation failed\b|"
            r"\bcannot initialize\b|"
            # a C++ engine's bare refusal on a line of its own ("not implemented: dtype=e2m1, sm=70",
            # "unsupported quant type: fp4", "... is not supported")
            r"^\W*(?:[Nn]ot (?:yet )?implemented|NOT IMPLEMENTED|[Uu]nsupported|UNSUPPORTED|[Nn]ot supported)\b"
            r"\W{0,3}\S|"
            r"\b(?:is|are) not (?:yet )?(?:supported|implemented)\W*$|\bnot (?:yet )?implemented\W*$|"
            # the second half of a build-mismatch message, its first half cut off ("your current GPU is 120")
            r"^\W*(?:but )?your (?:current )?(?:GPU|device|card)(?:'s)? (?:\w+ ){0,2}is (?:sm_?|SM ?)?\d{2,3}\b|"
            r"\bno (?:\w+ )?kernel for\b|failed with error\b|"
            r"\b(?:are|is) not (?:yet )?(?:supported|implemented|available) (?:on|for|by)\b|\bnot implemented for\b|"
            r"\bhas failed\b|\binitialization error\b|\bprobe routine failed\b|\bwere initialized\b|"
            r"^\s*(?:Exception|Error|panic|what\(\)):\s|\s(?:error|fatal error)(?: \w?\d+)?\s*:\s|"
            r"\s-\s(?:ERROR|CRITICAL|FATAL)\s-\s|\|\s*(?:ERROR|CRITICAL)\s*\||\bexit status [1-9]|"
            r"^\s*Exception in thread\b|\bCUDA Exception:|: (?:Error|ERROR)\b|"
            r"\[(?:CRITICAL|critical|error)\]|^\s*CRITICAL\b|\bERR!|"
            # a library or DLL that could not be found or loaded (Windows and Linux loaders, Python's ctypes)
            r"(?i:\b(?:could not|couldn't|cannot|can't|unable to|failed to) (?:locate|load|find|open)\b.{0,120}"
            r"\.(?:dll|so|dylib)\b)|(?i:DLL load failed)|\[WinError \d+\]|"
            r"[Tt]he specified (?:module|procedure) could not be found|"
            # the dynamic loader gives up before main (Linux ld.so, macOS dyld)
            r"error while loading shared librar(?:y|ies)|cannot open shared object file|\bLibrary not loaded:|"
            # a check that names what it expected and what it got ("expects arch to be one of [...], but got X")
            r"\b[Ee]xpect(?:s|ed)\b.{1,160}\bbut (?:got|found|received|is|was)\b|"
            # nvidia-smi and friends: the driver answers, but no GPU
            r"\bNo (?:NVIDIA |CUDA )?(?:GPUs?|devices?) (?:were )?(?:found|detected)\b|"
            r"is_available\(\)\W{0,4}(?:returned |returns |is |==\s*)?False|CUDA available:? False|"
            # status codes of absl/XLA/TensorFlow and CUTLASS status strings ("Error Internal")
            r"^\s*(?:INTERNAL|UNIMPLEMENTED|FAILED_PRECONDITION|INVALID_ARGUMENT|RESOURCE_EXHAUSTED|ABORTED|"
            r"UNKNOWN|DATA_LOSS|NOT_FOUND|UNAVAILABLE|OUT_OF_RANGE|PERMISSION_DENIED|DEADLINE_EXCEEDED): |"
            r"\bError (?:Internal|Not Supported|Invalid Problem|Misaligned Operand|"
            r"Workspace Null|Memory Allocation|Insufficient Driver|Invalid Data Type|Invalid Layout)\b|"
            # ONNX Runtime's and similar "[E:lib:" prefixes; a non-zero status a runtime returned
            r"\[[EF]:\w+:|Non-zero status code returned|"
            # a wrong result rather than an exception: NaN/Inf or garbage where numbers or text were expected
            r"(?i:\b(?:loss|grad_norm|outputs?|logits|results?|values?|images?|tensors?)\b.{0,30}"
            r"\b(?:is|are|became|become|becomes|contains?|returns?|gives?|produces?)\s+(?:all\s+|only\s+)?"
            r"(?:nan|nans|inf|garbage|gibberish|black|blank|zeros?)\b|\b(?:loss|grad_norm)\s*[=:]\s*nan\b|"
            r"\bnans? (?:detected|encountered|found)\b|\binf or nan\b|\bnan or inf\b)|"
            # a model that answers with one token over and over ("!!!!!!!!", "<unk><unk>..."): a wrong result
            r"!{8,}|(?:<unk>\s*){4,}|(?:<pad>\s*){4,}|(?:\[PAD\]\s*){4,}|"
            # logs in other languages: error, failed, exception, not supported
            r"错误|失败|异常|不支持|報錯|错误码|エラー|失敗|例外|サポートされていません|오류|실패|지원되지 않|"
            r"显存不足|内存不足|メモリ不足|메모리 부족|找不到|見つかりません|찾을 수 없|"
            r"(?i:\bfehler\b|fehlgeschlagen|\berreur\b|\béchec\b|\ba échoué\b|\berro\b|\bfalhou\b|"
            r"\bfall[oó]\b|\bfallido\b|\bошибка\b|\bсбой\b|не удалось|не поддерживается)"
        ),
    ),
    (
        "cuda-error",
        "CUDA runtime error",
        # the CUDA runtime's own error strings (cudaGetErrorString), printed by a C++ app on a line of their own
        _Gated(
            [
                "invalid",
                "launch",
                "assert",
                "illegal",
                "misalign",
                "hardware stack",
                "ecc",
                "nvlink",
                "peer ",
                "ptx",
                "driver",
                "cuda-capable",
                "compatib",
                "not permitted",
                "capture",
                "__global__",
                "symbol",
                "shared object",
                "limit is",
                "address space",
                "mapping of",
                "memory",
                "error",
                "not supported",
                "shutting down",
                "not ready",
                "not yet initialized",
            ],
            CUDA_ERROR_STRING,
        ),
    ),
    (
        "loader-error",
        "loader or platform error",
        # a shared library built against another ABI, or a binary or image built for another CPU
        _Gated(
            ["symbol", "glibc", "exec format", "cannot execute", "elf class", "host platform"]
            + ["compatible", "registered"],
            re.compile(
                r"\bundefined symbol: \S|\bsymbol lookup error\b|"
                # two installed components named incompatible ("X version A is installed, but it is not compatible
                # with the installed Y version B"); a runtime with nothing registered for an op or a handler
                r"(?i:\bversion \S+ (?:is )?installed\b.{0,40}\bnot compatible with (?:the )?installed\b)|"
                r"(?i:\bnot compatible with (?:the )?installed \S+ version\b)|"
                r"(?i:\bno (?:\w+ ){0,2}(?:handler|kernel|implementation|op|operator|backend)s? "
                r"(?:is |are )?registered\b)|"
                r"(?i:\b(?:handler|kernel|implementation|op|operator) (?:\S+ )?(?:is |was )?not registered\b)|"
                r"\bversion [`'\u2018]?\w*GLIBC\w*[_\d.]*['\u2019]? not found|"
                r"(?i:\bexec format error\b)|cannot execute binary file|\bwrong ELF class\b|"
                r"does not match the detected host platform"
            ),
        ),
    ),
    (
        "remedy",
        "the remedy half of an error message",
        # what a failed check tells the user to do, its first half cut off: install a build for the GPU, a GPU of
        # a capability, the same CUDA versions; the reason a request was refused (not xformers' per-operator
        # reasons, "operator wasn't built": one of a list under the real refusal)
        _Gated(
            ["please", "make sure", "ensure", "you need", "you must", "reason", "cause"],
            re.compile(
                r"(?i:\b(?:please|make sure|ensure|you (?:need|must|should) (?:to )?)\b.{0,40}"
                r"\b(?:re)?install\b.{0,120}"
                r"\b(?:that supports?|which supports?|built for|compiled for|with (?:a |the )?(?:following|matching|"
                r"compatible|same) CUDA)\b)|"
                r"(?i:\b(?:please|make sure|ensure|you (?:need|must|should))\b.{0,80}"
                r"(?:\bcompute capabilit\w* \d|\bsm_?\d{2,3}\b|\bcompute_\d{2,3}\b|\bthe same CUDA versions?\b))|"
                r"^\W*(?:Reason|Cause)\s*:\s*\S.{0,200}\b"
                r"(?:not (?:yet )?(?:supported|implemented|available|compatible)|unsupported|failed|invalid)\b"
            ),
        ),
    ),
    (
        "ended-with-error",
        "error line",
        # the shapes the last line of a crashed log takes that no class above has: an error tag after a bracketed
        # or piped prefix ("[Info] Error: ..."), a process that went away unexpectedly, a non-zero error code
        _Gated(
            [
                "error",
                "fatal",
                "unexpectedly",
                "abnormally",
                "crashed",
                "died",
                "restarting",
                "exited",
                "code=",
                "failed",
                "critical",
                "free(",
                "malloc(",
                "realloc(",
                "double free",
                "stack smashing",
                "corrupted",
                "sanitizer",
                "signal",
                "sig",
                "illegal hardware",
                "segfault",
                "stack dump",
                "bug report",
                "cannot",
                "undefined reference",
                "denied",
                "not found",
                "no such file",
                "hip",
                "vk_error",
                "devicelost",
                "errorout",
                "device lost",
                "returned",
                "could not",
                "couldn't",
                "can't",
                "unable to",
                "refused",
                "disconnected",
                "asynchronously reported",
                "torch_use_cuda_dsa",
                "cuda_launch_blocking",
                "exit",
                "abort",
                "err",
                "ran into",
                "encountered",
                "mismatch",
                "too new",
                "newer than",
                "not a supported",
            ],
            re.compile(
                r"[\]|>]\s*(?:Error|ERROR|Fatal|FATAL)\s*(?:\[\w+\]\s*)?:\s*\S|"
                r"\b(?:exited|terminated|died|crashed|stopped|quit) (?:unexpectedly|abnormally)\b|"
                r"\b(?:process|worker|server|engine|child|subprocess)\w*\b.{0,60}\b(?:has )?(?:crashed|died)\b|"
                r"\b(?:[Ee]rror|ERROR) ?(?:code|status)\W{0,3}-?[1-9]\d*\b|"
                r"\b[Ee]xit(?:ed)? with (?:status|return code|exit code) -?[1-9]\d*\b|"
                r"\b(?:has|have|had|appears to have) (?:crashed|died)\b|\b[Ww]orker died\b|\bKernel Restarting\b|"
                r"(?i:\bexited \([1-9]\d*\))|\bcode=(?:exited|killed|dumped), status=(?!0/)\w+|"
                r"[Ff]ailed with result '(?!success)|"
                # level tags with no space ("ERROR:root:..."), apt's "E: ", Rust's "error[E0425]:"
                r"^\s*(?:ERROR|FATAL|CRITICAL):\S|^E: \S|^\s*error\[\w+\]:|"
                # glibc's and the sanitizers' aborts, signals a runtime reports, a compiler's own crash dump
                r"\b(?:free|malloc|realloc)\(\): |double free or corruption|stack smashing detected|"
                r"\bcorrupted (?:size|double-linked|top size|unsorted)|^=+\d*=+\s*ERROR: \w*Sanitizer|"
                r"\b(?:got|received|caught|killed by) signal \d+|\b(?:got|received|caught) (?:signal )?SIG[A-Z]+|"
                r"\billegal hardware instruction\b|\bSegfault\b|\bSIGKILL\b|^Stack dump:|"
                r"PLEASE submit a bug report to|"
                # the linker, and a shell that cannot find or run a program
                r"\bld(?:\.\w+)?: cannot find -l|\bundefined reference to\b|(?i:\bpermission denied\b)|"
                r"^(?:\S*/)?(?:ba|z|da)?sh: (?:\d+: )?.{1,120}: (?:not found|No such file or directory)$|"
                r"(?i:\bno such file or directory\b)|"
                # another GPU API (ROCm/HIP, Vulkan) or the CUDA driver API's own words
                r"\bhipError\w+|HIP error\b|VK_ERROR_\w+|\bDeviceLostError\b|\bErrorOutOf\w*Memory\b|"
                r"(?i:\bdevice lost\b)|(?i:\bcuda\w* api error\b)|"
                r"\bcu[A-Z]\w+(?:\(\))? (?:returned|failed)\W{0,3}(?!0\b|\(0x0\)|CUDA_SUCCESS)\S|"
                # something the program needs could not be done; an operation that failed
                # (not "could not find": transformers says it on healthy loads; the log's last lines catch it)
                r"(?i:\b(?:could not|couldn't|cannot|can't|unable to|failed to) "
                r"(?:initiali[sz]e|init|open|create|allocate|start|launch|compile|build|execute|run|connect|map|import)\b)|"
                r"\b(?:[Ii]nitiali[sz]ation|[Ss]tartup|[Ll]oading|[Ll]aunch|[Cc]ompilation|[Ee]xecution|[Aa]llocation|"
                r"[Rr]egistration|[Ii]mport) failed\b|\b[Ff]ailed: \S|^\W*(?:FAILED|[Ff]ailed)\W*$|"
                r"^\W*(?:ERROR|Error|FATAL|Fatal)\W*$|"
                r"(?i:\bconnection refused\b|\bserver disconnected\b)|could not be (?:read|written)|cannot proceed\b|"
                r"\b[Ee]rror (?:loading|reading|opening|writing|parsing|initiali[sz]ing|creating|allocating|running|"
                r"executing|compiling|building|launching|starting|connecting|importing)\b|"
                # the tail PyTorch puts under a CUDA error (the error line itself may be cut off above)
                r"CUDA kernel errors might be asynchronously reported|"
                r"TORCH_USE_CUDA_DSA\b.{0,30}device-side assertions|"
                r"consider passing CUDA_LAUNCH_BLOCKING=1|"
                # seventh round: a line that ends on the failure ("ggml_cuda_op: MUL_MAT failed", "Kernel
                # crashed"), unless it counts none ("0 failed"); a run aborted; an error met
                r"^(?!.*\b(?:[Rr]etry\w*|[Aa]ttempt \d|[Rr]equests? (?:was )?aborted|[Cc]ancel\w*|"
                r"(?:0|no|No|zero|none) (?:\w+ ){0,2}(?:failed|aborted|crashed))\b)"
                r".*\b(?:failed|FAILED|aborted|ABORTED|crashed|CRASHED)[.!]*\s*$|"
                r"\b[Aa]borting(?: (?:execution|the run|now|run))?[.!]*\s*$|"
                r"\b(?:[Bb]uild|[Cc]ompilation|[Rr]un|[Ee]xecution|[Jj]ob|[Tt]raining|[Ii]nference|[Ii]nit\w*|[Ll]oad\w*|"
                r"[Ss]tartup|[Ll]aunch) (?:was )?aborted\b|"
                r"\b(?:ran into|encountered|hit|threw|raised) an? (?:\w+ )?(?:error|exception)\b|"
                # level tags other tools use ("ERR: ...", "ERRO: ...")
                r"^\s*(?:ERR|ERRO)[!:]\s?\S|"
                # a GPU or arch the build or release does not know: too new for it, not a target it supports
                r"(?i:\b(?:GPU|device|card|arch\w*|capabilit\w*|sm_?\d{2,3}|compute_\d{2,3})\b.{0,40}"
                r"\b(?:is )?(?:too new|newer than (?:the )?(?:max\w*|highest|latest)))|"
                r"(?i:\bnot an? (?:supported|valid|known) (?:target|arch\w*|GPU|device|SM)\b)|"
                r"(?i:\bmismatch\w*\b.{0,60}\b(?:arch\w*|capabilit\w*|sm_?\d{2,3})\b|"
                r"\b(?:arch\w*|capabilit\w*)\b.{0,30}\bmismatch)"
            ),
        ),
    ),
)


@memo.per_line
def strip_prefix(line: str) -> tuple[str, bool]:
    """The message body of a log line, and whether it was logged below error level. Cached: a fatal line reads
    the dozen lines before it again (structure.py), and each is asked from several places."""
    body, quiet = line, False
    for _ in range(4):
        before = body
        for p in _PREFIXES:
            m = p.match(body)
            if m:
                groups = m.groupdict()
                if groups.get("lvl") in ("WARNING", "WARN", "INFO", "DEBUG"):
                    quiet = True
                if groups.get("glog") in _GLOG_QUIET:
                    quiet = True
                if (groups.get("tag") or groups.get("tag2")) in _TAG_QUIET:
                    quiet = True
                body = body[m.end() :]
        if body == before:
            break
    if _LEVEL.match(body) or _fallback(body):
        quiet = True
    if body[:1] in _QUOTES:  # a message quoted in prose ("Error Internal no error"): the quote is not the log
        body = body.lstrip("".join(_QUOTES) + " ")
    return body, quiet


# a fatal word glued to the end of the token before it by a bad paste ("dtype=e2m1Aborted", "...okSegmentation
# fault (core dumped)"): it ends the line, so it is the shell's or the runtime's, not a name in code ("isAborted()")
_GLUED = re.compile(
    r"(?<=[a-z0-9)\]'\".,;:])(?=(?:Aborted|Killed|Segmentation fault|Illegal instruction|Bus error|"
    r"Floating point exception)(?:\s*\(core dumped\))?\W*$|terminate called after throwing\b)"
)
_GLUED_WORDS = ("Aborted", "Killed", "Segmentation", "Illegal", "Bus error", "Floating", "terminate called")


def unglue(body: str) -> str:
    """The body with a space before a fatal word a bad paste glued to the token before it."""
    return _GLUED.sub(" ", body) if any(w in body for w in _GLUED_WORDS) else body


# Failures that runtimes log at warning level (or with no level): an op that failed with an absl/gRPC status code
# (TensorFlow's "W ... OP_REQUIRES failed at x.cc:N : INTERNAL: ..."), a component a module needs that was not found,
# CUDA that did not start under PyTorch (its "CUDA initialization: ..." UserWarning, then a run without the GPU).
# A retry or a fallback on the same line stays a warning.
ABSL_CODES = (
    "INTERNAL",
    "UNIMPLEMENTED",
    "FAILED_PRECONDITION",
    "INVALID_ARGUMENT",
    "RESOURCE_EXHAUSTED",
    "NOT_FOUND",
    "UNAVAILABLE",
    "ABORTED",
    "OUT_OF_RANGE",
    "DATA_LOSS",
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
    "DEADLINE_EXCEEDED",
    "UNKNOWN",
)
_WARNED_FAILURE = _Gated(
    [
        "op_requires",
        "required by",
        "failed with",
        "intercepted",
        "available",
        "cuda initialization:",
        *(c.lower() + ":" for c in ABSL_CODES),
    ],
    re.compile(
        r"^(?!.*(?i:\bretry(?:ing)?\b|\bretries\b|\bwill (?:retry|fall back|use)\b|\bfall(?:s|ing) ?back\b|"
        r"\busing [^.;]{1,60} instead\b|\busing (?:the )?defaults?\b|\bskipping\b|\bignoring\b)).*?(?:"
        # a call that failed with a status ("'cuModuleLoadData(&module, data)' failed with 'CUDA_ERROR_...'"),
        # an error a runtime intercepted and logged before giving up
        r"(?:^|['`])\w+\([^)]{0,200}\)['`]? failed with\b|\bIntercepted \w+ (?:runtime )?error\b|"
        # a component the runtime needs is not there at all ("No PTX compilation provider is available")
        r"\bNo [\w ]{0,30}provider (?:is )?available\b|\b[Nn]either \S+ nor \S+ (?:is|are) available\b|"
        r"\bOP_REQUIRES failed at\b|"
        # PyTorch's warning that CUDA did not start (a driver mismatch, no driver): the run goes on without the GPU
        r"\bCUDA initialization: (?:Unexpected error from cudaGetDeviceCount|.{0,200}\bError \d{2,3}: |"
        r"(?:Found no NVIDIA driver|The NVIDIA driver on your system is too old))|"
        r"(?i:\b(?:is|are) required by\b.{0,100}\bbut (?:was|were|is|are|could) not (?:be )?found\b)|"
        r"(?:^|[\s:(\[=])(?:" + "|".join(ABSL_CODES) + r"): \S)"
    ),
)


_INFO_LEVEL = re.compile(
    r"^\s*(?:\([^)]*\)\s*)?(?:INFO|DEBUG)\b|^\s*[ID]\d{4} |^\s*\d{4}-\d\d-\d\d [\d:.]+: [ID] |"
    r"^\s*(?:<[IDVT]>|\([IDVT]\))\s"
)


@memo.per_line
def classify(line: str) -> FatalClass | None:
    """The generic class of a line that says the run failed, or None for any other line (memoized: a
    crash-looping server's log repeats the same lines)."""
    body, quiet = strip_prefix(line)
    if not body.strip():
        return None
    if quiet:
        if not _INFO_LEVEL.match(line) and _WARNED_FAILURE.search(body):
            return FatalClass("warned-failure", "failure logged at warning level")
        return None
    body = unglue(body)
    for cid, label, pattern in _CLASSES:
        m = pattern.search(body)
        if m:
            name = m.groupdict().get("name")
            return FatalClass(cid, f"{label} {name}" if name else label)
    if body[:1].strip() and _ERROR_LEVEL.match(line):  # logged at error level (not a traceback frame under it)
        return FatalClass("error-level", "line logged at error level")
    return None


_ERROR_LEVEL = re.compile(
    r"^\s*(?:\([^)]*pid=\d+\)\s*)?(?:ERROR\s+\d\d-\d\d [\d:.]+|[EF]\d{4} [\d:.]+\s+\d+ [^\]]+\]|"
    r"\d{4}-\d\d-\d\d [\d:.]+: [EF] \S+:\d+\]|(?:<[EF]>|\([EF]\))\s+\S)"
)


# The last lines of a log that stopped: one that says something failed, went away or was refused is a failure,
# even in words no class above knows ("status: 1", "Exit 1", "returned -6"), unless it says all went well.
TAIL_LINES = 3
_TAIL_FAILURE = re.compile(
    r"(?i:\b(?:cannot|can't|could not|couldn't|unable to|fail(?:s|ed|ure)?|errors?|errno|died|crash(?:ed)?|segfault|"
    r"abort(?:ed)?|killed|denied|refused|not found|no such file|lost|invalid|corrupt\w*|panic\w*|\w*BackOff)\b|"
    r"\bexit(?:ed)?\W{0,3}(?:with\W{0,3})?(?:code|status)?\W{0,3}-?[1-9]\d*\b|"
    r"\b(?:status|return(?:ed)?|return code|rc)\W{0,3}-?[1-9]\d*\b|\bsig(?:segv|abrt|kill|ill|bus|fpe)\b)"
)
_TAIL_OK = re.compile(
    r"(?i:\b(?:0|no|zero|without|none) (?:\w+ ){0,2}(?:errors?|failures?|failed|crashed|aborted)\b|"
    # a retry, a client that cancelled or aborted its own request: the server goes on
    r"\bretry\w*\b|\battempt \d|\bcancel\w*|\babort(?:ed|ing)? requests?\b|\brequests? (?:was |were )?aborted\b|"
    r"\b(?:errors?|failures?|failed)(?: rates?| counts?)?\W{0,3}0\b|\bsucce\w+|"
    # a cleanup's count ("Killed 0 zombie processes": SGLang's process-tree cleanup at shutdown)
    r"\bkilled \d+ (?:zombie|orphan|stale|child|leftover)|"
    # a signal named as what a handler takes ("SIGILL handler installed"), not one received
    r"\bsig\w+(?:[ ,/]+(?:and |or )?sig\w+)*[ ,/]+(?:signal )?handl(?:er|ers|ing)\b|\bhandlers? for sig\w+|"
    r"\bready\b|\bcompleted?\b|\bfinished\b|\bdone\b|\bpassed\b|\bhealthy\b|\bretrying\b)"
)


def tail_failure(last: Sequence[str]) -> int | None:
    """Index (in `last`, the log's final lines) of a line that says the run failed in words no class knows; only
    the last TAIL_LINES non-empty lines count, and none logged below error level."""
    seen = 0
    for i in range(len(last) - 1, -1, -1):
        body, quiet = strip_prefix(last[i])
        if not body.strip():
            continue
        seen += 1
        if seen > TAIL_LINES:
            return None
        if not quiet and _TAIL_FAILURE.search(body) and not _TAIL_OK.search(body):
            return i
    return None
