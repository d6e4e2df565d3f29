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
from sm120patch.triage import classes as triage_classes
from sm120patch.triage import fixes, versions
from sm120patch.triage.choices import add_alternatives
from sm120patch.triage.classes import SM12X_CLASSES
from sm120patch.triage.diagnose import Diagnosis, Finding
from sm120patch.triage.versions import add_fixed_versions
from sm120patch.triage.workarounds import add_workarounds

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


# a library's own message that says what to do ('Please use "fp4" quantization for Blackwell GPUs.')
_OWN_WORDS = re.compile(
    r"(?i)\b(?:please (?:use|set|install|upgrade|update|try|pass|enable|disable|switch|reinstall)|"
    r"try (?:using|setting|passing|installing)|consider (?:using|setting|installing)|"
    r"you (?:can|may|should|must|need to) (?:use|set|pass|install|upgrade|switch))\b.{3,200}"
)
# the boilerplate of every CUDA error and PyTorch's generic pointer: true, but not this failure's fix
_BOILERPLATE = re.compile(r"(?i)CUDA_LAUNCH_BLOCKING|TORCH_USE_CUDA_DSA|pytorch\.org/get-started|file a bug|report")


def _own_words(text: str, f: Finding, d: Diagnosis) -> str | None:
    """The failing message itself says what to do: quote it first, it is the library's own answer."""
    m = _OWN_WORDS.search(f.line)
    if m is None or _BOILERPLATE.search(m.group(0)):
        return None
    return f'the error itself says what to do: "{m.group(0).strip()}"'


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
    if f.cls != "resource-limit" or f.details.get("library") == "nccl":  # NCCL's own kernels: its release fits them
        return None
    if _THREADS.search(text) and not _SMEM.search(text):
        return (
            "the kernel is launched with more threads (or registers) per block than this GPU gives: lower its "
            "block size (threads per block, BLOCK_SIZE / num_warps), or pick another backend for that op"
        )
    if "triton" in text.lower():
        return (
            "a Triton kernel's config asks for more shared memory than this GPU has per block (the limit the log "
            "gives): lower its num_stages (e.g. 2) or its tile sizes (BLOCK_M/BLOCK_N/BLOCK_K, TILE_SIZE), in the "
            "kernel's config or autotune list"
        )
    return (
        "the kernel's tile needs more shared memory than this GPU has per block (SM12x: about 99 KB, SM90/SM100: "
        "227 KB): pick a config with a smaller tile size / block size (e.g. K tile 64 instead of 128) or fewer "
        "pipeline stages (num_stages), or another backend for that op"
    )


# descriptive library labels (classes._LIBRARIES) that name no one package to upgrade
_NOT_A_PACKAGE = re.compile(r"^(?:a |an |the |CUDA math|quantization kernels)|\s")
# library labels whose project is released under another name ("llama.cpp/ggml" would read as a package "llama")
_RELEASED_AS = {
    "llama.cpp/ggml": "llama.cpp (or the Ollama / LM Studio build that bundles it)",
    "vllm._C": "vllm",
    "paddle": "PaddlePaddle (paddlepaddle-gpu)",
    "llama_cpp": "llama-cpp-python",
    "mlc_llm": "mlc-llm",
    "tvm": "Apache TVM",
}


def _upgrade(text: str, f: Finding, d: Diagnosis) -> str | None:
    """An SM12x path or binary missing from the library the frames name: later releases add archs. The code that
    failed may belong to a package no library pattern knows (a ComfyUI node pack, a miner, pysiglib): its owner,
    from the innermost frame, the error's own qualified name or the program's banner, is named first."""
    if f.cls not in ("arch-path-unsupported", "binary-lacks-arch", "kernel-fault", "resource-limit"):
        return None
    lib = f.details.get("library", "")
    package = _RELEASED_AS.get(lib) or (lib.split(".")[0] if lib and not _NOT_A_PACKAGE.search(lib) else "")
    owner = owner_of(f)
    owner = _RELEASED_AS.get(owner or "", owner)
    named = [n for n in (owner or "", package, d.framework or "") if n]
    if not named or named[0] == "torch":
        return None
    names = " and ".join({n.lower(): n for n in reversed(named)}[k] for k in dict.fromkeys(n.lower() for n in named))
    return (
        f"upgrade {names} to the newest release (pip install -U, or the project's newest image; a nightly build "
        "where no release has it yet): SM12x kernels and paths are added release by release; check its release "
        "notes or issues for sm_120/sm_121"
    )


