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

The journal is read again once the lock is held (a run that waited must not act on
what it read before), its paths must stay inside the tree, and a folder that holds
no journal.json is removed when the lock is let go. tests/reliability kills runs at
every write step through the `SM120PATCH_FAULT=kill:N` hook below.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sm120patch import __version__
from sm120patch.errors import JournalError, UserError
from sm120patch.hashing import sha256, sha256_text
from sm120patch.hints import rollback_command
from sm120patch.planning.targets import DIRNAME  # noqa: F401 (journal.DIRNAME: its readers import it here)

SCHEMA = 1
TMP_SUFFIX = ".sm120patch-tmp"

# Test hook (tests/reliability): SM120PATCH_FAULT=kill:N makes the Nth write step SIGKILL this
# process (int:N: SIGINT, a Ctrl-C); SM120PATCH_FAULT_TRACE=FILE appends "N<TAB>monotonic<TAB>step" for every step;
# SM120PATCH_FAULT_SLOW=SECONDS sleeps that long after each step, so a kill sent from outside at a
# random moment of the write phase lands inside the transaction (the phase is milliseconds otherwise).
_FAULT = os.environ.get("SM120PATCH_FAULT", "")
_FAULT_TRACE = os.environ.get("SM120PATCH_FAULT_TRACE", "")
_FAULT_SLOW = float(os.environ.get("SM120PATCH_FAULT_SLOW", "0") or 0)
_fault_steps = 0


def _fault(step: str) -> None:
    global _fault_steps
    if not (_FAULT or _FAULT_TRACE or _FAULT_SLOW):
        return
    _fault_steps += 1
    if _FAULT_TRACE:
        with open(_FAULT_TRACE, "a") as f:
            f.write(f"{_fault_steps}\t{time.monotonic():.6f}\t{step}\n")
    if _FAULT_SLOW:
        time.sleep(_FAULT_SLOW)
    if f"kill:{_fault_steps}" == _FAULT:
        os.kill(os.getpid(), signal.SIGKILL)
    if f"int:{_fault_steps}" == _FAULT:
        os.kill(os.getpid(), signal.SIGINT)


class WriteError(JournalError, OSError):
    """Writing failed (permissions, disk full); what was written is already put back."""


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write via a temp file in the same folder + rename: readers see old or new, never half.
    `mode=None` keeps the mode of the file being replaced."""
    _fault(f"begin {path.name}")
    if mode is None:
        with contextlib.suppress(OSError):
            mode = os.stat(path).st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        _fault(f"replace {path.name}")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fault(f"replaced {path.name}")
    _fsync_dir(path.parent)


def state_dir_for(root: Path) -> Path:
    """Where the journal lives: in the tree when writable, else a per-tree state folder."""
    local = root / DIRNAME
    if local.is_symlink():  # never write the journal through a link, wherever it points
        raise JournalError(f"{local}: is a symlink; remove it (sm120patch keeps its journal in a real folder there)")
    if local.exists() and not local.is_dir():  # neither "nothing applied" nor a lock error: say what is there
        raise JournalError(
            f"{local}: is a file where sm120patch keeps its state folder (the journal and the original bytes); "
            "remove it or move it aside, then run the command again"
        )
    if local.is_dir() or os.access(root, os.W_OK):
        return local
    base = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state"))
    return base / "sm120patch" / sha256_text(str(root))[:16]


def damage_advice(root: Path, directory: Path, readable: bool = False) -> str:
    """The exact commands that bring a tree back without its journal (pip keeps `.sm120patch/`,
    so "reinstall" alone never works): the release's own bytes back, then the journal retired.
    A journal that still reads (`readable`: only blobs lost) is retired by `sm120patch rollback`,
    which checks first that every file is back at its original bytes; one that does not, removed."""
    import re
    import shlex

    q, jd = shlex.quote(str(root)), shlex.quote(str(directory))
    retire = rollback_command(root) if readable else f"rm -rf {jd}"
    if (root / ".git").exists():
        return f"run `git -C {q} checkout -- . && {retire}` (the clone's committed bytes back, the journal retired)"
    pins = []
    for dist, pkg in (("sglang", "sglang"), ("flashinfer_python", "flashinfer-python")):
        for meta in sorted(root.glob(f"{dist}-*.dist-info/METADATA")):
            m = re.search(r"^Version:\s*(\S+)", meta.read_text(errors="replace"), re.M)
            if m:
                pins.append(f"{pkg}=={m.group(1)}")
    if pins:
        return (
            f"run `pip install --force-reinstall --no-deps {' '.join(pins)} && {retire}` with the pip of that "
            "environment (the releases' own bytes back, the journal retired), or restore the journal from a backup"
        )
    return f"restore the tree's files from their release, then `{retire}`; or restore the journal from a backup"


def _safe_rel(rel: Any) -> bool:
    """A journal path: relative, POSIX, inside the tree, and a name any filesystem can hold
    (no part over 255 bytes: a hand-edited journal must not turn into an OS error later)."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        return False
    p = PurePosixPath(rel)
    if any(len(part.encode("utf-8", "surrogateescape")) > 255 for part in p.parts) or len(rel) > 4000:
        return False
    return not p.is_absolute() and ".." not in p.parts and p.parts[0] not in (".", DIRNAME)


