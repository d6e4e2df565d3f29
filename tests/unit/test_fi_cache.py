"""fi_cache: which compiled trtllm_comm would shadow patched sources, on small fake trees and caches.

The fake `jit/core.py` files carry only the one line fi_cache reads (FlashInfer 0.5.0 ... 0.6.11
write build.ninja only when it is missing; 0.6.11.post1+ rewrite it on every build).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sm120patch.probes.environment.compiled_cache import ASIDE, cached_builds

KEEPS = "def build(self):\n    if not self.is_ninja_generated:\n        self.write_ninja()\n"
REWRITES = "def build(self):\n    self.write_ninja()\n"
NINJA_9_10 = "cuda_cflags = -gencode=arch=compute_90a,code=sm_90a\n"
NINJA_12 = NINJA_9_10 + "cuda_cflags = -gencode=arch=compute_120f,code=sm_120f\n"
T0 = 1_700_000_000  # seconds; every mtime below is set relative to it


def flashinfer(root: Path, core: str = KEEPS, version: str = "0.6.1") -> tuple[Path, Path]:
    """A FlashInfer package and one patched header, at mtime T0 + 100."""
    pkg = root / "site" / "flashinfer"
    (pkg / "jit").mkdir(parents=True)
    (pkg / "jit" / "core.py").write_text(core)
    (pkg / "_build_meta.py").write_text(f'__version__ = "{version}"\n')
    header = pkg / "data" / "include" / "trtllm_allreduce.cuh"
    header.parent.mkdir(parents=True)
    header.write_text("// patched\n")
    os.utime(header, (T0 + 100, T0 + 100))
    return pkg, header


def jit_build(
    base: Path, arch: str, ninja: str | None = NINJA_12, so_mtime: int | None = T0, deps: str = "module"
) -> Path:
    d = base / ".cache" / "flashinfer" / "0.6.1" / arch / "cached_ops" / "trtllm_comm"
    d.mkdir(parents=True)
    if ninja is not None:
        (d / "build.ninja").write_text(ninja)
    if so_mtime is not None:
        so = d / "trtllm_comm.so"
        so.write_bytes(b"\x7fELF")
        os.utime(so, (so_mtime, so_mtime))
    if deps == "module":
        (d / ".ninja_deps").write_bytes(b"")
    elif deps == "cached_ops":  # 0.5.0 ... 0.6.0 run ninja in cached_ops/
        (d.parent / ".ninja_deps").write_bytes(b"")
    return d


def builds(pkg: Path, header: Path, base: Path, **kw: object) -> dict[str, tuple[str, bool, str]]:
    found = cached_builds(pkg, "trtllm_comm", [header], workspace_base=base, **kw)  # type: ignore[arg-type]
    return {b.path.relative_to(base).as_posix(): (b.kind, b.shadows, b.why) for b in found}


def test_nothing_cached_is_nothing(tmp_path: Path) -> None:
    pkg, header = flashinfer(tmp_path)
    assert cached_builds(pkg, "trtllm_comm", [header], workspace_base=tmp_path / "home") == []


def test_older_jit_build_is_rebuilt_by_ninja(tmp_path: Path) -> None:
    pkg, header = flashinfer(tmp_path)
    jit_build(tmp_path / "home", "120f")
    ((path, (kind, shadows, why)),) = builds(pkg, header, tmp_path / "home").items()
    assert path == ".cache/flashinfer/0.6.1/120f/cached_ops/trtllm_comm"
    assert (kind, shadows) == ("jit", False) and "newer than the .so" in why


def test_build_after_the_patch_came_from_it(tmp_path: Path) -> None:
    pkg, header = flashinfer(tmp_path)
    jit_build(tmp_path / "home", "121a", so_mtime=T0 + 200, deps="cached_ops")
    ((_, (_, shadows, why)),) = builds(pkg, header, tmp_path / "home").items()
    assert not shadows and "built after" in why


def test_stale_build_ninja_shadows_where_flashinfer_keeps_it(tmp_path: Path) -> None:
    """A mixed box (SM90 + SM120): the [9, 10] gate built trtllm_comm for sm_90a only."""
    pkg, header = flashinfer(tmp_path, KEEPS)
    d = jit_build(tmp_path / "home", "90a_120f", ninja=NINJA_9_10)
    (b,) = cached_builds(pkg, "trtllm_comm", [header], workspace_base=tmp_path / "home")
    assert b.path == d and b.shadows and "never rewrites an existing build.ninja" in b.why and "aside" in b.fix


def test_stale_build_ninja_is_rewritten_by_newer_flashinfer(tmp_path: Path) -> None:
    pkg, header = flashinfer(tmp_path, REWRITES)
    jit_build(tmp_path / "home", "90a_120f", ninja=NINJA_9_10)
    ((_, (_, shadows, _)),) = builds(pkg, header, tmp_path / "home").items()
    assert not shadows


def test_without_ninja_deps_headers_are_invisible(tmp_path: Path) -> None:
    pkg, header = flashinfer(tmp_path)
    jit_build(tmp_path / "home", "120f", deps="none")
    ((_, (_, shadows, why)),) = builds(pkg, header, tmp_path / "home").items()
    assert shadows and ".ninja_deps" in why


def test_other_arch_folders_are_never_loaded_on_sm12x(tmp_path: Path) -> None:
    pkg, header = flashinfer(tmp_path)
    for arch in ("90a", "100a", "75_80_89"):
        jit_build(tmp_path / "home", arch, ninja=NINJA_9_10, deps="none")
    assert builds(pkg, header, tmp_path / "home") == {}
    assert len(builds(pkg, header, tmp_path / "home", major=9)) == 1


def test_workspace_base_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg, header = flashinfer(tmp_path)
    jit_build(tmp_path / "ws", "120f", deps="none")
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "ws"))
    (b,) = cached_builds(pkg, "trtllm_comm", [header])
    assert b.shadows and b.path.is_relative_to(tmp_path / "ws")


@pytest.mark.parametrize("where", ["jit_cache", "data_aot"])
def test_aot_module_always_shadows(tmp_path: Path, where: str) -> None:
    pkg, header = flashinfer(tmp_path, REWRITES)
    base = pkg.parent / "flashinfer_jit_cache" / "jit_cache" if where == "jit_cache" else pkg / "data" / "aot"
    so = base / "trtllm_comm" / "trtllm_comm.so"
    so.parent.mkdir(parents=True)
    so.write_bytes(b"\x7fELF")
    os.utime(so, (T0 + 500, T0 + 500))  # newer than the patch: still loaded instead of it
    (b,) = cached_builds(pkg, "trtllm_comm", [header], workspace_base=tmp_path / "home")
    assert (b.path, b.kind, b.shadows) == (so, "aot", True) and "is_aot" in b.why and "flashinfer-jit-cache" in b.fix


def test_version_read_from_the_tree_or_given(tmp_path: Path) -> None:
    pkg, header = flashinfer(tmp_path, version="0.6.1")
    jit_build(tmp_path / "home", "120f", deps="none")
    assert len(cached_builds(pkg, "trtllm_comm", [header], workspace_base=tmp_path / "home")) == 1
    assert cached_builds(pkg, "trtllm_comm", [header], workspace_base=tmp_path / "home", version="0.6.3") == []


def test_the_fix_is_a_command_that_moves_the_build_aside_and_back(tmp_path: Path) -> None:
    pkg, header = flashinfer(tmp_path / "a b")  # a space: the paths must come quoted
    d = jit_build(tmp_path / "a b" / "home", "90a_120f", ninja=NINJA_9_10)
    (found,) = cached_builds(pkg, "trtllm_comm", [header], workspace_base=tmp_path / "a b" / "home")
    assert found.shadows and found.path == d
    mv = found.fix.split("`")[1]
    assert mv == f"mv '{d}' '{d}{ASIDE}'"
    subprocess.run(mv, shell=True, check=True)
    assert not d.exists() and (d.parent / (d.name + ASIDE)).is_dir()
    assert cached_builds(pkg, "trtllm_comm", [header], workspace_base=tmp_path / "a b" / "home") == []
    back = found.fix.split("`")[3]
    subprocess.run(back, shell=True, check=True)
    assert d.is_dir() and not (d.parent / (d.name + ASIDE)).exists()
