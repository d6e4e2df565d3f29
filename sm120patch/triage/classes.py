"""Cause classes, and the structural classifier for fatal lines no signature names.

The catalogue learns phrasings one thread at a time; the next log words the same failure
differently. So a fatal line that no signature names is still answered, from its structure:
the kind of failure its words show (a compiler that does not know the arch, a kernel image
missing, a shared-memory limit, ...), the library in the traceback frames, the architecture
tokens the log names (sm_90a, SM100-only, "Blackwell datacenter", a compute capability),
CUDA error names, the backend flag values the launch used and the GPU the log shows. The
answer is given at the level that evidence supports, and says when it is thin.

Every finding, named or structural, carries one of CLASSES (the contract with the triage
corpus, tests/corpus/triage/README.md).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from sm120patch.triage import memo
from sm120patch.triage.prefilter import trie_pattern

# class id -> (is an SM12x architecture cause, one line for people)
# class id -> (is an SM12x architecture cause, what happened; {where} is " in <library>" or "")
CLASSES: dict[str, tuple[bool, str]] = {
    "arch-path-unsupported": (
        True,
        "a code path or kernel{where} written only for other GPU architectures was reached",
    ),
    "binary-lacks-arch": (True, "a compiled binary{where} carries no code for this GPU's architecture"),
    "toolchain-lacks-arch": (True, "a compiler, assembler or JIT{where} does not know this GPU's architecture"),
    "resource-limit": (True, "a kernel{where} asks for more shared memory, registers or threads than this GPU has"),
    "kernel-fault": (True, "a GPU kernel{where} faulted (illegal instruction or address, launch failure)"),
    "out-of-memory": (False, "the GPU (or host) ran out of memory{where}"),
    "communication": (False, "a collective or peer-to-peer transfer between ranks failed{where}"),
    "environment": (False, "the software environment is broken{where} (a missing module, mismatched versions, files)"),
    "other": (False, "a failure{where} that is not about the GPU architecture, as far as the log shows"),
}
SM12X_CLASSES = frozenset(c for c, (arch, _) in CLASSES.items() if arch)

# A build (CMake, setup.py) that left kernels out because none of its arch list matched the target: on its
# own a healthy build for another GPU says it too, so structure.py counts it only when the log targets SM12x
SKIPPED_BUILD = re.compile(
    r"\bno compatible (?:CUDA |GPU )?arch(?:itecture)?s? (?:were |was )?found|"
    r"\b[Nn]ot building \S+.{0,60}\b(?:no|without) (?:compatible |matching |supported )?(?:CUDA )?arch"
)
# An arch list or arch table a build or dispatch uses: a refusal next to it refuses this GPU's arch
_ARCH_SETTING = re.compile(
    r"TORCH_CUDA_ARCH_LIST|CUDA_ARCHITECTURES|CUDAARCHS|\bcuda_archs?\b|\barch(?:itecture)? (?:list|table)\b|"
    r"\bgencode\b|\bgpu_archs?\b"
)
# a source line of a frame that picks something by the arch: a name it left unset failed there
ARCH_DISPATCH = re.compile(
    r"gencode|arch=compute_|compute_\{|sm_?\{|get_device_capability|compute_cap|\bcapability\b|"
    r"TORCH_CUDA_ARCH_LIST|\bcuda_arch\w*|\barch\b|\bsm_?(?:ver|version|major|arch)\w*|\bis_sm\d+"
)
# a frame or call that compiles GPU code at run time (CuPy's kernel cache, NVRTC, pycuda's SourceModule, jitify):
# a module it built that has no code for the GPU was built by a compiler that does not know the arch
RUNTIME_COMPILE = re.compile(
    r"\b_?compile_with_cache\w*|\bnvrtcCompileProgram\b|\bNVRTC_ERROR\w*|\bSourceModule\b|\bjitify\w*|"
    r"\bRawModule\b|\bcompile_(?:using_)?nvrtc\b"
)
# Per class, the words that show it, most telling classes first (first match wins).
_CUES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # driver-reported Xids other than the kernel faults (13, 31, 43): hangs, GSP, bus, ECC
    ("other", re.compile(r"Xid \([^)]*\): (?!13,|31,|43,)\d+|GPU has fallen off the bus|GSP (?:kernel )?exception")),
    # a value that is None (or of the wrong type) where the code expected an object: a bug in the code that ran,
    # not a missing module (which "module 'x' has no attribute" is)
    ("other", re.compile(r"'NoneType' object (?:has no attribute|is not (?:subscriptable|callable|iterable))")),
    (
        "environment",
        _DRIVER_UNREACHABLE := re.compile(
            r"no CUDA-capable device|Found no NVIDIA driver|communicate with the NVIDIA driver|"
            r"driver initialization failed|system not yet initialized|incorrectly set up environment|"
            r"CUDA driver version is insufficient|cudaErrorInsufficientDriver|nvidia-container-cli|"
            r"probe routine failed|None of the NVIDIA devices|(?:[Ff]ailed to|[Cc]an't|[Cc]annot) initialize NVML|"
            r"No CUDA GPUs are available|[Dd]river (?:on your system )?is too old|"
            r"not compiled with CUDA enabled|CPU-only (?:build|version)|"
            # the kernel driver could not bring the GPU up (wrong module flavour, firmware), or sees none
            r"NVRM: (?!Xid).{0,160}(?:failed|requires|not supported)|"
            r"\bNo (?:NVIDIA |CUDA )?(?:GPUs?|devices?) (?:were )?(?:found|detected)\b"
        ),
    ),
    # a shared library the loader cannot find or load (Windows DLLs, .so files, ctypes)
    (
        "environment",
        re.compile(
            r"(?i:\b(?:could not|couldn't|cannot|can't|unable to|failed to) (?:locate|load|find|open)\b.{0,120}"
            r"\.(?:dll|so|dylib)\b)|(?i:DLL load failed)|\[WinError 12[67]\]|"
            r"[Tt]he specified (?:module|procedure) could not be found|"
            # the dynamic loader gives up before main (Linux ld.so, macOS dyld): a library the image needs is absent
            r"error while loading shared librar(?:y|ies)|cannot open shared object file|\bLibrary not loaded:|"
            # the linker cannot find a library another one needs (libcuda.so.1 outside the build container's path)
            r"\blib[\w+-]+\.so(?:\.\d+)*, needed by \S+, not found|"
            r"[Dd]ynamic link library \(DLL\) initiali[sz]ation|DLL initiali[sz]ation routine failed|"
            r"_cuda_getDeviceCount\(|"
            # Windows' loader refusing a DLL by code (126: a DLL it depends on is missing), ONNX Runtime's own words for
            # a CUDA provider whose CUDA/cuDNN DLLs it could not load; a Vulkan loader that finds no usable driver
            r"\bLoadLibrary(?:Ex)?[AW]? failed with error \d+|CUDA wasn't able to be loaded|"
            r"\bvkCreateInstance failed\b|VK_ERROR_INCOMPATIBLE_DRIVER|"
            # the same in other languages: a module, file or library not found
            r"找不到指定的模块|找不到(?:模块|文件|库)|未找到(?:模块|文件|库)|指定されたモジュールが見つかりません|"
            r"지정된 모듈을 찾을 수 없습니다|"
            # containers: the runtime cannot hand the GPU to the container
            r"Error response from daemon|could not select device driver|unknown or invalid runtime name|"
            # a tool or host compiler the build needs is not installed or not on PATH (Windows and Linux)
            r"is not recognized as an internal or external command|\bcommand not found\b|"
            r"[Cc]annot find compiler|\bcl\.exe\b|vcvarsall|Microsoft Visual C\+\+ [\d.]+ or greater is required|"
            r"(?:[Ff]ailed to|[Cc]ould not|[Uu]nable to) find (?:a |the )?C(?:\+\+)? compiler|"
            r"unsupported (?:Microsoft Visual Studio|GNU|gcc|clang|host compiler) version|"
            r"Host compiler targets unsupported|"
            r"CUDA_HOME (?:environment variable )?(?:is not set|does not exist)|"
            # a container's CUDA newer than the host driver (forward compatibility exists on datacenter GPUs only)
            r"forward compatibility was attempted on non supported HW|COMPAT_NOT_SUPPORTED_ON_DEVICE|"
            r"cudaErrorCompatNotSupportedOnDevice|cudaErrorSystemDriverMismatch|SYSTEM_DRIVER_MISMATCH|"
            r"unsupported display driver / cuda driver combination|Insufficient nvidia\.com/gpu|"
            # packages built against another torch/CUDA than the one installed
            r"operator \S+::\S+ does not exist|compiled with different CUDA (?:major )?versions|"
            r"mismatches the version that was used to compile|"
            # a package too old for the code that calls it, in its own words; a library type without an attribute
            # its caller expects (an API a newer or older release removed: 'torch._C....ProcessGroup' ... 'options')
            r"\bis not new enough\b|\bnot new enough version\b|"
            r"^AttributeError: '[A-Za-z_]\w*(?:\.\w+)+' object has no attribute '\w+'"
        ),
    ),
    # Windows: the paging file (virtual memory) is too small to map the weights or the CUDA libraries
    ("out-of-memory", re.compile(r"\[WinError 1455\]|paging file is too small")),
    # the tails of messages whose class is known (the first line may be cut off): Triton's shared-memory hint, a
    # sanitizer's out-of-bounds line or a GPU page fault, a hub that refuses a gated model
    (
        "resource-limit",
        re.compile(r"Reducing block sizes or .?num_stages.? may help|Required: \d+, Hardware limit: \d+"),
    ),
    (
        "kernel-fault",
        re.compile(
            r"^=+\s+Access at 0x[\da-fA-F]+ is out of bounds|Fault is of type FAULT_\w+|"
            r"\bat faulting (?:PC|address|instruction)\b"  # a debugger's report (cuda-gdb)
        ),
    ),
    (
        "environment",
        re.compile(
            r"\b(?:is|are) (?:restricted|gated)\b.{0,80}\b(?:must|need to) (?:be authenticated|have access|log in)|"
            r"\bYou must be authenticated to access\b"
        ),
    ),
    # the assembler ran out of the GPU's resources, not of arch knowledge; a kernel that could not get (or set)
    # the shared memory it asks for, however cased ("Failed to set Shared Memory size")
    (
        "resource-limit",
        re.compile(
            r"uses too much shared data|too much (?:shared|local) (?:data|memory)|[Tt]oo many registers|"
            r"(?i:(?:fail\w*|unable|could not|cannot|can't) (?:to )?(?:set|get|allocate|reserve|configure) "
            r"(?:the )?(?:\w+ ){0,2}shared[ _-]?mem\w*)|"
            r"(?i:shared[ _-]?mem\w*(?: \w+){0,3} "
            r"(?:too (?:large|big)|exceed\w*|insufficient|not enough|over the limit))"
        ),
    ),
    # the runtime's own name for a binary whose PTX the driver cannot JIT (CUDA code 218): the binary carries no
    # code this GPU runs, whatever JIT words follow ("a PTX JIT compilation failed")
    (
        "binary-lacks-arch",
        re.compile(r"cudaErrorInvalidPtx|CUDA_ERROR_INVALID_PTX|\ba PTX JIT compilation failed"),
    ),
    # the driver could not load a kernel module (cubin/fatbin) the binary carries: none of its code is for this GPU
    (
        "binary-lacks-arch",
        re.compile(
            r"\bcu(?:ModuleLoad|LibraryLoad)\w*\b.{0,80}(?:fail|error|ERROR|returned|CUDA_ERROR)|"
            r"(?i:(?:failed to|could not|cannot|can't|unable to) load (?:the )?(?:CUDA |GPU |kernel |device )?"
            r"(?:module|kernel image|cubin|fatbin)\b)"
        ),
    ),
    # a GPU or capability a toolkit's version does not (fully) know yet: the CUDA toolkit or driver JIT is too old
    (
        "toolchain-lacks-arch",
        re.compile(
            r"(?:GPU|[Cc]apabilit\w*|\barch\w*|device)\b.{0,80}\bnot (?:fully |yet )?supported by "
            r"(?:the )?(?:CUDA|NVCC|nvcc|ptxas|[Tt]oolkit|CUDA [Tt]oolkit)\b ?v?\d|"
            # a build that says which CUDA the GPU's arch needs ("CUDA 12.8 or higher is required for compute
            # capability 12.0", "sm_120 requires CUDA >= 12.8"): the toolkit it found is older
            r"(?i:\bCUDA(?: toolkit)?(?: version)? ?(?:>= ?)?\d{2}\.\d\+?(?: or (?:higher|newer|later|above))? "
            r"(?:is |are )?(?:required|needed) (?:for|by|to (?:build|compile) for) (?:the )?(?:GPU|device|"
            r"(?:compute )?capabilit\w*|arch\w*|sm_?\d|compute_\d|\d{2}\.\d)|"
            r"(?:capabilit\w* \d{1,2}\.\d|sm_?\d{2,3}[af]?|compute_\d{2,3}[af]?) (?:requires|needs) CUDA(?: toolkit)? "
            r"?(?:>= ?)?\d{2}\.\d)"
        ),
    ),
    # a failing line that says which capabilities (or archs) a path requires: the path is written for those (a
    # line that also says nothing was compiled for the GPU is the build's, below)
    (
        "arch-path-unsupported",
        re.compile(
            r"^(?!.*\b[Nn]o compiled\b).*?"
            r"\b[Rr]equired? (?:compute |CUDA |GPU |device )?(?:capabilit(?:y|ies)|archs?|architectures?|SMs?)\W{0,3}"
            r"(?:sm_?)?\d{2,3}[af]?(?:\s*(?:,|or|and|/)\s*(?:sm_?)?\d{2,3}[af]?)+"
        ),
    ),
    # a kernel library's binary that names the arch it was built for in the failing line ("built for 120a: ...
    # error"): the build's arch is what the GPU lacks
    (
        "binary-lacks-arch",
        re.compile(
            r"\b(?:built|compiled) (?:for|with) (?:sm_?|SM ?|compute_)?\d{2,3}[af]?\b"
            r"(?=.{0,80}\b(?:[Ee]rror|ERROR|[Ff]ail))"
        ),
    ),
    (
        "out-of-memory",
        re.compile(
            r"out of memory|OutOfMemory|\bOOM\b|OOMKilled|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|"
            r"[Cc]annot allocate memory|No available memory for the cache blocks|not enough (?:GPU |KV cache )?memory|"
            r"insufficient (?:GPU )?memory|larger than the available KV cache|memory_limit|failed to allocate|"
            # PyTorch's allocator message as apps re-raise it (the rest of the message cut off)
            r"\bAllocation on device\b|would exceed allowed memory|_STATUS_ALLOC_FAILED\b|"
            r"\bis reserved by PyTorch but unallocated\b|"
            r"显存不足|内存不足|メモリ不足|메모리 부족|недостаточно (?:видео)?памяти|"
            r"(?i:nicht genügend (?:GPU-)?speicher)",
        ),
    ),
    # the package (not a path in it) refuses the GPU's capability: its build, a wheel for the GPU, is what is missing
    (
        "binary-lacks-arch",
        re.compile(
            # (not "GPUs are not supported by ...": the GPU refused is a path the package chose not to run)
            r"(?:[Cc]apabilit\w*|\barch\w*)\b(?:(?!GPUs?\b|devices?\b|cards?\b).){0,60}"
            r"\bnot supported by "
            r"(?!(?:this|the|your|current) (?:GPU|device|card|hardware))"
            r"(?:this (?:version|release|build)|the (?:installed|current) (?:version|build|wheel)|[A-Z][\w.-]+)|"
            # a kernel named for an arch that is not there: the build left it out ("SM89 kernel is not available")
            r"\b(?:sm_?|SM ?)\d{2,3}[af]? kernels? (?:is |are )?(?:not available|missing|not (?:compiled|built))|"
            # a build script that skipped kernels because none of its arch list matched the target
            + SKIPPED_BUILD.pattern
            + r"|"
            # PyTorch's warning that its build lacks the GPU, as its second line says it (the first may be cut off)
            r"If you want to use the .{1,80} GPU with PyTorch|"
            # the installed build (not a path in it) does not fit the GPU
            r"(?i:not compatible with (?:the |this |your )?(?:installed |current )?[\w.-]+ "
            r"(?:installation|build|wheel|package|binar(?:y|ies)))"
        ),
    ),
    # the assembler knows the arch, the code uses what the arch lacks (wgmma, tcgen05, block-scaled mma, ...);
    # a build that left an arch's kernels out (undefined symbol ..._sm100...)
    (
        "arch-path-unsupported",
        re.compile(
            r"not supported on \.?target '?(?:sm|compute)_\d+|requires? \.?target '?sm_\d+|"
            r"(?:undefined symbol: |No such operator |has no attribute '?)\S*?(?:sm_?\d{2,3}[af]?|SM\d{2,3})(?![0-9])|"
            r"(?:[Uu]nsupported|not supported)\b.{0,30}\b(?:on|for|by|in) (?:this|the current|your) (?:GPU )?arch|"
            r"[Uu]nsupported\b.{0,60}\b(?:on|for) (?:this|the current|your) (?:GPU|device|platform|hardware)\b|"
            # a kernel that says which archs it is for, then that it ran elsewhere
            r"\bis (?:only )?for (?:sm_?|SM ?|compute_)\d{2,3}[af]?(?:\s*-\s*(?:sm_?|SM ?)?\d{2,3}[af]?)?,? but\b|"
            # the platform itself refused (no arch named): a backend or kernel not valid/available on this device
            r"\bnot valid for (?:cuda|this (?:GPU|device|platform)|the current (?:GPU|device|platform))\b|"
            r"(?:unavailable|not available|not supported)\b.{0,60}\bon (?:the )?current (?:platform|device|GPU)\b|"
            # instructions of one arch family only (tcgen05: SM100/SM103/SM110; wgmma: SM90a) reached the backend
            r"intrinsic %llvm\.nvvm\.(?:tcgen05|wgmma)|"
            # ptxas: a feature the target lacks (also when the target is cut off: "not supported on .t")
            r"\bFeature '[^']{1,120}'? (?:not supported on|requires)\b"
        ),
    ),
    # a library built against another ABI (an undefined symbol that names no arch), or a binary, container or
    # wheel built for another CPU or C library: the environment, whatever GPU the log shows
    (
        "environment",
        re.compile(
            r"\bundefined symbol: \S|\bsymbol lookup error\b|"
            # the shell's (or faulthandler's) report of a HOST SIGILL: the CPU refused an instruction (a binary
            # built for another x86 level, AVX-512, ...); CUDA's own texts say "illegal instruction was encountered",
            # CUDA_ERROR_ILLEGAL_INSTRUCTION or cudaErrorIllegalInstruction, and stay kernel faults below
            r"^(?!.*(?i:cuda|kernel|encountered|warp|\bgpu\b|device|illegal_instruction|illegalinstruction))"
            r".*?(?<![A-Za-z])(?:Illegal instruction|illegal hardware instruction|\bSIGILL\b)|"
            r"\bversion [`'\u2018]?\w*GLIBC\w*[_\d.]*['\u2019]? not found|"
            r"(?i:\bexec format error\b)|cannot execute binary file|\bwrong ELF class\b|"
            r"does not match the detected host platform|is not a supported wheel on this platform|"
            r"(?i:\bversion \S+ (?:is )?installed\b.{0,40}\bnot compatible with (?:the )?installed\b)|"
            r"(?i:\bnot compatible with (?:the )?installed \S+ version\b)|"
            r"(?i:\bno (?:\w+ ){0,2}(?:handler|kernel|implementation|op|operator|backend)s? "
            # (not "registered for device capability (12, 0)": that names the arch, an arch path below)
            r"(?:is |are )?registered\b(?! for (?:the |this |your )?(?:device |GPU )?"
            r"(?:capabilit|arch|sm|compute|GPU|device)))|"
            r"(?i:\b(?:handler|kernel|implementation|op|operator) (?:\S+ )?(?:is |was )?not registered\b)|"
            r"\bno matching manifest for\b|exec user process caused|(?i:\bno such file or directory\b)"
        ),
    ),
    # a build step that failed on a kernel source of ANOTHER arch ("Kernel compilation failed for
    # csrc/attn_sm90.cu: nvcc error"): that arch's kernel was put in a build for this GPU (said thinly)
    (
        "arch-path-unsupported",
        re.compile(
            r"(?i:\b(?:compil\w*|build\w*)\b.{0,20}\bfail\w*\b.{0,12}\bfor \S*?(?:[/\\_]sm_?(?:90|100|103|110)[af]?"
            r"(?![0-9])|hopper)\S*?\.(?:cuh?|cpp|cc)\b)"
        ),
    ),
    # a compile or build that failed for a named arch: the compiler (or JIT) did not make code for it
    (
        "toolchain-lacks-arch",
        re.compile(
            r"(?i:\b(?:compil\w*|JIT|codegen|assembl\w*)\b.{0,20}\bfail\w*\b.{0,20}\b(?:for|on|targeting) "
            r"(?:sm_?|compute_|arch\w* ?)\d{2,3}|\bfailed to (?:compile|build|assemble|jit)\b.{0,40}\bfor "
            r"(?:sm_?|compute_)\d{2,3})"
        ),
    ),
    (
        # the toolchain is not there at all (no ptxas/nvjitlink where the JIT looks): a missing component, before
        # the toolchain class below reads its name as a compiler that does not know the arch
        "environment",
        re.compile(
            r"No PTX compilation provider|\b[Nn]either ptxas\S* nor\b|"
            r"\bptxas\S* (?:was |is )?(?:not found|could not be found|not available)\b|"
            r"(?i:\b(?:could not|couldn't|cannot|can't|unable to|failed to) (?:find|locate) (?:the )?ptxas\b)",
        ),
    ),
    (
        "toolchain-lacks-arch",
        re.compile(
            r"\bptxas\b|\bnvcc\b|\bNVRTC\w*|\bnvrtc\w*|LLVM ERROR|is not a recognized processor|"
            r"[Uu]nsupported (?:CUDA )?gpu architecture|"
            r"[Uu]nknown (?:CUDA |GPU )?[Aa]rch(?:itecture)?(?: [Nn]ame)?\W{0,3}(?:sm_?\d|compute_\d|\d)|"
            # any CUDA tool (nvcc, ptxas, cuobjdump, nvdisasm, fatbinary, nvlink) refusing an arch it does not know
            r"\b[Vv]alue '[^']{1,40}' is not defined for option "
            r"'-{0,2}(?:gpu-architecture|gpu-name|gpu-code|arch)'|"
            r"PTXASError|--gpu-architecture|\bgpu[-_]arch\w*\b.{0,40}(?:invalid|unsupported|unknown|not)|"
            r"does not support (?:it|(?:CUDA )?arch\w*|compute_\d+|sm_\d+)\b.{0,20}(?:nvcc|compiler)?|"
            r"[Uu]nsupported \.version|unsupported toolchain|PTX (?:was compiled|version)|gpu-name|"
            r"CUDA_ERROR_UNSUPPORTED_PTX_VERSION|cudaErrorUnsupportedPtxVersion|CompilationError|"
            r"[Ii]nvalid (?:target|arch)|arch(?:itecture)? \S+ is not supported by (?:the )?(?:compiler|nvcc)|"
            r"CUTE_DSL_ARCH|cute[_ ]dsl.{0,40}arch|is not a recognized processor|[Cc]ompilation failed|"
            r"nvJitLink|NVJITLINK_ERROR|PTX codegen error|"
            r"[Uu]nknown (?:target|processor)\W{0,3}(?:sm_?\d|compute_\d)|\bNvvm\w*Error\b|\bNVVM_ERROR\w*|libnvvm|"
            r"PassManager::run failed",
        ),
    ),
    (
        "binary-lacks-arch",
        re.compile(
            r"no kernel image|invalid device function|cudaErrorNoKernelImageForDevice|CUDA_ERROR_NO_BINARY_FOR_GPU|"
            r"cudaErrorInvalidDeviceFunction|not compatible with the current PyTorch|\bcubin\b|[Nn]o compiled\b|"
            r"(?:wasn't|was not|not) (?:been )?(?:built|compiled) (?:for|with)|operator wasn't built|"
            r"named symbol not found|cudaErrorSymbolNotFound|no (?:binary|image) for|CUDA_ERROR_INVALID_PTX|"
            r"cudaErrorInvalidPtx|[Mm]ismatched GPU [Aa]rchitecture|compiled for [\d ,]+,? ?but your (?:current )?GPU|"
            r"STATUS_ARCH_MISMATCH|kernel image is invalid|CUDA_ERROR_INVALID_IMAGE|cudaErrorInvalidKernelImage|"
            r"unable to find an engine to execute|no (?:\w+ )?(?:variant|build) for (?:this|your) (?:GPU|arch)|"
            r"(?:sm_\d+a? )?is not (?:in|among) the (?:supported|compiled) arch|"
            r"supports CUDA capabilities sm_|not supported by this [\w.-]+ (?:release|version|build)|"
            r"compiled without (?:GPU|CUDA) support|Could not find the [\w.-]+ CUDA binary|"
            # the second half of a build-mismatch message alone ("... but your current GPU is 120"): the build's
            # archs are in the half that is cut off
            r"^\W*(?:but )?your (?:current )?(?:GPU|device|card)(?:'s)? (?:\w+ ){0,2}is (?:sm_?|SM ?)?\d{2,3}\b|"
            r"not in the list of (?:\w+ )?arch\w*|"
            r"(?:built|compiled) for (?:arch\w* |capabilit\w+ )?[\d.;, ]+(?:only)?$|"
            r"has no (?:compiled |prebuilt )?(?:kernels?|code|cubins?|SASS|binar(?:y|ies)) for|"
            r"\bno device code (?:compatible with|for)\b|"
            # an app's launcher check that the installed torch/CUDA build cannot run on the device (Forge)
            r"(?:device|GPU|card) (?:does not|doesn't) support the (?:current|installed) (?:version|build) of|"
            # the remedy half of a build-mismatch message, its first half cut off ("Solution: Install the correct
            # wheel package built for your GPU", "Please reinstall a build compiled for sm_120")
            r"(?i:\b(?:re)?install\b.{0,60}\b(?:wheel|package|build|binar\w+)s?\b.{0,30}\b(?:built|compiled|made) for "
            r"(?:your|this|the current|the) (?:GPU|device|card|arch\w*|compute capability))|"
            r"[Nn]o (?:compiled |prebuilt |CUDA |GPU )?(?:kernels?|code|SASS|binar(?:y|ies)) (?:compiled |built )?"
            r"for (?:sm|arch|comp|this|your)|"
            r"no longer supports this GPU|[Mm]inimum (?:and [Mm]aximum )?cuda capability supported by|"
            r"kernel binaries compatible with compute capability|ARCH_MISMATCH|"
            r"(?:does not|doesn't|do not) (?:include|contain|ship|have) (?:any )?(?:compiled |prebuilt )?"
            r"(?:kernels?|code|binar\w+|SASS|cubins?) for|the CCs this version of \w+ was built for|"
            r"No execution plans? (?:support|found|available)|(?i:arch(?:itecture)? mismatch)|"
            r"(?:built|compiled) for (?:an? )?(?:lower|older|different|another|other) (?:compute capability|capability|"
            r"arch\w*|GPU|SM)|"
            # a release or build older than the GPU ("too new for this release", "newer than the maximum supported")
            r"(?i:\b(?:GPU|device|card|arch\w*|capabilit\w*|sm_?\d{2,3})\b(?: \S+){0,3} (?:is )?"
            r"(?:too new for (?:this|the|your) "
            r"(?:\w+ )?(?:release|version|build|wheel|binary|installation)|newer than (?:the )?max\w* supported))|"
            r"(?i:\bmismatch\w* between (?:the )?(?:device|GPU)\W?s? arch\w* and (?:the )?(?:binar\w+|build|wheel))|"
            r"(?:[Cc]ould not|[Cc]annot|[Uu]nable to) find (?:a |any )?(?:compatible|matching|suitable)\b.{0,60}"
            r"\bfor (?:compute capability|capability|arch\w*|sm_?\d|SM ?\d|this GPU)|"
            r"(?:built|compiled) for (?:sm_?|SM ?|compute_)?\d{2,3}[af]?(?:\s*-\s*(?:sm_?|SM ?)?\d{2,3}[af]?)?,? but "
            r"(?:is )?(?:running|run|executing|launched) on",
        ),
    ),
    # a search over kernel or tile configs that found none fitting ("mmq_x_best=0", "no usable tile config"): on a
    # GPU whose limits differ (shared memory, SM12x's 99 KB) nothing fits; the lines before a bare abort show it
    (
        "resource-limit",
        re.compile(
            r"^\s*\w*_best\s*[=:]\s*0\s*$|"
            r"(?i:\bno (?:usable|valid|suitable|fitting|feasible) (?:tile|kernel|launch|block|tactic)[ _-]?config\w*)"
        ),
    ),
    # a kernel source file or directory of ANOTHER arch in the failing line (".../attention/hopper/prefill_sm90.cuh",
    # "sm100_gemm.cu"): that arch's path was reached; it says more than the thin shared-memory reading of a refused
    # attribute (invalid argument), so it comes first. The GPU the log shows still decides SM12x.
    (
        "arch-path-unsupported",
        re.compile(
            r"^(?=.*(?i:\binvalid (?:argument|value)\b|\bnot supported\b|\bunsupported\b)).*?"
            r"(?i:[/\\](?:hopper|sm_?(?:90|100|103|110)[af]?)[/\\][\w/\\.-]*\.(?:cuh|cu|hpp|h|cc|cpp)\b|"
            r"[/\\_](?:\w+_)?sm_?(?:90|100|103|110)[af]?(?:_\w+)?\.(?:cuh|cu|hpp)\b)"
        ),
    ),
    (
        "resource-limit",
        re.compile(
            r"[Oo]ut ?[Oo]f ?[Rr]esources?|out of resource|too many resources|shared memory|\bsmem\b|dynamic shared\b|"
            r"cudaErrorLaunchOutOfResources|CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES|cluster (?:size|shape|dims)|"
            r"cudaErrorClusterOutOfResources|exceeds? (?:the )?(?:per-block|hardware|device) limit|"
            r"registers? (?:per|exceed)|MaxDynamicSharedMemorySize|maximum (?:number of )?threads|"
            r"too many blocks in cooperative launch|cudaErrorCooperativeLaunchTooLarge|"
            r"cudaFuncSetAttribute.{0,120}invalid argument",
        ),
    ),
    (
        "kernel-fault",
        re.compile(
            r"[Ii]llegal (?:[Ii]nstruction|[Mm]emory [Aa]ccess|[Aa]ddress)|[Mm]isaligned\b.{0,30}address|"
            r"unspecified launch failure|Invalid __(?:global|shared|local)__ (?:read|write)|"
            r"STATUS_EXECUTION_FAILED|cudaErrorIllegal\w+|cudaErrorLaunchFailure|cudaErrorMisalignedAddress|CUDA_ERROR_ILLEGAL_\w+|"
            r"CUDA_ERROR_LAUNCH_FAILED|CUDA_ERROR_(?:MISALIGNED_ADDRESS|LAUNCH_TIMEOUT|ASSERT|HARDWARE_STACK_ERROR|INVALID_PC|"
            r"INVALID_ADDRESS_SPACE|ILLEGAL_INSTRUCTION)\b|cudaError(?:HardwareStackError|InvalidPc)\b|"
            r"[Dd]evice-side assert|\b[Kk]ernel launch (?:failure|failed)\b|"
            r"\bXid\b|[Ww]arp (?:[Ii]llegal|[Oo]ut[- ]of[- ]range|[Mm]isaligned)|"
            r"an? (?:unspecified )?launch (?:failure|failed)|cudaErrorAssert|unknown error.{0,20}CUDA|"
            r"Segmentation fault.{0,40}(?:cuda|kernel)|trap instruction|launch timed out|cudaErrorLaunchTimeout|"
            r"on (?:global|shared|local) address space|cudaErrorInvalidAddressSpace|Hardware (?:stack|exception)",
        ),
    ),
    (
        "arch-path-unsupported",
        re.compile(
            r"[Uu]nsupported (?:CUDA |GPU |compute )?"
            r"(?:architecture|arch\b|SM\b|GPU|device|compute capability|capabilit(?:y|ies)|hardware)|"
            r"\bis_sm\d+\w*.{0,60}to be true|(?:GPU|device|architecture|platform) (?:is )?not (?:yet )?supported|"
            r"sm_?\d+[af]? (?:is )?not supported|"
            r"not (?:yet )?supported (?:on|for|by) (?:this|the current|your|current)? ?"
            r"(?:GPU|device|arch|platform|hardware|SM)|"
            r"(?:only|not) supported (?:on|for) "
            r"(?:SM ?\d|sm_?\d|Hopper|Blackwell|H100|B200|(?:GPUs?|devices?|cards?) with)|"
            # a build script (setup.py, CMake) that refuses the arch list it was given, or lists what it accepts
            r"\bNone of the (?:\w+ ){0,3}arch\w*\b.{0,120}\b(?:is|are) supported|"
            r"[Ss]upported (?:CUDA |GPU |compute )?(?:archs?|architectures?|capabilit\w+) (?:are|is|include)\b|"
            # the GPU or its architecture refused, in Chinese, Japanese or Korean
            r"(?:架构|架構|アーキテクチャ|아키텍처|显卡|顯卡|GPU|设备|設備|デバイス)\S{0,8}"
            r"(?:不受支持|不支持|不被支持|未対応|非対応|サポートされていません|지원되지 않)|"
            # hardware of one arch family only (tcgen05/TMEM/UMMA: SM100/SM103; wgmma: SM90a) in the failing line
            r"\b(?:tcgen05|TMEM|tmem_\w+|UMMA|umma_\w+|wgmma|WGMMA|warpgroup[_ ]mma)\b|"
            # a dispatch table keyed by the arch has no entry for this GPU
            r"\bKeyError:\s*['\"(]?(?:sm_?\d{2,3}[af]?|SM ?\d{2,3}|compute_\d{2,3}[af]?|\d{1,2}, ?\d|"
            r"\d{1,2}\.\d[af]?)['\")]?\s*$|"
            r"\bonly supports? (?:SM|sm_|Hopper|Blackwell|H100|B200|compute capability|GPUs?)|"
            r"\bonly supports? (?:\w+[ -]){1,3}(?:GPUs?|devices?|arch\w*|cards?)\b|"
            r"(?:Ampere|Hopper|Ada|Turing|Volta|Blackwell)(?: GPUs?)? (?:or|and) (?:newer|later|above)|"
            r"requires? (?:an? )?(?:SM ?\d+|sm_?\d+|Hopper|Blackwell|compute capability|device with capability|GPU)|"
            r"No supported CUDA architectures|"
            r"[Cc]ompute capability.{0,40}(?:not supported|too (?:new|old)|unsupported)|"
            r"\(too new\)|No operator found|not supported because|No (?:valid |available )?(?:\w+ )?backend|"
            r"(?i:\bno (?:usable|suitable|compatible|supported|working|available) (?:\w+ ){0,3}"
            r"(?:backends?|kernels?|implementations?)\b)|"
            r"(?i:\bnone of the (?:\w+ ){0,3}(?:backends?|kernels?|implementations?) (?:is |are )?"
            r"(?:usable|available|supported))|"
            # a feature only one arch-specific library provides (FlashAttention 3 is Hopper's, FlashMLA/DeepGEMM
            # SM90/SM100's): "X is only supported in FlashAttention 3", "requires FA3"
            r"(?:only (?:be )?(?:supported|available|implemented) (?:in|with|by|through)|requires?|needs?) "
            r"(?:the )?(?:FlashAttention[- ]?3|[Ff]lash[_ -][Aa]ttn[_ -]?3|FA3|FlashMLA|flash_mla|DeepGEMM|"
            r"deep_gemm)\b|"
            r"does not support (?:the )?(?:current )?(?:GPU|device|arch|sm)|[Ss]upported (?:archs?|architectures?):|"
            r"is not supported on (?:SM|sm_)|SM\d+[a-z]?[- ]only|sm_?\d+a?[- ]only|"
            r"No kernel (?:found|available)|no (?:suitable|matching) kernel|_STATUS_NOT_SUPPORTED\b|"
            r"without targeting appropriate compute capability|[Aa]rch conditional|"
            r"not supported on [\d.+x ]+arch|cutlass cannot initialize|[Ff]ailed to initialize cutlass|"
            r"(?:Could not|cannot|can't|unable to) find (?:a |any )?(?:valid|suitable|matching) "
            r"(?:config|kernel|tactic|algorithm|implementation)|"
            r"NOT_SUPPORTED\b|"
            # no kernel (or implementation, tactic) to be found for the problem on this GPU, in any order of words
            r"(?i:(?:could not|couldn't|cannot|can't|unable to|failed to) find (?:a |an |any |the )?(?:\w+ ){0,2}"
            r"(?:kernels?|implementations?|tactics?)\b)|(?i:\b(?:kernels?|implementations?|tactics?) "
            r"(?:\w+ ){0,3}(?:was |were |is |are )?not found\b)|"
            r"not (?:yet )?(?:implemented|available|supported|enabled) (?:on|for|with|in) .{0,40}"
            # an arch word must follow (not "for head size 512 on this GPU")
            r"(?:\bSM ?\d|sm_?\d|capabilit|\barch\b|architecture|Blackwell|Hopper|GeForce|RTX)|"
            r"(?:GPUs?|devices?|architectures?|archs?|SMs?|cards?) (?:is |are )?not (?:yet )?supported|"
            r"[Ee]xpected (?:a )?(?:device |GPU )?(?:compute )?capability|"
            r"[Ee]xpected (?:SM|sm_?)\d|[Nn]o (?:suitable |matching |compatible |valid )?kernels? (?:found )?for|"
            r"(?:does not|doesn't|do not|don't) support (?:SM ?\d|sm_?\d|compute capability|capability|this arch|arch)|"
            r"(?:only|not) (?:be )?(?:supported|available|run) on "
            r"(?:SM ?\d|sm_?\d|compute capability|Hopper|datacenter)|"
            # an assertion or check on the capability ("Assertion major < 10 failed", "assert is_sm100_supported()")
            r"(?i:\b(?:assert\w*|check\w*)\b.{0,100}\b\w*(?:major|minor|capabilit\w*|compute_?cap\w*|\bcc|"
            r"sm_?ver\w*|arch\w*)\s*(?:[<>]=?|==|!=)\s*\d+)|"
            r"\bassert\b.{0,120}(?:\bis_sm\d+\w*|\bis_(?:hopper|blackwell|ampere)\w*|get_device_capability|"
            r"_sm\d{2,3}\w*\(\))|"
            r"(?i:computeCapability|compute capability) (?:is )?not supported",
        ),
    ),
    (
        "communication",
        re.compile(
            r"\bNCCL\b|nccl\w*Error|\bGloo\b|ProcessGroup|\bc10d\b|DistBackendError|DistNetworkError|"
            r"peer access|cudaErrorPeerAccess|\bP2P\b|all_?reduce|all_?gather|\bRDMA\b|\bibverbs\b|"
            r"rendezvous|Connection (?:reset|closed) by peer|collective operation timeout|Watchdog caught",
        ),
    ),
    (
        "environment",
        re.compile(
            r"ImportError|ModuleNotFoundError|No module named|undefined symbol|cannot open shared object|"
            r"\.so(?:\.\d+)*: cannot|FileNotFoundError|No such file or directory|not installed|"
            r"driver version is insufficient|cudaErrorInsufficientDriver|CUDA_ERROR_NO_DEVICE|no CUDA-capable device|"
            r"CUDA driver version|unsatisfied condition|update your (?:NVIDIA )?driver|"
            r"(?:version|versions) (?:mismatch|conflict|incompatible)|"
            r"requires? \w[\w-]* ?[<>=]=?\s*\d|"
            r"GLIBC|Permission denied|PermissionError|Address already in use|Connection refused|"
            r"\b40[13]\b|[Tt]okenizer|AttributeError: module|has no attribute|incompatible with|"
            r"not found in|Could not find|pip install|No CUDA GPUs are available|"
            # a file or component a module needs, not where it was looked for ("libdevice not found at ./x.bc")
            r"\bnot found at [./~\w$]|\b(?:is|are) required by\b.{0,100}\bbut (?:was|were) not found\b|"
            r"Found no NVIDIA driver|ValueError: .{0,60}(?:model|config|argument)|is not a valid|"
            r"communicate with the NVIDIA driver|NVIDIA driver.{0,40}(?:not|isn't) (?:loaded|running|installed)|"
            r"probe routine failed|None of the NVIDIA devices|nvidia-container-cli|libnvidia-ml|NVML|"
            r"system not yet initialized|driver initialization failed|cudaGetDeviceCount|CUDA_ERROR_NOT_INITIALIZED|"
            r"cudaErrorInitializationError|busy or unavailable|cudaErrorDevicesUnavailable|initialization error|"
            r"driver (?:on your system )?is too old|cudaErrorNoDevice|CUDA_ERROR_NO_DEVICE|no CUDA GPUs|"
            # a library loaded at another version than the code was built against (cuDNN 8 vs 9, ...)
            r"but (?:the )?source was compiled with|[Ll]oaded runtime \w+ library:? [\d.]+ but|"
            r"is_available\(\)\W{0,4}(?:returned |returns |is |==\s*)?False|CUDA available:? False",
        ),
    ),
    # the GPU itself said not to support what the code asks for ("this GPU does not support TMA"), checked last so
    # that peer access, IPC and the like stay a communication or environment failure
    (
        "arch-path-unsupported",
        re.compile(
            r"\b(?:GPU|device|card|hardware|architecture)s? (?:\w+ ){0,2}"
            r"(?:does not|doesn't|do not|don't|cannot|can't) (?:support|run|execute)\b"
            r"(?!.{0,40}(?i:peer|P2P|IPC|NVLink|multicast|unified memory|managed memory))"
        ),
    ),
)

# A library's name in a traceback frame, an extension path, or a log prefix.
_LIBRARIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("flashinfer", re.compile(r"(?<![a-z])flashinfer(?![a-z])", re.I)),
    ("sgl_kernel", re.compile(r"\bsgl[_-]kernel\b")),
    ("deep_gemm", re.compile(r"\bdeep_?gemm\b", re.I)),
    ("flash_mla", re.compile(r"\bflash_?mla(?:_\w+)?\b", re.I)),  # and its extension (flash_mla_cuda.*.so)
    ("tilelang", re.compile(r"\btilelang\b", re.I)),
    ("vllm._C", re.compile(r"\bvllm(?:/|\.)_(?:C|moe_C)\b|_custom_ops")),
    (
        "cutlass",
        re.compile(
            r"(?i:(?<![a-z])cutlass(?![a-z]))|"  # and its status strings (cutlassGetStatusString)
            r"\bError (?:Internal|Not Supported|Invalid Problem|Misaligned Operand|Workspace Null|Arch Mismatch)\b"
        ),
    ),
    ("tensorrt_llm", re.compile(r"\btensorrt_llm\b|\bTensorRT-LLM\b|\btrtllm\w*|\bTllm\w+|\btrt_llm\b")),
    ("tensorrt", re.compile(r"\btensorrt\b|\bTensorRT\b|\[TRT\]|\bnvinfer\w*")),
    ("xformers", re.compile(r"\bxformers\b")),
    # ggml's own attention kernels (flash_attn_ext_f16, fattn-*.cu) before FlashAttention's name, which they share
    ("llama.cpp/ggml", re.compile(r"\bggml\w*|llama\.cpp|\bllama-server\b|\bflash_attn_ext\w*|\bfattn\b")),
    ("flash_attn", re.compile(r"\bflash_attn\w*|flash[-_ ]?attention|\bFA3\b", re.I)),
    ("bitsandbytes", re.compile(r"\bbitsandbytes\b")),
    ("fbgemm", re.compile(r"\bfbgemm\w*")),
    ("nunchaku", re.compile(r"\bnunchaku\b")),
    ("triton", re.compile(r"(?<![a-z])triton(?![a-z])")),
    ("transformer_engine", re.compile(r"(?i:\btransformer[_ -]?engine\b)")),
    ("CUDA.jl", re.compile(r"\bCUDA\.jl\b|\bCuModule\b|\bcudadrv\b|\.julia[/\\]packages[/\\]CUDA\b")),
    # (also inside a wrapper's name: "_sageattn_int8", "my_sageattn_forward")
    ("sageattention", re.compile(r"sage_?attention\w*|sageattn\w*|\bspas_sage\w*|\bspargeattn\b", re.I)),
    ("deep_ep", re.compile(r"\bdeep_ep\b")),
    ("torchao", re.compile(r"\btorchao\b")),
    ("liger_kernel", re.compile(r"\bliger_kernel\b")),
    ("quantization kernels", re.compile(r"\b(?:awq|exllama\w*|marlin\w*|auto_gptq|gptqmodel|vptq|hqq|aqlm)\b")),
    ("fla", re.compile(r"\bfla/(?:ops|modules)\b|\bfla\.ops\b")),
    ("cupy", re.compile(r"\bcupy\w*")),
    ("apex", re.compile(r"\bapex/|\bapex\.|amp_C\b|fused_\w+_cuda\b")),
    ("tiny-cuda-nn", re.compile(r"\btinycudann\b|tiny-cuda-nn")),
    ("gsplat", re.compile(r"\bgsplat\b|diff_gaussian_rasteri[sz]ation|simple_knn")),
    ("nvdiffrast", re.compile(r"\bnvdiffrast\b")),
    ("quack", re.compile(r"\bquack/|\bquack\.")),
    ("CuTe DSL", re.compile(r"\bcutlass\.cute\b|\bcute_dsl\w*|\bcpasync\b|\bcute\.(?:nvgpu|arch|runtime)\b")),
    # NCCL and its plugins (libnccl-net.so, libnccl-profiler.so): one library to upgrade
    ("nccl", re.compile(r"\bNCCL\b|\bnccl(?:[A-Z]\w*|_\w+)?\b|\blibnccl[\w.-]*")),
    ("CUDA math libraries", re.compile(r"(?i:\bcu(?:BLAS|BLASLt|DNN|SPARSE|FFT|SOLVER|RAND)\w*)")),
    # other compiled runtimes, each by its own name (the package to upgrade or rebuild)
    ("ctranslate2", re.compile(r"\bctranslate2\b")),
    ("paddle", re.compile(r"\bpaddle\b|\bPaddlePaddle\b")),
    ("lmdeploy", re.compile(r"\bturbomind\b|\blmdeploy\b")),
    ("ktransformers", re.compile(r"\bktransformers\b")),
    ("numba", re.compile(r"\bnumba\b")),
    ("tvm", re.compile(r"\btvm\b")),
    ("mlc_llm", re.compile(r"\bmlc_llm\b")),
    ("taichi", re.compile(r"\btaichi\b")),
    ("mxnet", re.compile(r"\bmxnet\b")),
    ("mindspore", re.compile(r"\bmindspore\b")),
    ("jittor", re.compile(r"\bjittor\b")),
    ("llama_cpp", re.compile(r"\bllama_cpp\b")),
    # a compiled extension of any project (foo/_C.so, foo_cuda, foo_kernels, torch.ops.foo)
    (
        "a compiled extension",
        re.compile(
            r"(?<!torch)(?:/|\.)_C\b|(?:^|[/\\.\s'\"])(?!(?:is|to|use|has|with|on|no)_)[a-z]\w*_(?:cuda|kernels?|ext)"
            r"(?=[/\\.]|$)|torch\.ops\.(?!(?:aten|prims|higher_order|inductor|_c10d_functional)\b)\w+"
        ),
    ),
    ("mamba_ssm", re.compile(r"\bmamba_ssm\b|causal_conv1d")),
    # ONNX Runtime's own wording for a node that failed ("Non-zero status code returned while running Cast node.")
    (
        "onnxruntime",
        re.compile(r"\bonnxruntime\w*|\bONNX ?Runtime\b|\bort::|status code returned while running \w+ node"),
    ),
    ("jax", re.compile(r"\bjaxlib\b|\bjax\b|\bXLA\b")),
    ("tensorflow", re.compile(r"\btensorflow\b")),
    ("vllm", re.compile(r"\bvllm\b")),
    ("sglang", re.compile(r"\bsglang\b")),
    ("torch", re.compile(r"\btorch\b")),
)
# lower-case words every library pattern above needs, for the prefilter (prefilter.py)
LIBRARY_WORDS = (
    "flashinfer", "sgl_kernel", "sgl-kernel", "deep_gemm", "deepgemm", "flash_mla", "flashmla", "vllm/_",
    "vllm._", "_custom_ops", "cutlass", "tensorrt", "trtllm", "tllm", "trt_llm",
    "[trt]", "nvinfer", "xformers", "flash_attn", "flash-attention",
    "flash attention", "flash_attention", "bitsandbytes", "fbgemm", "nunchaku", "triton", "ggml", "llama.cpp", "fattn",
    "llama-server", "transformer_engine", "transformerengine", "transformer engine", "transformer-engine", "cuda.jl",
    "cumodule", "cudadrv", ".julia", "flashattention", "fa3",
    "sageatt", "sage_att", "sageattn", "spas_sage", "sparge", "deep_ep",
    "torchao", "liger_kernel", "awq", "exllama", "marlin", "gptq", "vptq", "hqq", "aqlm", "fla/", "fla.", "cupy",
    "apex", "amp_c", "tinycudann", "tiny-cuda-nn", "gsplat", "gaussian_rasteri", "simple_knn", "nvdiffrast", "quack",
    "_c.", "/_c/", "_cuda", "_kernel", "_ext", "torch.ops.", "mamba_ssm", "causal_conv1d", "ctranslate2", "paddle",
    "turbomind", "lmdeploy", "ktransformers", "numba", "tvm", "mlc_llm", "taichi", "mxnet", "mindspore", "jittor",
    "llama_cpp", "cpasync", "cute_dsl", "cutlass.cute", "cute.nvgpu", "cute.arch", "cute.runtime",
    "cublas", "cudnn", "cusparse", "cufft", "cusolver", "curand", "onnxruntime", "onnx runtime", "onnxrun", "ort::",
    "status code returned while running",
    "nccl", "jax", "xla",
    "tensorflow", "tilelang",
    "vllm", "sglang", "torch",
)  # fmt: skip
# one search for any of them (and CUTLASS's status strings) before the per-library patterns: most lines name none
_ANY_LIBRARY = re.compile(
    trie_pattern(
        [*LIBRARY_WORDS, "error internal", "error not supported", "error invalid problem", "error misaligned operand"]
        + ["error workspace null", "error arch mismatch"]
    )
)
_LIB_PREFIX = re.compile(r"(?<![A-Za-z])lib(?=[a-z])")  # libflashinfer.so, libggml-cuda.so: the library's name
_FRAME = re.compile(r'(?:^|\s)File "(?P<path>[^"]+)", line \d+')

# Architecture tokens a line names (the GPU a path was written for, or the GPU itself).
_ARCH = re.compile(
    r"(?<![A-Za-z0-9])sm_?(?P<sm>\d{2,3}[af]?)(?![0-9])|\bSM ?(?P<SM>\d{2,3})[af]?\b|"
    r"(?<![A-Za-z0-9_])sm ?[=:] ?(?P<smeq>\d{2,3}[af]?)(?![0-9.])|"  # a C++ engine's key=value dump: "sm=70"
    r"\bcompute_(?P<cc>\d{2,3})[af]?\b|"
    r"(?-i:(?<=[a-z])Sm(?P<cam>\d{2,3})[af]?)(?![0-9])|"  # CamelCase kernel names: GemmSm100, FmhaSm90
    r"[Cc]apability\D{0,6}(?P<maj>\d{1,2})[.,] ?(?P<min>\d|x)\b|"
    r"(?P<cmp>[Cc]apability\s*(?:[<>]=?|==|!=|\u2265|\u2264)\s*\d{1,3}(?:\.\d)?)|"
    r"\b(?P<named>Hopper|Blackwell datacenter|datacenter Blackwell)\b|"
    r"major versions \[(?P<majors>[\d, ]+)\]",
    re.I,
)
_SM12X_TOKEN = re.compile(
    r"(?<![0-9])sm_?12[01][af]?(?![0-9])|(?<![A-Za-z0-9_])sm ?[=:] ?12[01][af]?(?![0-9.])|"
    r"\bSM ?12(?:[01]|\.[01])\b|compute_12[01]|(?-i:(?<=[a-z])Sm12[01])(?!\d)|"
    r"[Cc]apability\D{0,12}12[.,] ?[01]\b|\(12, ?[01]\)|"
    r"\b12\.[01]\+? arch|\b(?:GPU|device|capability:?|arch(?:itecture)?|cc|got) (?:is |= ?|: ?)?(?:sm_?)?12[01]\b|"
    r"\b(?:got|found|have|has|is) (?:compute capability |capability |cc ?|SM ?)?12\.[01]\b|"
    r"[Cc]apability (?:\w+ ){0,5}is (?:sm_?)?12[01]\b|"
    # GPU names are logkind's: a GPU shown is not a failing line
    r"\b(?:GeForce|consumer|workstation) Blackwell\b|\bSM:? ?0x12[01]0\b",
    re.I,
)

# the arch a check got, after the list it expected ("expects arch to be one of [...], but got Arch.sm_121")
_GOT_SM12X = re.compile(r"\bbut (?:got|found|received|is|was)\W{0,3}(?:\w+\.)?(?:sm_?12[01][af]?|SM ?12[01])(?![0-9])")
# the arch a line says the device has ("got sm_89", "current device is SM90"): an SM12x token beside another
# arch so named is what the path requires, not the GPU
_DEVICE_ARCH = re.compile(
    r"\b(?:got|found|received|current (?:device|GPU|arch\w*)(?: is)?|device is|running on|detected)\W{0,3}"
    r"(?:\w+\.)?(?:sm_?(?P<sm>\d{2,3})[af]?|SM ?(?P<SM>\d{2,3})|(?:compute )?capability (?P<maj>\d{1,2})\.\d|"
    r"\((?P<tup>\d{1,2}), ?\d\))(?![0-9])|"
    r"(?:\bsm_?(?P<sm2>\d{2,3})[af]?|capability \(?(?P<maj2>\d{1,2})[.,] ?\d\)?) (?:found|detected)\b"
)


def _names_other_device(line: str) -> bool:
    m = _DEVICE_ARCH.search(line)
    if m is None:
        return False
    digits = m.group("sm") or m.group("SM") or m.group("sm2") or ""
    major = int(digits[:-1]) if digits else int(m.group("maj") or m.group("tup") or m.group("maj2"))
    return major != 12


# a target list that holds 12.x ("CUDA target architectures: 12.1a", TORCH_CUDA_ARCH_LIST="12.0")
_SM12X_TARGET = re.compile(r"(?i:arch\w*)\b.{0,40}(?<![\d.])12\.[01][af]?(?![\d.])")

# Backend choices the launch made (flags, env vars, server-args dumps).
_FLAGS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("--attention-backend", re.compile(r"(?:--attention[-_]backend[= ]|attention_backend=['\"]?)(?P<v>[\w.-]+)")),
    (
        "--prefill-attention-backend",
        re.compile(r"(?:--prefill[-_]attention[-_]backend[= ]|prefill_attention_backend=['\"]?)(?P<v>[\w.-]+)"),
    ),
    (
        "--decode-attention-backend",
        re.compile(r"(?:--decode[-_]attention[-_]backend[= ]|decode_attention_backend=['\"]?)(?P<v>[\w.-]+)"),
    ),
    ("--moe-runner-backend", re.compile(r"(?:--moe[-_]runner[-_]backend[= ]|moe_runner_backend=['\"]?)(?P<v>[\w.-]+)")),
    ("--moe-backend", re.compile(r"(?:--moe[-_]backend[= ]|\bmoe_backend=['\"]?)(?P<v>[\w.-]+)")),
    ("--quantization", re.compile(r"(?:--quantization[= ]|\bquantization=['\"]?)(?P<v>[\w.-]+)")),
    ("--kv-cache-dtype", re.compile(r"(?:--kv[-_]cache[-_]dtype[= ]|kv_cache_dtype=['\"]?)(?P<v>[\w.-]+)")),
    ("VLLM_ATTENTION_BACKEND", re.compile(r"VLLM_ATTENTION_BACKEND=(?P<v>\w+)")),
)
_UNSET = {"None", "none", "auto", "null", "''", ""}

_CUDA_ERROR = re.compile(
    r"\b(?P<name>cudaError\w+|CUDA_ERROR_\w+)\b|CUDA error(?: \d+)?: (?P<msg>[^(\n]{3,80})|"
    r"(?:error|code)[ =](?P<code>\d{2,3})\b"
)

_ATTENTION = ("attention", "attn", "fmha", "mla", "sdpa", "flash")
_MOE = ("moe", "expert", "fused_moe", "gemm")
_QUANT = ("fp4", "fp8", "quant", "scaled_mm", "marlin", "awq", "gptq", "mxfp")
# the words of an op's kind and the flags that pick its backend, in the order they are tried
_FLAG_KINDS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (_MOE, ("--moe-runner-backend", "--moe-backend")),
    (
        _ATTENTION,
        ("--attention-backend", "--prefill-attention-backend", "--decode-attention-backend", "VLLM_ATTENTION_BACKEND"),
    ),
    (_QUANT, ("--quantization",)),
)


# the kind of op a failing line names, for the backend flag that picks it when the log shows none set
_OP_WORDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("moe", re.compile(r"(?i)moe|expert|grouped[_ ]?gemm|group_gemm")),
    ("attention", re.compile(r"(?i)attention|attn|fmha|\bmla\b|_mla\b|\bmla_|sdpa")),
)
# a backend of that kind with kernels for SM12x in each framework (Triton's run on any GPU Triton knows), in the
# flags of the framework that wrote the log; both where the log names neither
_OTHER_BACKEND: dict[tuple[str, str], str] = {
    ("moe", "sglang"): "another MoE backend (--moe-runner-backend triton)",
    ("moe", "vllm"): "another MoE backend (--moe-backend triton)",
    ("moe", ""): "another MoE backend (SGLang --moe-runner-backend triton, vLLM --moe-backend triton)",
    ("attention", "sglang"): "another attention backend (--attention-backend triton)",
    ("attention", "vllm"): (
        "another attention backend (--attention-backend TRITON_ATTN; older vLLM: VLLM_ATTENTION_BACKEND=TRITON_ATTN)"
    ),
    ("attention", ""): (
        "another attention backend (SGLang --attention-backend triton, vLLM --attention-backend TRITON_ATTN, "
        "older vLLM VLLM_ATTENTION_BACKEND=TRITON_ATTN)"
    ),
    ("attention", "llama.cpp"): "flash attention off (llama.cpp -fa off; Ollama OLLAMA_FLASH_ATTENTION=0)",
}
# a backend of any kind, when the log names neither the op nor a flag
_ANY_BACKEND = {
    "sglang": "--attention-backend / --moe-runner-backend",
    "vllm": "--attention-backend / --moe-backend",
    "": "SGLang --attention-backend / --moe-runner-backend, vLLM --attention-backend / --moe-backend",
    "llama.cpp": "llama.cpp -fa off for its attention kernels, or a build with this GPU's arch",
}
# where the memory headroom is set
_HEADROOM = {
    "sglang": "--mem-fraction-static 0.8 and a smaller --context-length / --max-running-requests",
    "vllm": "--gpu-memory-utilization 0.8 and a smaller --max-model-len",
    "": "SGLang --mem-fraction-static 0.8, vLLM --gpu-memory-utilization 0.8 and a smaller --max-model-len",
    "llama.cpp": "a smaller context (-c) or fewer layers on the GPU (-ngl)",
}


def serving(framework: str | None, library: str | None = None) -> str:
    """The key of the tables above (and of advice.py's run without CUDA graphs): SGLang or vLLM when the log is
    theirs, llama.cpp when its kernels failed, else "" (name both servers)."""
    if library == "llama.cpp/ggml":
        return "llama.cpp"
    return framework if framework in ("sglang", "vllm") else ""


def op_kind(line: str, library: str | None, text: str) -> str | None:
    """ "moe" or "attention" when the failing line, then its library, then the lines around it name that kind of op."""
    for words in (line, library or "", text):
        for op, pattern in _OP_WORDS:
            if pattern.search(words):
                return op
    return None


@dataclass
class StructureFinding:
    """A cause at the level the evidence supports."""

    cls: str
    line_no: int
    line: str
    cue: str  # the words that showed the class
    library: str | None
    archs: list[str]
    flag: tuple[str, str] | None
    cuda_error: str | None
    sm12x_token: str | None
    thin: bool  # the class rests on a generic exception line, not on a telling phrase
    context: tuple[str, ...] = ()  # the lines just before it (the traceback): what advice reads for "where"
    op: str | None = None  # the kind of op that failed (op_kind), when the log names it

    def meaning(self) -> str:
        where = f" in {self.library}" if self.library else ""
        archs = [a for a in self.archs if not a.upper().startswith(("SM12", "SM_12", "CAPABILITY 12", "COMPUTE_12"))]
        if self.cls == "arch-path-unsupported" and archs:
            text = f"A path{where} written for {'/'.join(archs)} only was reached on a GPU it does not support"
        else:
            what = CLASSES[self.cls][1].format(where=where)
            text = what[0].upper() + what[1:]
        text += f" (class {self.cls})"
        if self.flag:
            text += f"; the flag that picks it is {self.flag[0]} {self.flag[1]}"
        if self.cuda_error:
            text += f" (CUDA: {self.cuda_error})"
        text += "."
        if self.thin:
            basis = f"from {self.cue}" if self.cue else "only from the failing line and the frames around it"
            text += f" The evidence is thin: no known signature names this failure; the class comes {basis}."
        else:
            text += f" No known signature names this line; the class comes from its wording ({self.cue!r})."
        return text


# A refusal word; next to an architecture token in the same line it shows an arch path (any wording).
_REFUSAL = re.compile(
    r"不支持|未支持|サポートされていません|サポートしていません|지원되지 않|지원하지 않|nicht unterstützt|"
    r"non pris en charge|non supporté|no (?:es )?(?:compatible|soportad[oa])|não (?:é )?suportad[oa]|не поддерживается|"
    r"[Uu]nsupported|not (?:yet )?(?:supported|implemented|available|enabled|compatible)|\b[Nn]o (?:\w+ )?kernels?\b|"
    r"\bnot an? (?:supported|valid|known)\b|"
    r"\bonly\b|\brequire[sd]?\b|\bneeds?\b|\b[Ee]xpect(?:s|ed)\b|\bmust be\b|\bnot (?:in|among)\b|"
    r"\bcan(?:not|'t) (?:run|support)\b|\b(?:not |un)usable\b|\bnone of\b.{0,60}\b(?:usable|available|supported)\b|"
    r"\b(?:does not|doesn't|do not|don't) (?:support|run)\b"
)


# Words that, next to an architecture token, say a build carries no code for it.
_MISSING = re.compile(
    r"\bmissing\b|not (?:compiled|built)\b|\bwithout\b|no (?:\w+ )?(?:image|binary|cubin|SASS)\b|"
    # a wheel or build for the GPU is what the message asks for
    r"corresponding wheel|install (?:the|a) (?:\w+ ){0,2}(?:wheel|build) (?:for|according)|"
    # the remedy half of a build-mismatch message: install (or build) a wheel, package or build made for the GPU
    r"(?i:\b(?:re)?(?:install|build|use)\b.{0,60}\b(?:wheel|package|build|binar\w+|version)s?\b.{0,30}"
    r"\b(?:built|compiled|made) (?:for|with))"
)


# CUDA error codes by number (runtime API; the driver API's CUresult agrees on these): a log that gives only
# the number ("Cuda error: 700", "CUDA failure 209") shows the class as much as the name would
_CUDA_CODE = re.compile(
    r"(?i:\bcu(?:da)?\w*?[ _]?(?:runtime |driver )?(?:error|failure|failed|result|status)\b\W{0,3}"
    r"(?:code\W{0,3})?(?P<code>\d{1,3})\b)"
)
CUDA_CODES = {
    "2": "out-of-memory",  # cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY
    "3": "environment",  # cudaErrorInitializationError / CUDA_ERROR_NOT_INITIALIZED
    "35": "environment",  # cudaErrorInsufficientDriver
    "100": "environment",  # no CUDA-capable device
    "98": "binary-lacks-arch",  # cudaErrorInvalidDeviceFunction
    "200": "binary-lacks-arch",  # invalid kernel image
    "209": "binary-lacks-arch",  # no kernel image / no binary for GPU
    "218": "binary-lacks-arch",  # invalid PTX
    "222": "toolchain-lacks-arch",  # unsupported PTX version (the driver's JIT is older than the PTX)
    "803": "environment",  # cudaErrorSystemDriverMismatch
    "804": "environment",  # forward compatibility on a GPU without it (a container's CUDA newer than the driver)
    "700": "kernel-fault",  # illegal address
    "701": "resource-limit",  # launch out of resources
    "702": "kernel-fault",  # launch timeout
    "710": "kernel-fault",  # device-side assert
    "715": "kernel-fault",  # illegal instruction
    "716": "kernel-fault",  # misaligned address
    "719": "kernel-fault",  # launch failure
}
# The CUDA runtime's error strings (fatal.CUDA_ONLY_STRINGS) that show a class; the GPU the log shows decides
# whether it is SM12x. A symbol the runtime cannot find in the module is most often a module with no code for
# the GPU (nothing of it loaded), said thinly (THIN_CUES). The rest ("invalid argument", "invalid resource
# handle") show no class: the structure answer reads them as bare failures.
CUDA_STRING_CLASSES = {
    "invalid device symbol": "binary-lacks-arch",
    "named symbol not found": "binary-lacks-arch",
    "invalid device function": "binary-lacks-arch",
    "invalid kernel image": "binary-lacks-arch",
    "device kernel image is invalid": "binary-lacks-arch",
    "no kernel image is available for execution on the device": "binary-lacks-arch",
    "a ptx jit compilation failed": "binary-lacks-arch",
    "the provided ptx was compiled with an unsupported toolchain": "toolchain-lacks-arch",
    "too many resources requested for launch": "resource-limit",
    "too many blocks in cooperative launch": "resource-limit",
    "unspecified launch failure": "kernel-fault",
    "the launch timed out and was terminated": "kernel-fault",
    "device-side assert triggered": "kernel-fault",
    "an illegal memory access was encountered": "kernel-fault",
    "an illegal instruction was encountered": "kernel-fault",
    "misaligned address": "kernel-fault",
    "invalid program counter": "kernel-fault",
    "hardware stack error": "kernel-fault",
    "operation not supported on global/shared address space": "kernel-fault",
    "limit is not supported on this architecture": "arch-path-unsupported",
    "peer access is not supported between these two devices": "communication",
    "peer mapping resources exhausted": "communication",
    "ptx jit compiler library not found": "environment",
    "ptx jit compilation was disabled": "environment",
    "cuda driver version is insufficient for cuda runtime version": "environment",
    "cuda driver is a stub library": "environment",
    "no cuda-capable device is detected": "environment",
    "cuda-capable device(s) is/are busy or unavailable": "environment",
    "all cuda-capable devices are busy or unavailable": "environment",
    "system has unsupported display driver / cuda driver combination": "environment",
    "forward compatibility was attempted on non supported hw": "environment",
    "api call is not supported in the installed cuda driver": "environment",
    "shared object symbol not found": "environment",
    "shared object initialization failed": "environment",
}
_CUDA_STRING_CLASS = re.compile("(?i:" + "|".join(re.escape(s) for s in CUDA_STRING_CLASSES) + ")")
THIN_STRINGS = frozenset({"invalid device symbol", "named symbol not found"})


def thin_cue(cue: str) -> bool:
    """A cue that shows its class only thinly (a CUDA error string several causes print)."""
    return cue.endswith("(a CUDA runtime error string)") and cue.split(" (a CUDA")[0].lower() in THIN_STRINGS


# a compiler's own source (MLIR/LLVM passes): an arch it refuses there is a toolchain that does not know the arch
_COMPILER_SOURCE = re.compile(r"\bmlir::|\bllvm::|/lib/(?:Dialect|Conversion|Target|Analysis)/|/Transforms/\w+\.cpp")


def driver_unreachable(body: str) -> bool:
    """The line says the program cannot reach the driver or any GPU (a real failure even when only warned)."""
    return bool(_DRIVER_UNREACHABLE.search(body))


@memo.per_line
def classify_line(body: str) -> tuple[str, str] | None:
    """(class, cue) for the words of one fatal line, or None when they show no class. Memoized: a bare
    exception searches the dozen lines before it, so each line of a traceback-dense log is asked ~12 times,
    and a crash-looping server's log repeats the same lines."""
    got = _classify_words(body)
    if got is not None and got[0] == "arch-path-unsupported" and _COMPILER_SOURCE.search(body):
        return "toolchain-lacks-arch", f"{got[1]} (inside the compiler: {_COMPILER_SOURCE.search(body).group(0)})"
    return got


def _classify_words(body: str) -> tuple[str, str] | None:
    for cls, pattern in _CUES:
        m = pattern.search(body)
        if m:
            return cls, m.group(0)
    code = _CUDA_CODE.search(body)
    if code and code.group("code") in CUDA_CODES:
        return CUDA_CODES[code.group("code")], code.group(0)
    text = _CUDA_STRING_CLASS.search(body)
    if text:  # the CUDA runtime's own error string (a C++ app prints it alone: "Error: invalid device symbol")
        return CUDA_STRING_CLASSES[text.group(0).lower()], f"{text.group(0)} (a CUDA runtime error string)"
    arch = _SM12X_TOKEN.search(body) or _ARCH.search(body)
    if arch:
        for r in _MISSING.finditer(body):
            if abs(r.start() - arch.start()) <= 80:
                return "binary-lacks-arch", f"{r.group(0)} ... {arch.group(0)}"
        for r in _REFUSAL.finditer(body):
            if abs(r.start() - arch.start()) <= 80:
                return "arch-path-unsupported", f"{r.group(0)} ... {arch.group(0)}"
    setting = _ARCH_SETTING.search(body)
    if setting:  # a build script or dispatch refused the arch list it was given
        for r in _REFUSAL.finditer(body):
            if abs(r.start() - setting.start()) <= 120:
                return "arch-path-unsupported", f"{r.group(0)} ... {setting.group(0)}"
    return None


_LineFacts = tuple[
    bool, "str | None", tuple[str, ...], "str | None", bool, "str | None", tuple[tuple[str, str], ...], "str | None"
]
# the package a frame's path is in (site-packages/NAME/, a ComfyUI custom node, a source checkout's NAME/NAME/),
# or the extension a line loads (NAME.cpython-312-x86_64-linux-gnu.so, libNAME.so): a library none of _LIBRARIES
# knows is still named from them
_PACKAGE_PATH = re.compile(r"(?:site|dist)-packages/(?P<pkg>[A-Za-z_][\w.-]*?)(?:-[\d.]+\.(?:egg|dist-info))?/")
_NODE_PATH = re.compile(r"custom_nodes/(?P<pkg>[\w.-]+)/")
_SO_NAME = re.compile(r"(?:^|[/\s'\"(])(?:lib)?(?P<pkg>[A-Za-z][\w-]*?)(?:\.cpython[\w.-]*|\.abi3)?\.so\b")
# packages a frame is in on any Python traceback: not where an arch failure is to be fixed
_NOT_A_LIBRARY = frozenset(
    {"torch", "python", "c10", "cuda", "cudart", "nvrtc", "stdc++", "c", "m", "dl", "pthread", "rt", "gcc_s"}
    | {"click", "typer", "uvicorn", "fastapi", "starlette", "asyncio", "concurrent", "multiprocessing", "threading"}
    | {"runpy", "importlib", "ctypes", "_pytest", "pytest", "IPython", "ipykernel", "accelerate", "nvidia"}
)


def package_in(line: str) -> str | None:
    """The package (or extension .so) a frame path or a loading line names, when it is not one every traceback
    passes through (torch, the Python runtime, a CLI wrapper)."""
    for pattern in (_NODE_PATH, _PACKAGE_PATH, _SO_NAME):
        if ("/" in line or ".so" in line) and (m := pattern.search(line)):
            name = m.group("pkg").split(".")[0].rstrip("-_")
            if name and name not in _NOT_A_LIBRARY and not name.startswith(("_distutils", "pip")):
                return name
    return None


@memo.per_line
def _line_facts(line: str) -> _LineFacts:
    """What one line shows, wherever it is in the log: (a traceback frame, the library it names, the archs it
    names, its text when it lists several archs, whether it targets SM12x, the SM12x token it names as the
    device's, the launch flags it sets). Evidence.feed places them at the line's number."""
    frame = _FRAME.search(line) if 'File "' in line else None
    text = _LIB_PREFIX.sub("", frame.group("path") if frame else line)
    library = None
    if _ANY_LIBRARY.search(text.lower()):
        library = next((name for name, pattern in _LIBRARIES if pattern.search(text)), None)
    archs = tuple(_arch_name(m) for m in _ARCH.finditer(line))
    listed = line.strip()[:200] if len(set(archs)) >= 3 else None
    target = bool(_SM12X_TOKEN.search(line) or _SM12X_TARGET.search(line))
    # an arch list names no GPU, except the arch a check says it got ("one of [...], but got sm_121"); a line
    # that names another arch as the device's names SM12x only as a requirement
    t = _SM12X_TOKEN.search(line) if len(archs) < 3 else _GOT_SM12X.search(line)
    if t is not None and _names_other_device(line):
        t = None
    flags: list[tuple[str, str]] = []
    if "backend" in line or "quantization" in line or "kv" in line or "VLLM_" in line:
        for flag, pattern in _FLAGS:
            fm = pattern.search(line)
            if fm and fm.group("v").strip("'\"") not in _UNSET:
                flags.append((flag, fm.group("v").strip("'\",")))
    package = package_in(frame.group("path") if frame else line) if library is None or library == "torch" else None
    return bool(frame), library, archs, listed, target, t.group(0) if t else None, tuple(flags), package


@dataclass
class Evidence:
    """Structural facts of a log, fed line by line (bounded memory)."""

    libraries: deque[tuple[int, str]] = field(default_factory=lambda: deque(maxlen=12))
    packages: deque[tuple[int, str]] = field(default_factory=lambda: deque(maxlen=12))
    archs: deque[tuple[int, str]] = field(default_factory=lambda: deque(maxlen=12))
    flags: dict[str, str] = field(default_factory=dict)
    sm12x_token: tuple[int, str] | None = None
    sm12x_tokens: deque[tuple[int, str]] = field(default_factory=lambda: deque(maxlen=16))
    last_frame: tuple[int, str] | None = None
    arch_list: tuple[int, str] | None = None  # the first line naming several archs (a build's target list)
    sm12x_target: bool = False  # the log builds or compiles for SM12x (a target list with 12.x in it)

    def feed(self, line_no: int, line: str) -> None:
        is_frame, library, archs, listed, target, token, flags, package = _line_facts(line)
        if package is not None:
            self.packages.append((line_no, package))
        if is_frame:
            self.last_frame = (line_no, line)
        if library is not None:
            self.libraries.append((line_no, library))
        self.archs.extend((line_no, a) for a in archs)
        if listed is not None and self.arch_list is None:
            self.arch_list = (line_no, listed)
        if target:
            self.sm12x_target = True
        if token is not None:
            self.sm12x_tokens.append((line_no, token))
            if self.sm12x_token is None:
                self.sm12x_token = (line_no, token)
        for flag, value in flags:
            self.flags[flag] = value

    def library_near(self, line_no: int, window: int = 60, after: int = 0) -> str | None:
        """The library of the innermost frame (or the last named) shortly before `line_no` (or, for
        C++ and Java-style traces, the `after` lines below it), preferring a kernel library over the
        frameworks and torch that call it."""
        near = [lib for n, lib in self.libraries if line_no - window <= n <= line_no + after]
        for lib in reversed(near):
            if lib not in ("torch", "vllm", "sglang"):
                return lib
        return near[-1] if near else None

    def package_near(self, line_no: int, window: int = 60, after: int = 0) -> str | None:
        """The package of the innermost frame (or the last extension loaded) shortly before `line_no` that no
        known library pattern names: where to act when library_near has nothing better than a framework."""
        near = [p for n, p in self.packages if line_no - window <= n <= line_no + after]
        return near[-1] if near else None

    def sm12x_token_near(self, line_no: int, before: int = 12, after: int = 6) -> str | None:
        """An SM12x token in the lines around `line_no` (a sanitizer names the kernel after the fault)."""
        return next((t for n, t in self.sm12x_tokens if line_no - before <= n <= line_no + after), None)

    def archs_near(self, line_no: int, window: int = 60, after: int = 0) -> list[str]:
        out: list[str] = []
        for n, a in self.archs:
            if line_no - window <= n <= line_no + after and a not in out:
                out.append(a)
        return out

    def flag_for(self, library: str | None, text: str, line: str = "") -> tuple[str, str] | None:
        """The launch flag whose choice most likely picked this path: the kind of op the failing line names
        first, then the library's kind (flash_attn is attention), then the lines around it (a MoE model's
        frames around a FlashAttention failure do not make it the MoE backend's)."""
        order: list[str] = []
        for words in (line, library or "", text):
            low = words.lower()
            for keys, flags in _FLAG_KINDS:
                if any(k in low for k in keys):
                    order += [f for f in flags if f not in order]
        for flag in order:
            if flag in self.flags:
                return flag, self.flags[flag]
        lib = (library or "").split(".")[0].lower()
        for flag, value in self.flags.items():
            if lib and lib.replace("_", "") in value.lower().replace("_", ""):
                return flag, value
        return None


def _arch_name(m: re.Match[str]) -> str:
    g = m.groupdict()
    if g.get("sm"):
        return f"sm_{g['sm']}"
    if g.get("SM"):
        return f"SM{g['SM']}"
    if g.get("smeq"):
        return f"sm_{g['smeq']}"
    if g.get("cam"):
        return f"SM{g['cam']}"
    if g.get("cc"):
        return f"compute_{g['cc']}"
    if g.get("maj"):
        return f"capability {g['maj']}.{g['min']}"
    if g.get("cmp"):
        return " ".join(g["cmp"].split())
    if g.get("majors"):
        return "majors [" + g["majors"].strip() + "]"
    return g.get("named") or m.group(0)


def library_in(line: str) -> str | None:
    """A kernel library the fatal line itself names (not the frameworks and torch around it)."""
    frame = _FRAME.search(line)
    text = _LIB_PREFIX.sub("", frame.group("path") if frame else line)
    for name, pattern in _LIBRARIES:
        if name in ("torch", "vllm", "sglang"):
            continue
        if pattern.search(text):
            return name
    return None


@memo.per_line
def has_arch_token(text: str) -> bool:
    """The text names a GPU architecture (sm_120, SM100, compute capability 9.0, Hopper, ...)."""
    return bool(_SM12X_TOKEN.search(text) or _ARCH.search(text))


def sm12x_token_in(text: str) -> str | None:
    """An SM12x token in a line that is not an arch list (a build's list names no GPU), or the arch a check
    says it got after listing the ones it accepts."""
    for line in text.splitlines():
        if len(_ARCH.findall(line)) >= 3:
            got = _GOT_SM12X.search(line)
            if got:
                return got.group(0)
            continue
        m = _SM12X_TOKEN.search(line)
        if m and not _names_other_device(line):
            return m.group(0)
    return None


def cuda_error_of(line: str) -> str | None:
    m = _CUDA_ERROR.search(line)
    if not m:
        return None
    return (m.group("name") or (m.group("msg") or "").strip() or f"code {m.group('code')}") or None


def next_step(
    cls: str, library: str | None, flag: tuple[str, str] | None, op: str | None = None, framework: str | None = None
) -> str:
    """What to try next for a class, naming the library and the flag when the log shows them (the flag of the op's
    kind when the log names the op but shows no flag set), in the flags of the framework that wrote the log
    (SGLang's or vLLM's; both when the log is neither's)."""
    lib = library or "the library in the traceback"
    fw = serving(framework, library)
    other = _OTHER_BACKEND.get((op or "", fw))
    if cls == "arch-path-unsupported":
        if flag:
            pick = f"relaunch with another {flag[0]} than {flag[1]} (one with kernels for this GPU)"
        elif other:
            pick = f"relaunch with {other}"
        else:
            pick = f"relaunch with a backend that has kernels for this GPU ({_ANY_BACKEND[fw]})"
        return f"This path in {lib} does not support the GPU: {pick}, or upgrade {lib} to a release with SM12x support."
    if cls == "binary-lacks-arch":
        return (
            f"Install a build of {lib} compiled for this GPU's arch (SM12x: CUDA 12.8+ builds, PyTorch from "
            "https://download.pytorch.org/whl/cu128 or newer; DGX Spark needs sm_121); `sm120patch preflight` "
            "lists what each installed package was built for."
        )
    if cls == "toolchain-lacks-arch":
        return (
            "Use a CUDA toolkit that knows the GPU (SM12x: CUDA >= 12.8, sm_121a needs CUDA 13) first on PATH; "
            "for Triton point TRITON_PTXAS_PATH at its ptxas, or upgrade Triton (>= 3.3 knows sm_120)."
        )
    if cls == "resource-limit":
        fallback = other or "another backend or smaller tiles for that kernel"
        pick = f"another {flag[0]} than {flag[1]}" if flag else fallback
        return (
            f"The kernel in {lib} was sized for a GPU with more shared memory (SM90/SM100: 228 KB; SM12x: 99 KB per "
            f"block): try {pick}, or upgrade {lib} to a release with configs for this GPU."
        )
    if cls == "kernel-fault":
        pick = (
            f", then try another {flag[0]} than {flag[1]}"
            if flag
            else (f", then try {other}" if other else ", then pick another backend for that op")
        )
        return f"Rerun with CUDA_LAUNCH_BLOCKING=1 to find the faulting kernel in {lib}{pick}; upgrade {lib}."
    if cls == "out-of-memory":
        return f"Leave more headroom: {_HEADROOM[fw]}; check nvidia-smi for other processes."
    if cls == "communication":
        return (
            "Rerun with NCCL_DEBUG=INFO; try NCCL_P2P_DISABLE=1 and --disable-custom-all-reduce; "
            "on SM12x NCCL >= 2.26.2."
        )
    if cls == "environment":
        return (
            "Install versions that belong together (`pip check`, the package's requirements); "
            "fix the named file or module."
        )
    return "Read the last traceback's exception line; rerun with CUDA_LAUNCH_BLOCKING=1 if a CUDA call is involved."
