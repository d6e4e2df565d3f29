"""The machine: GPUs and their compute capability, driver, CUDA toolkit, torch.

`preflight` must work on a box without a GPU, without torch, and inside a broken
CUDA install, so every source is optional and time-boxed: NVML (pynvml, imported
lazily), then torch in a *subprocess* (importing torch here would cost seconds and
may initialise CUDA in the tool's own process), then nvidia-smi. `--arch` replaces
detection entirely, which is how CI and CPU-only boxes describe the target GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sm120patch.arch import Arch

TIMEOUT_S = 30.0

# Oldest CUDA toolkit whose nvcc accepts each gencode FlashInfer uses for an arch.
_MIN_CUDA = {
    (9, 0): (12, 0),
    (10, 0): (12, 8),
    (10, 3): (12, 9),
    (12, 0): (12, 8),  # compute_120a; FlashInfer prefers compute_120f, which needs 12.9
    (12, 1): (12, 9),  # compute_121a
}
_MIN_CUDA_FAMILY = {12: (12, 9)}  # compute_120f and other "f" targets


@dataclass
class Gpu:
    index: int
    name: str
    major: int
    minor: int
    source: str  # "nvml", "torch", "nvidia-smi", "--arch"

    @property
    def arch(self) -> Arch:
        return Arch(self.major, self.minor)

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "arch": self.arch.name}


@dataclass
class CudaToolkit:
    version: str | None = None  # "13.0"
    nvcc: str | None = None
    home: str | None = None
    source: str = ""  # where it was found

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class TorchInfo:
    python: str
    version: str | None = None
    cuda: str | None = None
    arch_list: list[str] = field(default_factory=list)
    cuda_available: bool | None = None
    error: str = ""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class Machine:
    gpus: list[Gpu]
    driver: str | None
    cuda: CudaToolkit
    torch: TorchInfo | None
    overridden: bool = False
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "gpus": [g.to_dict() for g in self.gpus],
            "archs": [a.name for a in archs_present(self)],
            "driver": self.driver,
            "cuda": self.cuda.to_dict(),
            "torch": self.torch.to_dict() if self.torch else None,
            "overridden": self.overridden,
            "notes": self.notes,
        }


def archs_present(machine: Machine) -> list[Arch]:
    """Distinct architectures on the machine, sorted (mixed GPUs give several)."""
    return sorted({g.arch for g in machine.gpus})


def _version_tuple(v: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", v or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def min_cuda_for(arch: Arch, family: bool = False) -> tuple[int, int]:
    """Oldest CUDA toolkit that can build for `arch` (family=True: the `f` target)."""
    if family and arch.major in _MIN_CUDA_FAMILY:
        return _MIN_CUDA_FAMILY[arch.major]
    return _MIN_CUDA.get((arch.major, arch.minor), (12, 9) if arch.major >= 10 else (11, 8))


def can_build_for(cuda: CudaToolkit, arch: Arch, family: bool = False) -> tuple[bool, str]:
    """Whether this toolkit's nvcc can emit code for `arch`, with the reason."""
    have = _version_tuple(cuda.version)
    need = min_cuda_for(arch, family)
    want = f"CUDA >= {need[0]}.{need[1]} for {arch.name}{'f' if family else ''}"
    if have is None:
        return False, f"no CUDA toolkit found; need {want}"
    if have < need:
        return False, f"CUDA {cuda.version} at {cuda.home or cuda.nvcc} is too old; need {want}"
    return True, f"CUDA {cuda.version} satisfies {want}"


def _run(
    cmd: Sequence[str], timeout: float = TIMEOUT_S, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError):
        return None


def _from_nvml() -> tuple[list[Gpu], str | None] | None:
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            gpus.append(Gpu(i, name, int(major), int(minor), "nvml"))
        return gpus, driver
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def parse_nvidia_smi(text: str) -> tuple[list[Gpu], str | None]:
    """Parse `--query-gpu=name,compute_cap,driver_version --format=csv,noheader`."""
    gpus, driver = [], None
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        m = re.fullmatch(r"(\d+)\.(\d+)", parts[1])
        if not m:
            continue
        gpus.append(Gpu(len(gpus), parts[0], int(m.group(1)), int(m.group(2)), "nvidia-smi"))
        driver = driver or parts[2]
    return gpus, driver


def _from_nvidia_smi() -> tuple[list[Gpu], str | None] | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    p = _run([exe, "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"])
    if p is None or p.returncode != 0:
        return None
    gpus, driver = parse_nvidia_smi(p.stdout)
    return (gpus, driver) if gpus else None


