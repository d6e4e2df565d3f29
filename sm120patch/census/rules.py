"""Which GPU can run which compiled CUDA code: the loader's rules, stated once, with their sources.

The census (sm120patch/census/) reads what each extension carries (elf.py) and asks this module,
per GPU, whether the CUDA driver will find an image it can load. The rules are NVIDIA's,
not ours; each function cites where they are written:

[BIN] CUDA C++ Programming Guide, "Binary Compatibility"
      (https://docs.nvidia.com/cuda/cuda-c-programming-guide/#binary-compatibility; in the new
      CUDA Programming Guide, chapter 1.3 "The CUDA platform"; and each architecture's
      compatibility guide, "Application Compatibility": "Each cubin file targets a specific
      compute-capability version and is forward-compatible only with GPU architectures of the
      same major version number"): a cubin for X.y runs on X.z for z >= y only.
[PTX] Same guide, "PTX Compatibility" (#ptx-compatibility) and "Application Compatibility":
      PTX for compute_XY is JIT-compiled by the driver for any GPU of compute capability >= X.Y,
      unless it uses architecture- or family-specific features.
[FEAT] CUDA Programming Guide, appendix 5.1 "Compute Capabilities", 5.1.2 "Feature Availability"
      (https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/compute-capabilities.html;
      legacy guide: "Feature Availability" with its architecture-specific and family-specific
      feature sets): code for `sm_XYa` / `compute_XYa` runs only on exactly X.Y; code for
      `sm_XYf` / `compute_XYf` runs on X.Y and the later members of its family (same major,
      minor >= Y): sm_100f on 10.0 and 10.3, sm_120f on 12.0 and 12.1 (also NVIDIA's "NVIDIA
      Blackwell and NVIDIA CUDA 12.9 Introduce Family-Specific Architecture Features",
      developer.nvidia.com/blog, 2025).
[LTO] nvJitLink documentation (https://docs.nvidia.com/cuda/nvjitlink/, "Compatibility"): LTO IR
      (nvcc `code=lto_XY`, fatbin entry kind 8) is not loaded by the driver (checked on an H200:
      docs/census.md); a library that uses nvJitLink links it at run time for the GPU it runs on
      (any GPU >= X.Y, as PTX), and nvJitLink links only IR of its own CUDA major release.
[DRV] CUDA Compatibility guide (https://docs.nvidia.com/deploy/cuda-compatibility/) and the
      CUDA Toolkit release notes' table of toolkit and minimum driver versions: a driver JIT-
      compiles PTX only up to the PTX ISA of the CUDA version it ships with; newer PTX fails
      with cudaErrorUnsupportedPtxVersion.

Checked on an H200 (docs/census.md, "Checked on a real GPU"): every 9.0 case above behaved so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sm120patch.arch import Arch

# What the user sees when the driver finds no image (CUDA runtime's error strings; torch
# prefixes "CUDA error: "). `sm120patch diagnose` names both (patches/signatures.toml:
# no-kernel-image, ptx-jit-too-new); tests/unit/test_census_rules.py checks it does.
NO_IMAGE_ERROR = "no kernel image is available for execution on the device"
NO_NVJITLINK_ERROR = "libnvJitLink.so: cannot open shared object file (or one of another CUDA major release)"
PTX_TOO_NEW_ERROR = "the provided PTX was compiled with an unsupported toolchain."

# PTX ISA version each CUDA release introduced (PTX ISA manual, "Release Notes" table).
PTX_ISA_OF_CUDA: dict[tuple[int, int], tuple[int, int]] = {
    (12, 0): (8, 0),
    (12, 1): (8, 1),
    (12, 2): (8, 2),
    (12, 3): (8, 3),
    (12, 4): (8, 4),
    (12, 5): (8, 5),
    (12, 6): (8, 5),
    (12, 8): (8, 7),
    (12, 9): (8, 8),
    (13, 0): (9, 0),
    (13, 1): (9, 1),
}
# Linux driver branch -> the CUDA version it ships (CUDA Toolkit release notes, "CUDA Toolkit
# and Corresponding Driver Versions": 525.60.13 is 12.0 GA, ... 570.26 12.8, 575.51.03 12.9,
# 580.65.06 13.0, 590.44.01 13.1). The branch number is enough for the PTX question.
_DRIVER_CUDA = [
    (590, (13, 1)),
    (580, (13, 0)),
    (575, (12, 9)),
    (570, (12, 8)),
    (560, (12, 6)),
    (555, (12, 5)),
    (550, (12, 4)),
    (545, (12, 3)),
    (535, (12, 2)),
    (530, (12, 1)),
    (525, (12, 0)),
]


@dataclass(frozen=True)
class Code:
    """One image in a fatbin: SASS (`sass`), PTX (`ptx`) or LTO IR (`lto`) for `sm` with suffix."""

    kind: str  # "sass", "ptx", "lto" (or "kind<N>": an entry kind the reader does not know)
    sm: int  # 120
    suffix: str = ""  # "", "a", "f"
    isa: str = ""  # PTX ISA version of a PTX image ("9.0")

    @property
    def arch(self) -> Arch:
        return Arch(self.sm // 10, self.sm % 10)

    @property
    def name(self) -> str:
        prefix = {"sass": "sm", "ptx": "compute", "lto": "lto"}.get(self.kind, self.kind)
        return f"{prefix}_{self.sm}{self.suffix}"

    @classmethod
    def parse(cls, text: str) -> Code:
        """`sass:sm_120a`, `ptx:sm_120:9.0` (elf.FatbinEntry.code)."""
        kind, name, *rest = [*text.split(":"), ""][:3] if text.count(":") >= 1 else ("", text, "")
        m = re.fullmatch(r"sm_(\d+)([af]?)", name)
        if not m or not re.fullmatch(r"sass|ptx|lto|kind\d+", kind):
            raise ValueError(f"not a code name: {text!r}")
        return cls(kind, int(m.group(1)), m.group(2), rest[0] if rest else "")


def major_of(version: str | None) -> int | None:
    """The major release of a version string (`13.0.88` -> 13); None when there is none."""
    m = re.match(r"(\d+)", version or "")
    return int(m.group(1)) if m else None


def sass_runs_on(code: Code, gpu: Arch) -> bool:
    """Does this SASS (cubin) load on `gpu`? [BIN] plain sm_XY: same major, minor >= Y;
    [FEAT] sm_XYa: exactly X.Y; sm_XYf: same major (its family), minor >= Y."""
    a = code.arch
    if code.suffix == "a":
        return gpu == a
    return gpu.major == a.major and gpu.minor >= a.minor


def ptx_targets(code: Code, gpu: Arch) -> bool:
    """Can the driver JIT this PTX for `gpu`, ISA version aside? [PTX] plain compute_XY:
    any GPU >= X.Y; [FEAT] compute_XYa: only X.Y; compute_XYf: its family, minor >= Y."""
    a = code.arch
    if code.suffix == "a":
        return gpu == a
    if code.suffix == "f":
        return gpu.major == a.major and gpu.minor >= a.minor
    return (gpu.major, gpu.minor) >= (a.major, a.minor)


def driver_cuda(driver: str | None) -> tuple[int, int] | None:
    """The CUDA version a Linux driver version (`580.95.05`) ships with [DRV]; None if unknown."""
    m = re.match(r"(\d+)\.", driver or "")
    if not m:
        return None
    branch = int(m.group(1))
    return next((cuda for first, cuda in _DRIVER_CUDA if branch >= first), None)


def driver_ptx_isa(driver: str | None) -> tuple[int, int] | None:
    """Newest PTX ISA the driver can JIT [DRV]; None when the driver is not known."""
    cuda = driver_cuda(driver)
    return PTX_ISA_OF_CUDA.get(cuda) if cuda else None


def _isa(text: str) -> tuple[int, int] | None:
    m = re.fullmatch(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass(frozen=True)
class Verdict:
    """Can a set of images (one translation unit, or a whole file) run on a GPU, and how."""

    ok: bool
    how: str  # "sass" (a cubin loads), "jit" (PTX JIT-compiled at first load), "none"
    image: str  # the image used (sm_120, compute_90) or ""
    error: str  # what the user sees when not ok ("" when ok)
    why: str  # one line


def judge(
    codes: list[Code],
    gpu: Arch,
    driver: str | None = None,
    nvjitlink: tuple[int | None, str, bool | None] | None = None,
) -> Verdict:
    """The loader's choice for `gpu` among `codes`: a compatible SASS first, else PTX it can JIT,
    else LTO IR the library links through nvJitLink [LTO].

    With `driver` unknown (no GPU here, `--arch`), a PTX is taken as JIT-able and the why says
    the ISA it needs; with a known driver, PTX newer than the driver's ISA does not count.
    `nvjitlink`: (the CUDA major the LTO IR needs, or None when not known; the nvidia-nvjitlink
    version installed, "" when none; whether the module uses nvJitLink, None when it cannot be
    told) -- None when not asked."""
    sass = [c for c in codes if c.kind == "sass" and sass_runs_on(c, gpu)]
    if sass:
        best = max(sass, key=lambda c: (c.sm, c.suffix != ""))
        return Verdict(True, "sass", best.name, "", f"{best.name} SASS runs on {gpu.name}")
    ptx = [c for c in codes if c.kind == "ptx" and ptx_targets(c, gpu)]
    limit = driver_ptx_isa(driver)
    fits = [c for c in ptx if limit is None or (_isa(c.isa) or (0, 0)) <= limit]
    if fits:
        best = max(fits, key=lambda c: c.sm)
        isa = f" (PTX ISA {best.isa}" + (", driver-dependent)" if limit is None else ")") if best.isa else ""
        return Verdict(True, "jit", best.name, "", f"{best.name} PTX JIT-compiles for {gpu.name}{isa}")
    lto = [c for c in codes if c.kind == "lto" and ptx_targets(c, gpu)]
    if lto and not ptx:
        return _judge_lto(max(lto, key=lambda c: c.sm), gpu, nvjitlink)
    if ptx:
        newest = max(ptx, key=lambda c: _isa(c.isa) or (0, 0))
        have = f"{limit[0]}.{limit[1]}" if limit else "?"
        return Verdict(
            False,
            "none",
            "",
            PTX_TOO_NEW_ERROR,
            f"only PTX {newest.name} (ISA {newest.isa}) fits {gpu.name}, newer than driver {driver} JITs (ISA {have})",
        )
    carried = sorted({c.name for c in codes}, key=_sort_key)
    return Verdict(
        False, "none", "", NO_IMAGE_ERROR, f"no image for {gpu.name} among {', '.join(carried) or 'nothing'}"
    )


def _judge_lto(best: Code, gpu: Arch, nvjitlink: tuple[int | None, str, bool | None] | None) -> Verdict:
    """LTO IR that fits `gpu` and nothing else does [LTO]. The driver never loads it (on an H200
    an nvcc-built .so with lto_90 + sm_100a failed with "no kernel image": docs/census.md); it
    runs only where the library links it itself through nvJitLink of its CUDA major."""
    need, have, links = nvjitlink if nvjitlink is not None else (None, "", None)
    want = f"nvJitLink of CUDA {need} (nvidia-nvjitlink {need}.*)" if need else "nvJitLink"
    how = f"{best.name} LTO IR fits {gpu.name}, which only nvJitLink links (the driver does not load it)"
    if links is False:
        return Verdict(False, "none", "", NO_IMAGE_ERROR, f"{how}, and this module does not use nvJitLink")
    if links is None:
        return Verdict(True, "unknown", best.name, "", f"{how}: cannot tell from the headers who links it")
    if have and (need is None or major_of(have) == need):
        return Verdict(
            True, "lto", best.name, "", f"{how}; the module uses {want}: nvidia-nvjitlink {have} is installed"
        )
    if have:
        return Verdict(
            False,
            "none",
            "",
            NO_NVJITLINK_ERROR,
            f"{how}; the module needs {want}: nvidia-nvjitlink {have} cannot link it",
        )
    return Verdict(
        True,
        "unknown",
        best.name,
        "",
        f"{how}; the module uses {want}, and no nvidia-nvjitlink is installed here: cannot tell whether a "
        "libnvJitLink of that release is on the library path",
    )


def _sort_key(name: str) -> tuple[int, str]:
    m = re.search(r"(\d+)([af]?)$", name)
    return (int(m.group(1)), name) if m else (0, name)


def sort_names(names: set[str] | list[str]) -> list[str]:
    """Image names in arch order (sm_90a, sm_100f, sm_120)."""
    return sorted(set(names), key=_sort_key)
