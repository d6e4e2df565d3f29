"""FlashInfer as it will be once the planned FlashInfer recipes are written, for the probes.

Probe first, write after: a FlashInfer recipe (and an SGLang recipe that needs what it
adds) must be proven on the patched sources before a byte of either tree changes. The
overlay is a copy of the `flashinfer/` package, hard-linked where the filesystem allows,
whose patched files hold the planned bytes. Real files and folders, not symbolic links:
FlashInfer finds its headers through `Path(__file__).resolve()`, which would lead a link
back to the unpatched tree. Its place is derived from the real package and the planned
bytes, so the same plan finds the same overlay (and the probe caches keyed by it) again,
and it is never edited once made (a patched file is a new file, never a shared inode).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from sm120patch.flashinfer_env import FlashInferEnv, from_tree


def overlay_root(package_dir: Path, changes: Mapping[str, bytes]) -> Path:
    """Where the overlay for these planned bytes lives (under the sm120patch cache)."""
    h = hashlib.sha256(str(package_dir.resolve()).encode())
    for rel in sorted(changes):
        h.update(rel.encode() + b"\0" + hashlib.sha256(changes[rel]).digest())
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sm120patch" / "overlays" / h.hexdigest()[:24]


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links not allowed
        shutil.copy2(src, dst)


def _mirror(src: Path, dest: Path, changes: Mapping[str, bytes]) -> None:
    shutil.copytree(src, dest, copy_function=_link_or_copy, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, data in changes.items():
        path = dest / rel
        mode = path.stat().st_mode if path.exists() else 0o644
        path.unlink(missing_ok=True)  # never write through a hard link into the real tree
        path.write_bytes(data)
        path.chmod(mode & 0o7777)


def overlay(fi: FlashInferEnv, changes: Mapping[str, bytes]) -> FlashInferEnv:
    """`fi` with `changes` (paths relative to the flashinfer package) applied, as a FlashInferEnv
    the probes can read, import and build; `fi` itself when nothing changes."""
    if not changes or fi.package_dir is None:
        return fi
    root = overlay_root(fi.package_dir, changes)
    pkg = root / "flashinfer"
    if not pkg.is_dir():
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}."))
        try:
            _mirror(fi.package_dir, tmp / "flashinfer", changes)
            try:
                os.rename(tmp, root)
            except OSError:
                if not pkg.is_dir():  # not another run's identical overlay: a real failure
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    env = from_tree(root, python=fi.python)
    env.version = fi.version  # the overlay has no dist-info: it is this FlashInfer, patched
    env.dist_versions = dict(fi.dist_versions)
    env.cubin_dir, env.jit_cache_dir, env.user_cache_dirs = fi.cubin_dir, fi.jit_cache_dir, fi.user_cache_dirs
    return env