_TORCH_SCRIPT = r"""
import json, sys
out = {}
try:
    import torch
    out["version"] = torch.__version__
    out["cuda"] = torch.version.cuda
    try:
        out["arch_list"] = list(torch.cuda.get_arch_list())
    except Exception:
        out["arch_list"] = []
    gpus = []
    if "--gpus" in sys.argv:
        try:
            out["cuda_available"] = bool(torch.cuda.is_available())
            for i in range(torch.cuda.device_count() if out["cuda_available"] else 0):
                gpus.append([torch.cuda.get_device_name(i), *torch.cuda.get_device_capability(i)])
        except Exception as e:
            out["gpu_error"] = repr(e)
    out["gpus"] = gpus
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def torch_info(
    python: str | None = None, gpus: bool = False, timeout: float = TIMEOUT_S
) -> tuple[TorchInfo, list[Gpu]]:
    """torch version, CUDA version and arch list as `python` sees them, in a subprocess."""
    python = python or sys.executable
    info = TorchInfo(python=python)
    p = _run([python, "-c", _TORCH_SCRIPT] + (["--gpus"] if gpus else []), timeout=timeout)
    if p is None:
        info.error = f"{python}: did not answer within {timeout:.0f} s (or could not start)"
        return info, []
    try:
        out = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        info.error = f"{python}: exit {p.returncode}: {p.stderr.strip()[-300:]}"
        return info, []
    info.version, info.cuda = out.get("version"), out.get("cuda")
    info.arch_list = out.get("arch_list", [])
    info.cuda_available = out.get("cuda_available")
    info.error = out.get("error", "") or out.get("gpu_error", "")
    found = [Gpu(i, n, int(a), int(b), "torch") for i, (n, a, b) in enumerate(out.get("gpus", []))]
    return info, found


def parse_nvcc_version(text: str) -> str | None:
    m = re.search(r"release (\d+\.\d+)", text)
    return m.group(1) if m else None


def find_cuda() -> CudaToolkit:
    """nvcc on PATH, then $CUDA_HOME, $CUDA_PATH, /usr/local/cuda; version from `nvcc --version`."""
    candidates: list[tuple[str, str]] = []
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append((on_path, "PATH"))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append((str(Path(os.environ[var]) / "bin" / "nvcc"), f"${var}"))
    candidates.append(("/usr/local/cuda/bin/nvcc", "/usr/local/cuda"))
    for nvcc, source in candidates:
        if not os.access(nvcc, os.X_OK):
            continue
        p = _run([nvcc, "--version"])
        version = parse_nvcc_version(p.stdout) if p and p.returncode == 0 else None
        real = Path(nvcc).resolve()
        homes = [
            real.parent.parent,
            *(Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)),
            Path("/usr/local/cuda"),
        ]
        # nvcc on PATH may be a wrapper script: the toolkit is where the headers are
        home = next((h for h in homes if (h / "include" / "cuda_runtime.h").is_file()), None)
        return CudaToolkit(version, str(real), str(home) if home else None, source)
    return CudaToolkit()


def detect(
    arch_override: Sequence[Arch] | None = None,
    python: str | None = None,
    with_torch: bool = True,
    timeout: float = TIMEOUT_S,
) -> Machine:
    """Describe this machine; `arch_override` (from --arch) replaces GPU detection."""
    notes: list[str] = []
    torch, torch_gpus = torch_info(python, gpus=True, timeout=timeout) if with_torch else (None, [])
    gpus: list[Gpu] = []
    driver: str | None = None
    if arch_override:
        gpus = [Gpu(i, a.name, a.major, a.minor, "--arch") for i, a in enumerate(arch_override)]
        notes.append("GPUs given by --arch; detection skipped")
    else:
        nvml = _from_nvml()
        smi = None if nvml and nvml[0] else _from_nvidia_smi()
        if nvml and nvml[0]:
            gpus, driver = nvml
        elif torch_gpus:
            gpus = torch_gpus
        elif smi:
            gpus, driver = smi
        if not gpus:
            notes.append("no GPU found (NVML, torch, nvidia-smi); pass --arch sm_120 to plan for one")
    if driver is None and not arch_override:
        smi = _from_nvidia_smi()
        driver = smi[1] if smi else None
    return Machine(gpus, driver, find_cuda(), torch, bool(arch_override), notes)
