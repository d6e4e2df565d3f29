"""Compiled FlashInfer modules that would be used in place of patched sources, and why.

Patching FlashInfer's sources (the flashinfer-trtllm-comm-sm120 recipe) only helps once
FlashInfer compiles them. What it loads instead, read from jit/core.py and jit/cpp_ext.py of
flashinfer-python 0.5.0 ... 0.7.4 (`JitSpec.build_and_load`):

1. An AOT module, `<aot dir>/<name>/<name>.so` (flashinfer-jit-cache's `jit_cache/`, else
   `flashinfer/data/aot/`). When it exists it is loaded first and the sources are never
   looked at (`if self.is_aot`, 0.5.0 ... 0.6.15; `try_load`, 0.6.16+): it always shadows.
2. A JIT build, `<base>/.cache/flashinfer/<version>/<archs>/cached_ops/<name>/`
   (base: `$FLASHINFER_WORKSPACE_BASE`, else the home folder). Every load runs ninja, whose
   depfiles (`deps = gcc`, nvcc `--generate-dependencies-with-compile`) list each header, so a
   patched source or header newer than the objects is rebuilt. Except that 0.5.0 ... 0.6.11
   write `build.ninja` only when it is missing (`JitSpec.build`: `if not
   self.is_ninja_generated`): one written while the gate left SM12x out keeps building the
   module without SM12x code after comm.py is patched. And without ninja's dependency log
   (`.ninja_deps`) a changed header is not seen at all.

The fix each finding gives is a command for the user to run: the caches live outside the
trees sm120patch patches, and sm120patch never writes outside them.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

ASIDE = ".sm120patch-aside"


@dataclass(frozen=True)
class CachedBuild:
    """One compiled copy of a JIT module that FlashInfer may load."""

    path: Path  # the AOT .so, or the JIT module's build folder
    kind: str  # "aot" or "jit"
    shadows: bool  # True: FlashInfer would run it (or rebuild it wrongly) instead of the patched sources
    why: str
    fix: str = ""  # what makes FlashInfer build from the sources again (empty when nothing is needed)

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "path": str(self.path)}


def cached_builds(
    package_dir: Path,
    module: str,
    patched: Sequence[Path] = (),
    *,
    version: str | None = None,
    workspace_base: Path | None = None,
    jit_cache_dir: Path | None = None,
    major: int = 12,
) -> list[CachedBuild]:
    """Every compiled `module` the FlashInfer in `package_dir` could load on a GPU of `major`.

    `patched` are the source files sm120patch changed (their mtimes tell whether ninja sees
    them as newer); `version` is FlashInfer's (default: read from the tree), `workspace_base`
    the server's `$FLASHINFER_WORKSPACE_BASE` (default: ours, else home), `jit_cache_dir`
    flashinfer-jit-cache's `jit_cache/` (default: the one installed beside `package_dir`).
    """
    out = [_aot(p) for p in _aot_candidates(package_dir, module, jit_cache_dir) if p.is_file()]
    if version is None:
        from sm120patch.probes.environment.flashinfer import tree_version

        version = tree_version(package_dir)
    if not version:
        return out
    base = workspace_base or Path(os.environ.get("FLASHINFER_WORKSPACE_BASE") or Path.home())
    keeps_ninja = _keeps_build_ninja(package_dir)
    newest = max((p.stat().st_mtime_ns for p in patched if p.is_file()), default=None)
    root = base / ".cache" / "flashinfer" / version
    for build_dir in sorted(root.glob(f"*/cached_ops/{module}")):
        if build_dir.is_dir() and _targets_major(build_dir.parent.parent.name, major):
            found = _jit(build_dir, module, major, keeps_ninja, newest)
            if found is not None:
                out.append(found)
    return out


def _aot_candidates(package_dir: Path, module: str, jit_cache_dir: Path | None) -> list[Path]:
    dirs = [jit_cache_dir] if jit_cache_dir else [package_dir.parent / "flashinfer_jit_cache" / "jit_cache"]
    dirs.append(package_dir / "data" / "aot")
    return [d / module / f"{module}.so" for d in dirs]


def _move_aside(path: Path) -> str:
    """The commands that move a cached build out of FlashInfer's way, and back after a rollback."""
    here, aside = shlex.quote(str(path)), shlex.quote(str(path) + ASIDE)
    return f"`mv {here} {aside}` (after a rollback: `rm -rf {here} && mv {aside} {here}`)"


def _aot(so: Path) -> CachedBuild:
    return CachedBuild(
        so,
        "aot",
        True,
        "FlashInfer loads an AOT module before any JIT build and never compares it with the sources "
        "(jit/core.py, JitSpec.build_and_load: `if self.is_aot`)",
        f"move it aside so FlashInfer JIT-builds the patched sources: {_move_aside(so)}; "
        "or uninstall flashinfer-jit-cache",
    )


def _jit(build_dir: Path, module: str, major: int, keeps_ninja: bool, newest: int | None) -> CachedBuild | None:
    so, ninja = build_dir / f"{module}.so", build_dir / "build.ninja"
    if not so.is_file() and not ninja.is_file():
        return None
    fix = f"move the folder aside so FlashInfer rebuilds it from the patched sources: {_move_aside(build_dir)}"
    if ninja.is_file() and keeps_ninja and not _has_gencode(ninja, major):
        why = (
            f"build.ninja has no compute_{major}x gencode (written while the gate left SM{major}x out), and this "
            "FlashInfer never rewrites an existing build.ninja (jit/core.py JitSpec.build: "
            "`if not self.is_ninja_generated`, 0.5.0 ... 0.6.11): it would rebuild without SM12x code"
        )
        return CachedBuild(build_dir, "jit", True, why, fix)
    if not so.is_file():
        return CachedBuild(build_dir, "jit", False, "no .so yet: FlashInfer builds it from the current sources")
    if not any((d / ".ninja_deps").is_file() for d in (build_dir, build_dir.parent)):
        why = "ninja's dependency log (.ninja_deps) is missing, so ninja cannot see changed headers"
        return CachedBuild(build_dir, "jit", True, why, fix)
    if newest is None:
        return CachedBuild(build_dir, "jit", False, "ninja rebuilds it if a source or header is newer (depfiles)")
    if so.stat().st_mtime_ns < newest:
        why = "a patched file is newer than the .so: ninja rebuilds it on first use (its depfiles list every header)"
        return CachedBuild(build_dir, "jit", False, why)
    return CachedBuild(build_dir, "jit", False, "built after the sources last changed, from them")


def _keeps_build_ninja(package_dir: Path) -> bool:
    """True for FlashInfer releases that write build.ninja only when it is missing (0.5.0 ... 0.6.11)."""
    try:
        text = (package_dir / "jit" / "core.py").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True  # unknown: assume the worst
    return "if not self.is_ninja_generated" in text


def _has_gencode(ninja: Path, major: int) -> bool:
    try:
        text = ninja.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return re.search(rf"arch=compute_{major}\d", text) is not None


def _targets_major(arch_dir: str, major: int) -> bool:
    """FlashInfer names the folder after its target archs, sorted: `90a`, `120f`, `90a_121a`, `75_80_89`."""
    for token in arch_dir.split("_"):
        digits = re.match(r"\d+", token)
        if digits and len(digits.group()) >= 2 and int(digits.group()[:-1]) == major:
            return True
    return False