def _is_sha(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


def _problem(data: dict[str, Any]) -> str | None:
    """What is wrong with a loaded journal's shape, or None. Checked before anything is trusted."""
    for rel, f in data["files"].items():
        if not _safe_rel(rel):
            return f"files: {rel!r} is not a path inside the tree"
        if not isinstance(f, dict) or not (_is_sha(f.get("original")) and _is_sha(f.get("current"))):
            return f"files: {rel!r} lacks sha256 'original'/'current'"
        if type(f.get("mode")) is not int or not 0 <= f["mode"] <= 0o7777:
            return f"files: {rel!r} has no valid mode"
    for i, a in enumerate(data["applied"]):
        if not isinstance(a, dict) or not isinstance(a.get("id"), str) or not isinstance(a.get("files"), list):
            return f"applied[{i}] lacks an id and a list of files"
        if not all(_safe_rel(rel) for rel in a["files"]):
            return f"applied[{i}].files holds a path outside the tree"
        if not all(isinstance(a.get(k, ""), str) for k in ("package", "arch", "at", "version")):
            return f"applied[{i}] has a non-string package/arch/at/version"
        if not all(isinstance(a.get(k, ""), (str, type(None))) for k in ("dist_version", "sha256")):
            return f"applied[{i}] has a non-string dist_version/sha256"
        for key, kind in (("evidence", dict), ("recheck", dict), ("git", dict), ("dependents", list)):
            if a.get(key) is not None and not isinstance(a[key], kind):
                return f"applied[{i}].{key} is not a {'table' if kind is dict else 'list'}"
        if not isinstance((a.get("evidence") or {}).get("verdicts", []), list):
            return f"applied[{i}].evidence.verdicts is not a list"
    pending = data.get("pending")
    if pending is not None:
        writes = pending.get("writes") if isinstance(pending, dict) else None
        if not isinstance(writes, dict):
            return "pending lacks its writes"
        if not isinstance(pending.get("applied_before", []), list) or not isinstance(
            pending.get("files_before", {}), dict
        ):
            return "pending has a damaged snapshot"
        if "applied_before" in pending:
            inner = _problem({"files": pending.get("files_before", {}), "applied": pending["applied_before"]})
            if inner:
                return f"pending snapshot: {inner}"
        for rel, w in writes.items():
            if not _safe_rel(rel):
                return f"pending: {rel!r} is not a path inside the tree"
            if not isinstance(w, dict) or not (_is_sha(w.get("before")) and _is_sha(w.get("after"))):
                return f"pending: {rel!r} lacks sha256 'before'/'after'"
    if not isinstance(data.get("history", []), list):
        return "history is not a list"
    if not isinstance(data.get("dists", {}), dict):
        return "dists is not a table"
    return None


@dataclass
class FileEntry:
    original: str
    current: str
    mode: int


@dataclass(frozen=True)
class Dependent:
    """An SGLang recipe proven on a FlashInfer recipe: it goes when that recipe goes."""

    root: Path
    package: str
    id: str

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Dependent:
        return cls(Path(str(raw.get("root", ""))), str(raw.get("package", "sglang")), str(raw.get("id", "")))

    def to_dict(self) -> dict[str, str]:
        return {**asdict(self), "root": str(self.root)}


class Applied:
    """One applied recipe, typed, over its journal.json record (which stays the storage, so the
    file keeps its readable shape and unknown keys of newer versions survive a load and save)."""

    __slots__ = ("raw",)

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw

    @property
    def id(self) -> str:
        return str(self.raw["id"])

    def package_or(self, default: str) -> str:
        """The package (journals of the first versions did not record it: the tree's own)."""
        return str(self.raw.get("package") or default)

    @property
    def files(self) -> list[str]:
        return list(self.raw.get("files") or [])

    @property
    def archs(self) -> list[str]:
        return [n for n in str(self.raw.get("arch", "")).split(",") if n]

    @property
    def version(self) -> str | None:
        """The package version the tree said at apply."""
        return self.raw.get("version") or None

    @property
    def dist_version(self) -> str | None:
        """The installed distribution's version at apply (dist-info), where there was one."""
        return self.raw.get("dist_version") or None

    @property
    def evidence(self) -> dict[str, Any]:
        return self.raw.get("evidence") or {}

    @property
    def verdicts(self) -> list[dict[str, Any]]:
        return list(self.evidence.get("verdicts") or [])

    @property
    def dependents(self) -> list[Dependent]:
        return [Dependent.of(d) for d in self.raw.get("dependents") or [] if isinstance(d, dict)]

    def add_dependent(self, dep: Dependent) -> None:
        deps = self.raw.setdefault("dependents", [])
        if dep.to_dict() not in deps:
            deps.append(dep.to_dict())

    @property
    def git(self) -> dict[str, Any] | None:
        """Where a `--commit` apply started (branch, HEAD, index), for rollback to return to."""
        g = self.raw.get("git")
        return g if isinstance(g, dict) else None


class Journal:
    """Load, change and save one tree's journal. Use `Journal.open(root)` under `lock()`."""

    def __init__(self, root: Path, directory: Path, data: dict[str, Any]) -> None:
        self.root = root
        self.dir = directory
        self.data = data
        self._txn = False  # inside begin()..commit(): one transaction for the whole command
        self._saved_in_txn = False
        self.recovered: list[str] = []  # files the last lock's recovery put back

    # --- loading and saving -----------------------------------------------------

    @classmethod
    def open(cls, root: Path) -> Journal:
        directory = state_dir_for(root)
        return cls(root, directory, cls._read(directory, root))

    @staticmethod
    def _read(directory: Path, root: Path | None = None) -> dict[str, Any]:
        root = root if root is not None else directory.parent
        path = directory / "journal.json"
        if not path.exists():
            return {"schema": SCHEMA, "applied": [], "files": {}, "pending": None, "history": []}
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError) as e:
            raise JournalError(f"{path}: unreadable journal ({e}); {damage_advice(root, directory)}") from None
        if (
            not isinstance(data, dict)
            or data.get("schema") != SCHEMA
            or not isinstance(data.get("files"), dict)
            or not isinstance(data.get("applied"), list)
        ):
            raise JournalError(
                f"{path}: not a journal of schema {SCHEMA} (written by another sm120patch version, or edited "
                f"by hand): roll back with the version that wrote it, or {damage_advice(root, directory)}"
            )
        problem = _problem(data)
        if problem:
            raise JournalError(f"{path}: damaged journal ({problem}); {damage_advice(root, directory)}")
        return data

    @property
    def exists(self) -> bool:
        return (self.dir / "journal.json").exists()

    def save(self) -> None:
        self._saved_in_txn = self._saved_in_txn or self._txn
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data["schema"] = SCHEMA
        self.data["tool_version"] = __version__
        self.data["root"] = str(self.root)
        atomic_write(self.dir / "journal.json", json.dumps(self.data, indent=1, sort_keys=True).encode())

    @contextlib.contextmanager
    def lock(self, wait_s: float = 0.0) -> Iterator[None]:
        """One writer per tree. A second run waits up to `wait_s`, then refuses with the fix.

        Once held, the journal is read again: what the previous holder left, not what was
        read before waiting (a stale copy would undo or forget that run's changes)."""
        deadline = time.monotonic() + wait_s
        lock_path = self.dir / "lock"
        while True:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                self._exclude_from_git()
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as e:
                raise WriteError(
                    f"{lock_path}: cannot create the lock ({e.strerror}); make {self.dir} writable, "
                    "or run as the tree's owner"
                ) from None
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
                # the holder we waited for may have removed the folder: then lock the new one
                st, now = os.fstat(fd), None
                with contextlib.suppress(OSError):
                    now = os.stat(lock_path, follow_symlinks=False)
            except BaseException:
                os.close(fd)
                raise
            if now is not None and (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev):
                break
            os.close(fd)
        try:
            self.data = self._read(self.dir, self.root)
            yield
        finally:
            if self.dir.is_dir() and not (self.dir / "journal.json").exists() and not (self.dir / "saved").exists():
                with contextlib.suppress(OSError):  # a run that recorded nothing leaves nothing behind
                    self._remove_all()
            os.close(fd)

    def _exclude_from_git(self) -> None:
        """Keep the journal out of `git status` on clones, via the repo's info/exclude (not a
        tracked file). Worktrees and submodules have a `.git` file: ask git where theirs is."""
        if self.dir.parent != self.root or not (self.root / ".git").exists():
            return
        if (self.root / ".git").is_dir():
            exclude = self.root / ".git" / "info" / "exclude"
        else:
            from sm120patch.gitops import git_path

            found = git_path(self.root, "info/exclude")
            if found is None:
                return
            exclude = found
        exclude.parent.mkdir(parents=True, exist_ok=True)
        text = exclude.read_text() if exclude.exists() else ""
        if f"/{DIRNAME}/" not in text.splitlines():
            exclude.write_text(text + ("" if text.endswith("\n") or not text else "\n") + f"/{DIRNAME}/\n")

    # --- what it records -----------------------------------------------------------

    @property
    def applied(self) -> list[dict[str, Any]]:
        return self.data["applied"]

    def applied_ids(self) -> list[str]:
        return [a["id"] for a in self.applied]

    def entries(self, package: str | None = None) -> list[Applied]:
        """The applied recipes, typed (of `package` only, when given), in the order applied."""
        out = [Applied(a) for a in self.applied]
        return [e for e in out if e.package_or(package) == package] if package else out

    def file(self, rel: str) -> FileEntry | None:
        f = self.data["files"].get(rel)
        return FileEntry(f["original"], f["current"], f["mode"]) if f else None

    def blob(self, digest: str) -> bytes:
        try:
            data = (self.dir / "blobs" / digest).read_bytes()
        except OSError:
            raise JournalError(
                f"{self.dir}: blob {digest[:12]} is missing; the journal cannot restore that file: "
                f"{damage_advice(self.root, self.dir, readable=True)}"
            ) from None
        if sha256(data) != digest:
            raise JournalError(
                f"{self.dir}: blob {digest[:12]} is corrupt; the journal cannot restore that file: "
                f"{damage_advice(self.root, self.dir, readable=True)}"
            )
        return data

    def missing_blobs(self) -> list[str]:
        """Files whose original bytes the journal can no longer give back (blob gone or damaged)."""
        out = []
        for rel, f in sorted(self.data["files"].items()):
            path = self.dir / "blobs" / f["original"]
            try:
                ok = sha256(path.read_bytes()) == f["original"]
            except OSError:
                ok = False
            if not ok:
                out.append(rel)
        return out

    def original(self, rel: str) -> bytes:
        entry = self.file(rel)
        if entry is None:
            return (self.root / rel).read_bytes()
        return self.blob(entry.original)

    def _store_blob(self, data: bytes) -> str:
        digest = sha256(data)
        path = self.dir / "blobs" / digest
        if not path.is_file() or sha256(path.read_bytes()) != digest:  # a damaged copy is rewritten
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)
        return digest

    def note(self, action: str, **fields: Any) -> None:
        self.data.setdefault("history", []).append(
            {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "action": action, **fields}
        )

    # --- transactions ------------------------------------------------------------------

    def begin(self) -> None:
        """Open one transaction for a whole command: every `write` until `commit` joins it, and
        `recover` (a later run's, or this one's on an error or Ctrl-C) puts back every file it
        wrote and the journal's entries as they were, so a command leaves all or nothing."""
        if self.data.get("pending"):
            raise JournalError(f"{self.dir}: an interrupted run is pending; run `{rollback_command(self.root)}`")
        self.data["pending"] = {
            "started": time.time(),
            "writes": {},
            "applied_before": json.loads(json.dumps(self.data["applied"])),
            "files_before": json.loads(json.dumps(self.data["files"])),
        }
        self._txn = True
        self._saved_in_txn = False

    @property
    def in_transaction(self) -> bool:
        return self._txn

    def commit(self) -> None:
        """Close the command's transaction: what it wrote stays. Saved only when something was."""
        if not self.in_transaction:
            return
        self._txn = False
        self.data["pending"] = None
        self._drop_unchanged()
        if self.exists or self.applied or self.data["files"]:
            self.save()

    def abandon(self) -> list[str]:
        """Undo the command's transaction (an error or Ctrl-C): every file it wrote back as it was.
        A transaction that neither wrote nor saved leaves the journal's bytes untouched."""
        if not self.in_transaction:
            return []
        self._txn = False
        pending = self.data.get("pending") or {}
        if not pending.get("writes") and not self._saved_in_txn:
            self.data["pending"] = None
            self.data["applied"] = pending.get("applied_before", self.applied)
            self.data["files"] = pending.get("files_before", self.data["files"])
            return []
        return self.recover()

    def _drop_unchanged(self) -> None:
        for rel in list(self.data["files"]):  # files back to their original need no entry
            f = self.data["files"][rel]
            if f["current"] == f["original"]:
                del self.data["files"][rel]

    def write(self, new: dict[str, bytes]) -> None:
        """Replace files (rel -> bytes) as one recoverable transaction; caller saves `applied` after.
        Inside `begin`..`commit` the writes join the command's transaction (undone together)."""
        own = not self.in_transaction
        if own:
            self.begin()
        pending = self.data["pending"]
        writes: dict[str, dict[str, str]] = pending["writes"]
        saved_files = json.loads(json.dumps(self.data["files"]))
        saved_writes = json.loads(json.dumps(writes))
        try:
            for rel, data in sorted(new.items()):
                path = self._path(rel)
                try:
                    before = path.read_bytes()
                except FileNotFoundError:
                    if rel not in self.data["files"]:
                        raise
                    before = self.blob(self.data["files"][rel]["original"])  # deleted since: restore it
                b_sha = self._store_blob(before)
                entry = self.data["files"].get(rel)
                if entry is None:
                    entry = {"original": b_sha, "current": b_sha, "mode": path.stat().st_mode & 0o7777}
                    self.data["files"][rel] = entry
                first = writes.get(rel, {}).get("before", b_sha)  # an earlier write of this command
                writes[rel] = {"before": first, "after": sha256(data)}
            self.save()  # the undo data is on disk before the first file changes
        except OSError as e:  # nothing in the tree changed by this write
            self.data["files"] = saved_files
            pending["writes"] = saved_writes
            if own:
                self._txn, self.data["pending"] = False, None
                with contextlib.suppress(OSError):
                    self.remove_if_empty()
            raise WriteError(
                f"{e.filename or self.dir}: cannot read or write ({e.strerror or e}); nothing was changed. "
                "Make it readable/writable (or run as the tree's owner) and run the command again"
            ) from None
        try:
            for rel, data in sorted(new.items()):
                path = self.root / rel
                atomic_write(path, data, self.data["files"][rel]["mode"])
                self.data["files"][rel]["current"] = writes[rel]["after"]
        except OSError as e:  # put back what was written, then say which file refused
            with contextlib.suppress(OSError, UserError):
                self._txn = False
                self.recover()
                self.remove_if_empty()
            raise WriteError(
                f"{path}: cannot write ({e.strerror or e}); nothing was changed. Make it and its folder "
                "writable (chmod u+w), free disk space, or run as the tree's owner, then run the command again"
            ) from None
        if own:
            self._txn = False
            self.data["pending"] = None
            self._drop_unchanged()

    def recover(self) -> list[str]:
        """Undo an interrupted transaction: every file back to its before-bytes. Returns rel paths restored."""
        pending = self.data.get("pending")
        if not pending:
            return []
        restored = []
        for rel, w in sorted(pending["writes"].items()):
            path = self._path(rel)
            for tmp in path.parent.glob(f".{path.name}.*{TMP_SUFFIX}"):  # left by a kill mid-write
                with contextlib.suppress(OSError):
                    tmp.unlink()
            try:
                now = sha256(path.read_bytes())
            except FileNotFoundError:
                now = None
            if now == w["after"] or now is None:
                atomic_write(path, self.blob(w["before"]), self.data["files"].get(rel, {}).get("mode"))
                restored.append(rel)
            if rel in self.data["files"]:
                self.data["files"][rel]["current"] = w["before"]
        if isinstance(pending.get("applied_before"), list) and isinstance(pending.get("files_before"), dict):
            # a command transaction: the journal's entries as they were before it
            self.data["applied"], self.data["files"] = pending["applied_before"], pending["files_before"]
        self.data["pending"] = None
        self._drop_unchanged()
        self.note("recover", files=restored)
        self.save()
        return restored

    def remove_if_empty(self) -> bool:
        """Delete the journal folder once nothing is applied and no user copy is kept."""
        if self.in_transaction or not self.dir.is_dir():
            return False
        if self.applied or self.data["files"] or self.data.get("pending") or (self.dir / "saved").exists():
            return False
        self._remove_all()
        return True

    def _remove_all(self) -> None:
        # journal.json goes last: a kill midway leaves a journal that says "nothing applied",
        # which the next rollback cleans up, never blobs without their journal
        journal = self.dir / "journal.json"
        for p in sorted(self.dir.rglob("*"), key=lambda p: (p == journal, -len(p.parts), str(p))):
            _fault(f"remove {p.name}")
            if p.is_dir() and not p.is_symlink():
                p.rmdir()
            else:
                p.unlink()
        _fault(f"remove {self.dir.name}")
        self.dir.rmdir()

    def _path(self, rel: str) -> Path:
        """A journal path as a file of this tree; never one reached through a symlink out of it."""
        path = self.root / rel
        if path.is_symlink() or not path.parent.resolve().is_relative_to(self.root.resolve()):
            raise JournalError(
                f"{path}: is a symlink or lies outside {self.root}; sm120patch never writes through links. "
                "Replace the link with a real file (or restore the tree), then run the command again"
            )
        return path

    def keep_copy(self, rel: str) -> Path:
        """Save the user's version of a file before `--force` replaces it."""
        src = self.root / rel
        dest = self.dir / "saved" / f"{rel}.{time.strftime('%Y%m%d-%H%M%S')}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(dest, src.read_bytes())
        return dest
