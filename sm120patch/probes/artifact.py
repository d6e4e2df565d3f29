"""Artifact rung: which SM numbers the prebuilt kernels beside a FlashInfer carry.

A JIT module that already sits compiled in flashinfer-jit-cache or in FlashInfer's
own cache (`~/.cache/flashinfer/<ver>/<archs>/cached_ops/<module>/<module>.so`) is
evidence that the kernels exist for the SM numbers in its fatbin; flashinfer-cubin's
cubins tell which archs the trtllm-gen families were shipped for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sm120patch.probes.environment.elf import FileArchs, scan_file


@dataclass
class ArtifactScan:
    files: list[FileArchs] = field(default_factory=list)

    @property
    def sms(self) -> list[int]:
        return sorted({sm for f in self.files for sm in f.sass})

    def files_for(self, sm: int) -> list[str]:
        return [f.path for f in self.files if sm in f.sass]

    def to_dict(self) -> dict[str, object]:
        return {"sms": self.sms, "files": len(self.files), "errors": [f.to_dict() for f in self.files if f.error]}


def scan_paths(paths: Iterable[Path]) -> ArtifactScan:
    out = ArtifactScan()
    for p in paths:
        if p.is_file():
            out.files.append(scan_file(p))
    return out


def scan_cubins(cubin_dir: Path, globs: Iterable[str] = ("**/*.cubin",)) -> ArtifactScan:
    """SM numbers of the cubins under a flashinfer-cubin `cubins/` folder matching `globs`."""
    seen: set[Path] = set()
    for g in globs:
        seen.update(cubin_dir.glob(g))
    return scan_paths(sorted(seen))


def jit_module_files(roots: Iterable[Path], modules: Iterable[str]) -> list[Path]:
    """`<root>/<module>/<module>.so` (and `<root>/<module>.so`) for each JIT root and module."""
    out = []
    for root in roots:
        for m in modules:
            for cand in (root / m / f"{m}.so", root / f"{m}.so"):
                if cand.is_file():
                    out.append(cand)
    return out
