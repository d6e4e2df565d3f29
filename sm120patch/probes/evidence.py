"""What a verdict stood on, and whether it still holds for the FlashInfer in front of us now.

A verdict records the FlashInfer it judged (version, where) and the sha256 of every file
it read, relative to the `flashinfer/` package. `pip install` of another release, a new
container image, or a patch to FlashInfer's sources changes those bytes; `changes` then
names what differs, and the engine probes again instead of trusting the old answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sm120patch.hashing import sha256_file

if TYPE_CHECKING:
    from sm120patch.catalogue.kernels import Kernel
    from sm120patch.probes.environment.flashinfer import FlashInferEnv

MISSING = "missing"


def file_sha(path: Path) -> str:
    return sha256_file(path) or MISSING


def hash_files(package_dir: Path | None, rels: Iterable[str]) -> dict[str, str]:
    """rel -> sha256 (or "missing") of files under the flashinfer package."""
    if package_dir is None:
        return {}
    return {rel: file_sha(package_dir / rel) for rel in sorted(set(rels))}


def static_files(kernel: Kernel) -> list[str]:
    """The files the static rung reads for a kernel: its generator and its source checks."""
    return [kernel.file, *(c.file for c in kernel.source_checks)]


def fingerprint(fi: FlashInferEnv, kernel: Kernel) -> dict[str, str]:
    return hash_files(fi.package_dir, static_files(kernel))


def changes(recorded: Mapping[str, Any], fi: FlashInferEnv) -> list[str]:
    """How the FlashInfer now differs from the one a verdict recorded (empty: it still holds)."""
    out = []
    was = recorded.get("flashinfer") or {}
    if was.get("location") != fi.location:
        out.append(f"FlashInfer moved: {was.get('location') or 'none'} -> {fi.location or 'none'}")
    if was.get("version") != fi.version:
        out.append(f"FlashInfer {was.get('version')} -> {fi.version}")
    files = recorded.get("files") or {}
    now = hash_files(fi.package_dir, files)
    differ = sorted(rel for rel, sha in files.items() if now.get(rel) != sha)
    if differ:
        shown = ", ".join(differ[:3]) + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")
        out.append(f"changed since the probe: {shown}")
    return out