def _rebuild(text: str, f: Finding, d: Diagnosis) -> str | None:
    """A binary without this GPU's arch: a build from source needs the arch in its list (CMake or torch)."""
    if f.cls != "binary-lacks-arch":
        return None
    spark = _spark(text, d)
    arch, dotted, cuda = ("121", "12.1", "12.9") if spark else ("120", "12.0", "12.8")
    return (
        f"built from source (or a wheel built elsewhere)? rebuild with this GPU's arch in the build's list, with "
        f'CUDA >= {cuda}: CMake projects -DCMAKE_CUDA_ARCHITECTURES={arch} (e.g. "89;{arch}" to keep others), '
        f'PyTorch extensions (setup.py) TORCH_CUDA_ARCH_LIST="{dotted}" then pip install --no-build-isolation .'
    )


# where the failing code lives: a frame's package, an error qualified by its module, the program's banner line
_FRAME_PATH = re.compile(r'^\s*File "(?P<path>[^"]+)"(?:, line (?P<line>\d+))?')
_SITE = re.compile(r"(?:site|dist)-packages[/\\](?P<pkg>[A-Za-z_][\w.-]*)")
_NODE_PACK = re.compile(r"custom_nodes[/\\](?P<pkg>[^/\\]+)")
_RELATIVE = re.compile(r"^(?P<pkg>[A-Za-z_]\w*)[/\\]\w+\.py$")  # a frozen app's frame: faster_whisper\transcribe.py
_NOT_OWNERS = {"torch", "huggingface_hub", "transformers", "accelerate", "typing", "importlib", "runpy", "threading"}
_QUALIFIED = re.compile(r"\b(?:[Ee]rror|[Ee]xception|[Ff]ailure) in (?P<pkg>[a-z_][a-z0-9_]{2,})\.[a-z_]\w*")
_BANNER = re.compile(r"^\s*(?P<name>[A-Za-z][\w-]{2,40}) v\d+\.\d+(?:\.\d+)?\b")


def frames(f: Finding) -> list[tuple[str, str]]:
    """(path, line) of each Python frame above the finding, outermost first."""
    return [(m.group("path"), m.group("line") or "") for m in map(_FRAME_PATH.match, f.context) if m]


def owner_of(f: Finding) -> str | None:
    """The package that owns the failing code: the innermost frame's (site-packages, a ComfyUI node pack, a frozen
    app's relative path; torch and the hub that call into it do not count), else a module the error line is
    qualified by ("Error in pysiglib.branched_sig_to_log_sig"), else the program's own banner ("krig-miner v1.1.0")."""
    for path, _ in reversed(frames(f)):
        norm = path.replace("\\", "/")
        m = _NODE_PACK.search(norm) or _SITE.search(norm) or _RELATIVE.match(path)
        if m is not None:
            pkg = m.group("pkg").removesuffix(".py")
            if pkg.split(".")[0] not in _NOT_OWNERS:
                return pkg
    m = _QUALIFIED.search(f.line)
    if m is not None and m.group("pkg") not in _NOT_OWNERS:
        return m.group("pkg")
    banner = next((m.group("name") for m in map(_BANNER.match, f.context[:5]) if m), None)
    return banner


_SETUP = re.compile(r"(?:^|[/\\])setup\.py$")
_CMAKE_TARGETS = re.compile(r"CUDA (?:supported )?target architectures: (?P<archs>[0-9][0-9.;a-z ]*)", re.I)


