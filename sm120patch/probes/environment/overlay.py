"""FlashInfer as it will be once the planned FlashInfer recipes are written, for the probes.

Probe first, write after: a FlashInfer recipe (and an SGLang recipe that needs what it
adds) must be proven on the patched sources before a byte of either tree changes. The
overlay is a copy of the `flashinfer/` package, hard-linked where the filesystem allows,
whose patched files hold the planned bytes. Real files and folders, not symbolic links:
FlashInfer finds its headers through `Path(__file__).resolve()`, which would lead a link
back to the unpatched tree. Its place is derived from the real package and the planned
bytes, so the same plan finds the same overlay (and the probe caches keyed by it) again,
and it is never edited once made (a patched file is a new file, never a shared inode).

A reader who may not write the tree (a non-root user, a read-only image) must still be able
to plan: folders are made writable by their owner and files are copied without the tree's
read-only modes, so the overlay can be patched and `rm -rf` removes it. The key covers the
bytes it mirrors as far as a stat walk can tell (each file's path, size, mtime and inode: a pip
reinstall or an edit changes it), and the cache keeps the most recently used overlays only
(`SM120PATCH_OVERLAYS`, default 6), removing the rest and what killed runs left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from sm120patch.hashing import sha256_chunks, sha256_chunks_raw, sha256_raw
from sm120patch.probes.environment.flashinfer import FlashInferEnv, from_tree

KEEP = 6  # overlays kept (most recently used first); SM120PATCH_OVERLAYS overrides
STALE_TMP_S = 3600.0  # a half-made overlay older than this was left by a killed run


def _tree_stamp(package_dir: Path) -> bytes:
    """What the overlay mirrors, as a stat walk sees it: every file's path, size, mtime, inode."""
    return sha256_chunks_raw(_stat_lines(package_dir))


def _stat_lines(package_dir: Path) -> Iterator[bytes]:
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            rel = os.path.relpath(path, package_dir)
            yield f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode()


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sm120patch" / "overlays"


def overlay_root(package_dir: Path, changes: Mapping[str, bytes]) -> Path:
    """Where the overlay for these planned bytes over this tree's bytes lives (the sm120patch cache)."""
    head = [str(package_dir.resolve()).encode(), _tree_stamp(package_dir)]
    planned = (rel.encode() + b"\0" + sha256_raw(changes[rel]) for rel in sorted(changes))
    return cache_dir() / sha256_chunks([*head, *planned])[:24]


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link where allowed (we never write through it: a patched file is a new file), else a
    copy that does not inherit a read-only mode (the owner may write and remove it)."""
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, links not allowed, or another user's file
        shutil.copyfile(src, dst)
        mode = os.stat(src).st_mode & 0o777
        os.chmod(dst, mode | 0o600)


def _mirror(src: Path, dest: Path, changes: Mapping[str, bytes]) -> None:
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        out = dest / os.path.relpath(dirpath, src)
        out.mkdir(mode=0o755, exist_ok=True)
        for name in dirnames:
            if os.path.islink(os.path.join(dirpath, name)):
                os.symlink(os.readlink(os.path.join(dirpath, name)), out / name)
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        for name in filenames:
            s_path = os.path.join(dirpath, name)
            if os.path.islink(s_path):
                os.symlink(os.readlink(s_path), out / name)
            else:
                _link_or_copy(s_path, str(out / name))
    for rel, data in changes.items():
        path = dest / rel
        mode = path.stat().st_mode if path.exists() else 0o644
        path.unlink(missing_ok=True)  # never write through a hard link into the real tree
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod((mode & 0o777) | 0o600)


def _remove(path: Path) -> None:
    """rm -rf that also works on an older overlay whose folders were copied read-only."""
    for dirpath, _dirnames, _files in os.walk(path):
        with contextlib.suppress(OSError):
            os.chmod(dirpath, 0o755)
    shutil.rmtree(path, ignore_errors=True)


def prune(keep: int | None = None) -> list[Path]:
    """Keep the `keep` most recently used overlays; remove the others and stale half-made ones."""
    import time

    keep = keep if keep is not None else int(os.environ.get("SM120PATCH_OVERLAYS", KEEP))
    base = cache_dir()
    if not base.is_dir():
        return []
    removed: list[Path] = []
    done, tmp = [], []
    for d in base.iterdir():
        (tmp if d.name.startswith(".") else done).append(d)
    now = time.time()
    for d in tmp:
        try:
            old = now - d.stat().st_mtime > STALE_TMP_S
        except OSError:
            continue
        if old:
            _remove(d)
            removed.append(d)
    done.sort(key=lambda d: d.stat().st_mtime if d.exists() else 0, reverse=True)
    for d in done[max(keep, 1) :]:
        _remove(d)
        removed.append(d)
    return removed


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
            if tmp.exists():
                _remove(tmp)
        prune()
    else:
        os.utime(root)  # most recently used: kept by `prune`
    env = from_tree(root, python=fi.python)
    env.version = fi.version  # the overlay has no dist-info: it is this FlashInfer, patched
    env.dist_versions = dict(fi.dist_versions)
    env.cubin_dir, env.jit_cache_dir, env.user_cache_dirs = fi.cubin_dir, fi.jit_cache_dir, fi.user_cache_dirs
    env.stands_for = fi.stands_for or fi.package_dir  # its proofs are about the real FlashInfer, once written
    return env
