"""Every sha256 sm120patch computes, in one place.

These digests are kept on users' disks (journals, bundle manifests, the plan, verdict, answer,
build, overlay and census caches), so each helper's output is part of those formats: a helper
may gain callers, never a different digest for the same input. Text is encoded as UTF-8 (what
`str.encode()` does) and JSON is `json.dumps` with its default separators, as the callers
always hashed them; a caller that keeps a prefix of a digest slices it itself.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def sha256(data: bytes) -> str:
    """The hex digest of bytes (file contents a journal or bundle records)."""
    return hashlib.sha256(data).hexdigest()


def sha256_raw(data: bytes) -> bytes:
    """The 32-byte digest, for a key built from several digests."""
    return hashlib.sha256(data).digest()


def sha256_text(text: str) -> str:
    """The hex digest of a string's UTF-8 bytes (a path or a name that keys a folder)."""
    return hashlib.sha256(text.encode()).hexdigest()


def sha256_json(value: Any, *, sort_keys: bool = False, default: Callable[[Any], Any] | None = None) -> str:
    """The hex digest of `json.dumps(value)` (a cache key made of plain data)."""
    return sha256_text(json.dumps(value, sort_keys=sort_keys, default=default))


def sha256_chunks(chunks: Iterable[bytes]) -> str:
    """The hex digest of the chunks fed in order: the same as of their concatenation."""
    return _fed(chunks).hexdigest()


def sha256_chunks_raw(chunks: Iterable[bytes]) -> bytes:
    """`sha256_chunks` as the 32-byte digest."""
    return _fed(chunks).digest()


def sha256_file(path: Path) -> str | None:
    """The hex digest of a file's bytes; None when it cannot be read (missing, a folder, no access)."""
    try:
        return sha256(Path(path).read_bytes())
    except OSError:
        return None


def _fed(chunks: Iterable[bytes]) -> Any:
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk)
    return h