def _build_script(text: str, f: Finding, d: Diagnosis) -> str | None:
    """The failure is in a package's build: its setup.py or CMake arch guards have no case for this GPU."""
    if f.cls not in SM12X_CLASSES:
        return None
    setup = next(((p, n) for p, n in reversed(frames(f)) if _SETUP.search(p)), None)
    if setup is not None:
        where = f"{setup[0]}, line {setup[1]}" if setup[1] else setup[0]
        if f.cls == "toolchain-lacks-arch":  # the script knows the GPU; the CUDA it found is too old for it
            return (
                f"the failure is in the package's build script ({where}), which checks the CUDA toolkit it builds "
                "with: the one it found is too old for this GPU. Build with CUDA_HOME pointing at CUDA >= 12.8 "
                "(12.9+ for DGX Spark's sm_121) and that toolkit's nvcc first on PATH, matching your PyTorch's CUDA "
                "(python -c 'import torch; print(torch.version.cuda)')"
            )
        return (
            f"the failure is in the package's build script ({where}), in code that picks compiler flags by the GPU's "
            "capability: it has no case for this GPU (12.0 on RTX 50 / RTX PRO, 12.1 on DGX Spark). Add one (12.1 "
            "as 12.0, with -gencode arch=compute_121a,code=sm_121a) or build a release whose setup.py knows it"
        )
    given = next((m.group("archs").strip() for m in map(_CMAKE_TARGETS.search, [*f.context, f.line]) if m), None)
    if given is not None and triage_classes.SKIPPED_BUILD.search(text):
        return (
            f"the build was given the CUDA arch {given}, but its CMake arch guards (CMakeLists.txt) do not list it, "
            f"so it skipped those kernels: build a release whose CMakeLists.txt lists {given} (or add it to the "
            "guards of the kernels it skipped)"
        )
    return None


_SGLANG_MODULE = re.compile(r"sglang/srt/(?P<module>[\w/]+)\.py")
_IN_FUNCTION = re.compile(r"\bin (?P<func>[A-Za-z_]\w*)\s*$")


