"""The journal: what sm120patch changed in a tree, written before the first byte is.

Layout, at `<root>/.sm120patch/` (or a state folder when the tree is read-only):

    journal.json   manifest: recipes applied (in order), files with their original
                   and current sha256, and a `pending` transaction while one runs
    blobs/<sha>    byte-exact copies of every file's content before each write
    saved/         a user's own edits, kept when `--force` overwrites them
    lock           held (flock) by the one run that may write

A transaction records every (before, after) hash and stores the before-bytes
*before* touching any file; files are then replaced atomically. If the run dies
midway, the next run finds `pending` and puts every file back to its before-bytes,
so the tree is either as it was or fully written, never in between.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120patch import __version__
from sm120patch.errors import JournalError, UserError

SCHEMA = 1
DIRNAME = ".sm120patch"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write via a temp file in the same folder + rename: readers see old or new, never half."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".sm120patch-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def state_dir_for(root: Path) -> Path:
    """Where the journal lives: in the tree when writable, else a per-tree state folder."""
    local = root / DIRNAME
    if local.is_dir() or os.access(root, os.W_OK):
        return local
    base = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state"))
    return base / "sm120patch" / hashlib.sha256(str(root).encode()).hexdigest()[:16]


@dataclass
class FileEntry:
    original: str
    current: str
    mode: int


class Journal:
    """Load, change and save one tree's journal. Use `Journal.open(root)` under `lock()`."""

    def __init__(self, root: Path, directory: Path, data: dict[str, Any]) -> None:
        self.root = root
        self.dir = directory
        self.data = data

    # --- loading and saving -----------------------------------------------------

    @classmethod
    def open(cls, root: Path) -> Journal:
        directory = state_dir_for(root)
        path = directory / "journal.json"
        if not path.exists():
            return cls(root, directory, {"schema": SCHEMA, "applied": [], "files": {}, "pending": None, "history": []})
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise JournalError(
                f"{path}: unreadable journal ({e}); restore it from a backup, "
                f"or reinstall the package if you no longer need to roll back"
            ) from None
        if (
            not isinstance(data, dict)
            or data.get("schema") != SCHEMA
            or not isinstance(data.get("files"), dict)
            or not isinstance(data.get("applied"), list)
        ):
            raise JournalError(
                f"{path}: not a journal of schema {SCHEMA}; "
                "it was written by another sm120patch version or edited by hand"
            )
        return cls(root, directory, data)

    @property
    def exists(self) -> bool:
        return (self.dir / "journal.json").exists()

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data["schema"] = SCHEMA
        self.data["tool_version"] = __version__
        self.data["root"] = str(self.root)
        atomic_write(self.dir / "journal.json", json.dumps(self.data, indent=1, sort_keys=True).encode())

    @contextlib.contextmanager
    def lock(self, wait_s: float = 0.0) -> Iterator[None]:
        """One writer per tree. A second run waits up to `wait_s`, then refuses with the fix."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._exclude_from_git()
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_s
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                        raise UserError(
                            f"{self.root}: another sm120patch run is changing this tree; "
                            "wait for it to finish (or pass --wait SECONDS)"
                        ) from None
                    time.sleep(0.1)
            yield
        finally:
            os.close(fd)

    def _exclude_from_git(self) -> None:
        """Keep the journal out of `git status` on clones (via .git/info/exclude, not a tracked file)."""
        info = self.root / ".git" / "info"
        if self.dir.parent != self.root or not (self.root / ".git").is_dir():
            return
        info.mkdir(parents=True, exist_ok=True)
        exclude = info / "exclude"
        text = exclude.read_text() if exclude.exists() else ""
        if f"/{DIRNAME}/" not in text.splitlines():
            exclude.write_text(text + ("" if text.endswith("\n") or not text else "\n") + f"/{DIRNAME}/\n")

    # --- what it records -----------------------------------------------------------

    @property
    def applied(self) -> list[dict[str, Any]]:
        return self.data["applied"]

    def applied_ids(self) -> list[str]:
        return [a["id"] for a in self.applied]

    def file(self, rel: str) -> FileEntry | None:
        f = self.data["files"].get(rel)
        return FileEntry(f["original"], f["current"], f["mode"]) if f else None

    def blob(self, digest: str) -> bytes:
        try:
            data = (self.dir / "blobs" / digest).read_bytes()
        except OSError:
            raise JournalError(
                f"{self.dir}: blob {digest[:12]} is missing; the journal cannot restore that file, "
                "reinstall the package to get the original back"
            ) from None
        if sha256(data) != digest:
            raise JournalError(
                f"{self.dir}: blob {digest[:12]} is corrupt; reinstall the package to get the original back"
            )
        return data

    def original(self, rel: str) -> bytes:
        entry = self.file(rel)
        if entry is None:
            return (self.root / rel).read_bytes()
        return self.blob(entry.original)

    def _store_blob(self, data: bytes) -> str:
        digest = sha256(data)
        path = self.dir / "blobs" / digest
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)
        return digest

    def note(self, action: str, **fields: Any) -> None:
        self.data.setdefault("history", []).append(
            {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "action": action, **fields}
        )

    # --- transactions ------------------------------------------------------------------

    def write(self, new: dict[str, bytes]) -> None:
        """Replace files (rel -> bytes) as one recoverable transaction; caller saves `applied` after."""
        if self.data.get("pending"):
            raise JournalError(f"{self.dir}: an interrupted run is pending; run `sm120patch rollback {self.root}`")
        pending: dict[str, dict[str, str]] = {}
        for rel, data in sorted(new.items()):
            path = self.root / rel
            before = path.read_bytes()
            b_sha = self._store_blob(before)
            entry = self.data["files"].get(rel)
            if entry is None:
                entry = {"original": b_sha, "current": b_sha, "mode": path.stat().st_mode & 0o7777}
                self.data["files"][rel] = entry
            pending[rel] = {"before": b_sha, "after": sha256(data)}
        self.data["pending"] = {"started": time.time(), "writes": pending}
        self.save()  # the undo data is on disk before the first file changes
        for rel, data in sorted(new.items()):
            path = self.root / rel
            atomic_write(path, data, self.data["files"][rel]["mode"])
            self.data["files"][rel]["current"] = pending[rel]["after"]
        self.data["pending"] = None
        for rel in list(self.data["files"]):  # files back to their original need no entry
            f = self.data["files"][rel]
            if f["current"] == f["original"]:
                del self.data["files"][rel]

    def recover(self) -> list[str]:
        """Undo an interrupted transaction: every file back to its before-bytes. Returns rel paths restored."""
        pending = self.data.get("pending")
        if not pending:
            return []
        restored = []
        for rel, w in sorted(pending["writes"].items()):
            path = self.root / rel
            try:
                now = sha256(path.read_bytes())
            except FileNotFoundError:
                now = None
            if now == w["after"] or now is None:
                atomic_write(path, self.blob(w["before"]), self.data["files"].get(rel, {}).get("mode"))
                restored.append(rel)
            if rel in self.data["files"]:
                self.data["files"][rel]["current"] = w["before"]
        self.data["pending"] = None
        for rel in list(self.data["files"]):
            f = self.data["files"][rel]
            if f["current"] == f["original"]:
                del self.data["files"][rel]
        self.note("recover", files=restored)
        self.save()
        return restored

    def remove_if_empty(self) -> bool:
        """Delete the journal folder once nothing is applied and no user copy is kept."""
        if self.applied or self.data["files"] or self.data.get("pending") or (self.dir / "saved").exists():
            return False
        for p in sorted(self.dir.rglob("*"), reverse=True):
            if p.is_dir():
                p.rmdir()
            else:
                p.unlink()
        self.dir.rmdir()
        return True

    def keep_copy(self, rel: str) -> Path:
        """Save the user's version of a file before `--force` replaces it."""
        src = self.root / rel
        dest = self.dir / "saved" / f"{rel}.{time.strftime('%Y%m%d-%H%M%S')}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(dest, src.read_bytes())
        return dest
