"""Verdict cache: one small JSON file per (kernel, arch, FlashInfer, level, python).

The key is a digest of what the verdict depends on, the contents of the files the static rung
reads among them (the sha256 of the kernel's generator and source-check files, not their mtime
or size), so editing FlashInfer (or a recipe that patches it) gives another key; and a hit counts
only while every file its evidence records still has the sha256 it had (probes/evidence.py).
Only definitive verdicts (pass/fail) are stored; an `unknown` usually means "try again with more
tools". Writes are atomic (temp file + rename) so a killed run never leaves a truncated entry.
The same store keeps `preflight`'s plan statuses (planning/plan_cache.py).

Below it: a file's sha256, remembered per (path, inode, size, mtime) within one look (a spec ask,
a build); and `AnswerCache`, what FlashInfer's generator answered, kept with a signature of every
Python file the interpreter loaded: the sha256 for FlashInfer's own, size and mtime for the rest.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from sm120patch.hashing import sha256_file, sha256_json

SCHEMA = 1


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sm120patch" / "probes"


class ProbeCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root else default_cache_dir()

    @staticmethod
    def key(parts: dict[str, Any]) -> str:
        return sha256_json({"schema": SCHEMA, **parts}, sort_keys=True, default=str)[:32]

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("schema") == SCHEMA else None

    def put(self, key: str, verdict: dict[str, Any]) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"schema": SCHEMA, **verdict}, f)
            os.replace(tmp, self._path(key))
        except OSError:
            pass  # a cache that cannot be written only costs time


# --- file signatures: what a cached answer stood on, checked without starting the interpreter ------

_SHA_MEMO: dict[tuple[str, int, int, int], str] = {}


def forget_digests() -> None:
    """Start a new look: files may have changed since the last one (a test, a long-lived caller)."""
    _SHA_MEMO.clear()


def file_digest(path: Path) -> str:
    """sha256 of a file, remembered per (path, inode, size, mtime) so one run hashes a header once
    however many translation units include it; "missing" for a file that is not there."""
    try:
        st = path.stat()
    except OSError:
        return "missing"
    memo = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    if (hit := _SHA_MEMO.get(memo)) is not None:
        return hit
    digest = sha256_file(path)
    if digest is None:
        return "missing"
    _SHA_MEMO[memo] = digest
    return digest


def file_signature(path: Path, hashed_under: Path | None) -> str:
    """The bytes' sha256 for files under `hashed_under` (FlashInfer's own, which a recipe or a user
    edits), size and mtime for the rest (torch, the standard library: a reinstall changes both)."""
    if hashed_under is not None and path.is_relative_to(hashed_under):
        return "sha256:" + file_digest(path)
    try:
        st = path.stat()
    except OSError:
        return "missing"
    return f"stat:{st.st_size}:{st.st_mtime_ns}"


class AnswerCache:
    """What FlashInfer's generator said (a JitSpec, an error, its compile commands), one JSON file per
    question, kept with the signature of every Python file the interpreter had loaded: an answer
    counts only while all of them are unchanged, so a warm probe starts no interpreter at all."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root) / "answers"

    def get(self, key: str, hashed_under: Path | None) -> dict[str, Any] | None:
        try:
            data = json.loads((self.root / f"{key}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("files"), dict):
            return None
        for name, sig in data["files"].items():
            if file_signature(Path(name), hashed_under) != sig:
                return None
        answer = data.get("answer")
        return answer if isinstance(answer, dict) else None

    def put(self, key: str, answer: dict[str, Any], files: list[str], hashed_under: Path | None) -> None:
        sigs = {f: file_signature(Path(f), hashed_under) for f in files}
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"schema": SCHEMA, "files": sigs, "answer": answer}, f)
            os.replace(tmp, self.root / f"{key}.json")
        except OSError:
            pass
