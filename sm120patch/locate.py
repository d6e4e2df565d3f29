"""Where an edit looks: the recipe's file hints first, then the whole package.

Code moves between releases, so hints are only the cheap first try. The fallback
reads every .py file of the package once per plan (bytes, no parsing) and keeps
those holding a needle; only those are ever parsed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from sm120patch.targets import Target

SKIP_DIRS = {"__pycache__", ".git", ".sm120patch", "tests", "test", "node_modules"}


class PackageIndex:
    """Lazily lists and reads a package's .py files, at most once each."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._files: list[Path] | None = None
        self._text: dict[Path, bytes] = {}

    def files(self) -> list[Path]:
        if self._files is None:
            out: list[Path] = []
            for p in sorted(self.target.package_dir.rglob("*.py")):
                rel = p.relative_to(self.target.package_dir).parts
                if any(part in SKIP_DIRS for part in rel[:-1]) or p.is_symlink() or not p.is_file():
                    continue
                out.append(p)
            self._files = out
        return self._files

    def read(self, path: Path) -> bytes:
        if path not in self._text:
            try:
                self._text[path] = path.read_bytes()
            except OSError:
                self._text[path] = b""
        return self._text[path]

    def containing(self, needles: Iterable[str], paths: Iterable[Path] | None = None) -> list[Path]:
        """Files holding any needle; a full scan does not keep the bytes it read."""
        raw = [n.encode() for n in needles]
        hits = []
        for p in self.files() if paths is None else paths:
            data = self._text.get(p)
            if data is None:
                try:
                    data = p.read_bytes()
                except OSError:
                    continue
            if any(n in data for n in raw):
                self._text[p] = data
                hits.append(p)
        return hits

    def hints(self, hints: Iterable[str]) -> list[Path]:
        """Hinted files that exist inside the package and are not symlinks out of it."""
        base = self.target.package_dir.resolve()
        out = []
        for h in hints:
            p = self.target.package_dir / h
            if p.is_file() and not p.is_symlink() and p.resolve().is_relative_to(base):
                out.append(p)
        return out