def _framework_check(text: str, f: Finding, d: Diagnosis) -> str | None:
    """An arch check of SGLang's own (a feature that lists the capabilities it runs on) refused this GPU: name the
    module, so the user can tell which launch option turns that feature on."""
    if f.cls != "arch-path-unsupported" or (f.details.get("library") or d.framework) != "sglang":
        return None
    lines = [ln for ln in f.context if _SGLANG_MODULE.search(ln.replace("\\", "/"))]
    if not lines:
        return None
    last = lines[-1].replace("\\", "/")
    module = _SGLANG_MODULE.search(last).group("module")  # type: ignore[union-attr]
    func = _IN_FUNCTION.search(last)
    where = f"sglang/srt/{module}.py" + (f" ({func.group('func')})" if func else "")
    return (
        f"the check that refused this GPU is SGLang's own, in {where}: the feature that module serves does not "
        "list this GPU; relaunch without the option that turns it on (diagnose --target names the release's "
        "options that match), or use a release whose check lists it"
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


# an app's own Python environment: a pipx venv is named for its package; a launcher's venv/ or embedded Python
# sits in the app's folder (stable-diffusion-webui/venv, ComfyUI_windows_portable/python_embeded)
_APP_ENV = re.compile(
    r"pipx[/\\]venvs[/\\](?P<pipx>[\w.-]+)[/\\]|"
    r"[/\\](?P<app>[A-Za-z][\w.-]+)[/\\](?:venv|python_embede?d|runtime[/\\]python)[/\\](?:lib|Lib)[/\\]"
)


def _app_environment(text: str, f: Finding, d: Diagnosis) -> str | None:
    """PyTorch without this GPU's arch, in an app's own environment: the app's release decides which PyTorch it
    brings, so name the app beside the PyTorch to install into that environment."""
    if f.cls != "binary-lacks-arch":
        return None
    near = "\n".join([*f.context[-6:], f.line, *f.after])
    if "torch" not in near.lower():
        return None
    m = _APP_ENV.search(near.replace("\\", "/"))
    if m is None:
        return None
    app = m.group("pipx") or m.group("app")
    return (
        f"this PyTorch is in {app}'s own environment ({m.group(0).strip('/')}): upgrade {app} to a release that "
        "brings a PyTorch built for CUDA 12.8+, or install one into that environment with its own pip "
        "(--index-url https://download.pytorch.org/whl/cu128)"
    )


_GRAPHS = re.compile(r"(?i)cuda ?graph|cudagraph|graph (?:capture|replay)|capturing")
# by classes.serving's key: the server that wrote the log, llama.cpp when its kernels failed, "" for neither
_NO_GRAPHS = {
    "vllm": "--enforce-eager",
    "sglang": "--disable-cuda-graph",
    "llama.cpp": "GGML_CUDA_DISABLE_GRAPHS=1",
    "": "vLLM --enforce-eager, SGLang --disable-cuda-graph",
}


def _graphs(text: str, f: Finding, d: Diagnosis) -> str | None:
    """A kernel fault in a serving framework: running without CUDA graphs tells a capture/replay fault from the
    kernel's own, and is the usual way to keep serving meanwhile."""
    if f.cls != "kernel-fault":
        return None
    if d.framework not in ("vllm", "sglang") and not _GRAPHS.search(" ".join([text, *f.context[-6:]])):
        return None
    flag = _NO_GRAPHS[triage_classes.serving(d.framework, f.details.get("library"))]
    return (
        f"to tell a fault of CUDA-graph capture or replay from the kernel's own, rerun without CUDA graphs: {flag} "
        "(slower; if it then runs, keep it while you report the fault)"
    )


_MATH = re.compile(r"(?i)\b(?P<lib>cublaslt|cublas|cudnn|cufft|cusparse|cusolver|curand)\b|CUBLAS_STATUS|CUDNN_STATUS")
_MATH_WHEEL = {"cublaslt": "nvidia-cublas", "cublas": "nvidia-cublas", "cudnn": "nvidia-cudnn"}


def _math_library(text: str, f: Finding, d: Diagnosis) -> str | None:
    """A CUDA math library (cuBLAS, cuDNN) refused or faulted on this GPU: its own releases add SM12x kernels, and a
    framework's other backend for the op avoids it."""
    if f.cls not in SM12X_CLASSES:
        return None
    m = _MATH.search(text)
    if m is None:
        return None
    lib = (m.group("lib") or ("cudnn" if "cudnn" in m.group(0).lower() else "cublas")).lower()
    name = {"cublaslt": "cuBLASLt", "cublas": "cuBLAS", "cudnn": "cuDNN"}.get(lib, lib)
    wheel = _MATH_WHEEL.get(lib, f"nvidia-{lib}")
    return (
        f"the call that failed is {name}'s, whose releases add SM12x kernels (CUDA 12.8's are the first for "
        f"Blackwell): upgrade {name} ({wheel}-cu12 from CUDA 12.8 on, or -cu13 for a CUDA 13 PyTorch; or a cu128+ "
        f"PyTorch / a framework image on CUDA 12.8+ that brings one), or avoid {name} for that op (another backend "
        "or dtype)"
    )


def _near(text: str, f: Finding, lines: int = 12) -> str:
    """The finding's text with the log lines just before it (its traceback, the build output that led to it)."""
    return "\n".join([*f.context[-lines:], text])


def _runtime_compiler(text: str, f: Finding, d: Diagnosis) -> str | None:
    """A module compiled at run time (CuPy, NVRTC, pycuda) with no code for the GPU: the CUDA whose compiler the
    package finds is older than the GPU, whatever the driver and the installed toolkit say."""
    if f.cls not in ("binary-lacks-arch", "toolchain-lacks-arch"):
        return None
    m = triage_classes.RUNTIME_COMPILE.search(_near(text, f))
    if m is None:
        return None
    return (
        f"the kernel was compiled at run time ({m.group(0)}) by the NVRTC/nvcc of the CUDA the package finds, which "
        "does not know this GPU (SM12x needs CUDA >= 12.8, sm_121 12.9): point it at a newer one (CUDA_PATH / "
        "CUDA_HOME, or pip install -U 'nvidia-cuda-nvrtc-cu12>=12.8'; CuPy: cupy-cuda12x with CUDA 12.8+, or "
        "cupy-cuda13x), then clear its kernel cache (~/.cupy/kernel_cache)"
    )


_ARCH_TABLE = re.compile(r"CUDA_SELECT_NVCC_ARCH_FLAGS|select_compute_arch|Unknown CUDA Architecture Name")


def _cmake_arch_table(text: str, f: Finding, d: Diagnosis) -> str | None:
    """CMake's FindCUDA arch table (CUDA_SELECT_NVCC_ARCH_FLAGS) in the project's own cmake files: written before
    two-digit majors, it cannot parse 12.0/12.1, and no toolkit upgrade changes a file the project ships."""
    if f.cls != "toolchain-lacks-arch" or not _ARCH_TABLE.search(_near(text, f)):
        return None
    return (
        "the arch table that refused it is the project's own CMake script (CUDA_SELECT_NVCC_ARCH_FLAGS, from "
        "FindCUDA's select_compute_arch.cmake, which predates 12.x), not the CUDA toolkit: build the project's "
        "latest source (its main/master branch where no release knows 12.x) or a release with a newer cmake/ "
        "folder, or give the build the arch list explicitly (CMAKE_CUDA_ARCHITECTURES=120 / 121, "
        'TORCH_CUDA_ARCH_LIST="12.0") so the table is not consulted'
    )


_XLA = re.compile(r"(?i)\btensorflow\b|\bxla\b|\bjaxlib\b|\bjax\b")


def _xla_compiler(text: str, f: Finding, d: Diagnosis) -> str | None:
    """XLA (TensorFlow, JAX) compiles its kernels with the LLVM and PTX version its own build bundles: the build
    must know Blackwell; a newer CUDA toolkit on PATH does not change what it emits."""
    if f.cls != "toolchain-lacks-arch" or not _XLA.search(_near(text, f)):
        return None
    return (
        "XLA compiles this GPU's kernels with the LLVM/PTX version bundled in the TensorFlow or jaxlib build, so "
        "the build itself must know Blackwell (sm_120, PTX ISA 8.7): install a TensorFlow / jaxlib release or "
        "nightly built with CUDA 12.8+ for Blackwell (jax[cuda12] / jax[cuda13], tf-nightly), or build TensorFlow "
        "from source with CUDA >= 12.8 and compute capability 12.0 in TF_CUDA_COMPUTE_CAPABILITIES"
    )


_NAMES_PYTORCH = re.compile(r"\bPyTorch\b|\btorch\.cuda\b")


def _spark(text: str, d: Diagnosis) -> bool:
    """The log shows a DGX Spark (sm_121, GB10), in the finding's text or the GPU evidence of the whole log."""
    return bool(_SM121.search(text) or _SM121.search(str((d.gpu.get("sm12x_evidence") or {}).get("line", ""))))


def _first_release(text: str, f: Finding, d: Diagnosis) -> str | None:
    """A library without this GPU's code in the installed build: the first release that has it (a row of
    patches/fixed_versions.toml, each with its source), by the names the finding shows for the library."""
    if f.sm12x == "no":  # the log shows another GPU: a release with SM12x code is not its fix
        return None
    names = [f.details.get("library", ""), owner_of(f) or ""]
    if _NAMES_PYTORCH.search(f.line):
        names.append("torch")
    math = _MATH.search(text)  # cuDNN's and cuBLAS's own status words name them
    if math is not None:
        names.append((math.group("lib") or math.group(0).split("_")[0]).lower())
    rows = versions.library_rows(names, f.cls, _spark(text, d), versions.default_table())
    if not rows:
        return None
    return "; ".join(r.note() for r in rows)


Rule = Callable[[str, Finding, Diagnosis], "str | None"]
RULES: tuple[Rule, ...] = (
    _own_words,
    _build_script,
    _framework_check,
    _flash_attention_3,
    _xformers,
    _resource_knobs,
    _rebuild,
    _flashinfer_jit,
    _runtime_compiler,
    _cmake_arch_table,
    _xla_compiler,
    _cuda_runtime,
    _socket,
    _app_environment,
    _graphs,
    _math_library,
    _first_release,
    _upgrade,
)


def add_evidence_advice(result: Diagnosis) -> None:
    """A note per rule whose cue the finding's line, its details or the fatal lines near it show."""
    around = [e.line for e in result.unnamed_errors]
    for f in result.causes:
        text = " ".join([f.line, *f.details.values(), *around, *f.after])
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
    step("add the known workarounds", lambda: add_workarounds(result))
    step("read the release's flag choices", lambda: add_alternatives(result, target))
    return result
