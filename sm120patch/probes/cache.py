"""Verdict cache: one small JSON file per (kernel, arch, FlashInfer, level, python).

The key includes the generator file's mtime and size, so editing FlashInfer (or a
recipe that patches it) invalidates the answer. Only definitive verdicts (pass/fail)
are stored; an `unknown` usually means "try again with more tools". Writes are atomic
(temp file + rename) so a killed run never leaves a truncated entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

SCHEMA = 1


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sm120patch" / "probes"


class ProbeCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root else default_cache_dir()

    @staticmethod
    def key(parts: dict[str, Any]) -> str:
        blob = json.dumps({"schema": SCHEMA, **parts}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

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
