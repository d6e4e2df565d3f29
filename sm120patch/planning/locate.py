"""Where an edit looks: the recipe's file hints first, then the whole package.

Code moves between releases, so hints are only the cheap first try. The fallback
reads every .py file of the package once per plan (bytes, no parsing) and keeps
those holding a needle; only those are ever parsed. That one pass searches for the
needles of every edit the plan expects (`expect`), so a second edit that misses
its hints is answered from memory instead of reading the package again.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from sm120patch.planning.targets import Target

SKIP_DIRS = {"__pycache__", ".git", ".sm120patch", "tests", "test", "node_modules"}


def _def_name(needle: str) -> str | None:
    """`foo` for the needle `def foo(`, which one alternation of names can search for."""
    if needle.startswith("def ") and needle.endswith("("):
        name = needle[4:-1]
        if name and not any(c.isspace() or c in "()" for c in name):
            return name
    return None


class PackageIndex:
    """Lazily lists and reads a package's .py files, at most once each."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._files: list[Path] | None = None
        self._text: dict[Path, bytes] = {}
        self._expected: set[str] = set()
        self._hits: dict[str, set[Path]] = {}  # needle -> files holding it, from full scans

    def files(self) -> list[Path]:
        """Every regular .py file under the package, outside SKIP_DIRS, not through symlinks."""
        if self._files is None:
            out: list[Path] = []
            stack = [self.target.package_dir]
            while stack:
                d = stack.pop()
                try:
                    with os.scandir(d) as it:
                        entries = list(it)
                except OSError:
                    continue
                for e in entries:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            if e.name not in SKIP_DIRS:
                                stack.append(d / e.name)
                        elif e.name.endswith(".py") and e.is_file(follow_symlinks=False):
                            out.append(d / e.name)
                    except OSError:
                        continue
            self._files = sorted(out)
        return self._files

    def read(self, path: Path) -> bytes:
        if path not in self._text:
            try:
                self._text[path] = path.read_bytes()
            except OSError:
                self._text[path] = b""
        return self._text[path]

    def expect(self, needles: Iterable[str]) -> None:
        """Needles later edits may search the whole package for: one scan serves them all."""
        self._expected.update(needles)

    def containing(self, needles: Iterable[str], paths: Iterable[Path] | None = None) -> list[Path]:
        """Files holding any needle; a full scan does not keep the bytes of files without one."""
        needles = list(needles)
        if paths is None:
            todo = [n for n in needles if n not in self._hits]
            if todo:
                self._scan({*todo, *(self._expected - self._hits.keys())})
            hit: set[Path] = set().union(*(self._hits[n] for n in needles))
            return [p for p in self.files() if p in hit]
        raw = [n.encode() for n in needles]
        hits = []
        for p in paths:
            data = self._peek(p)
            if data is None:
                continue
            if any(n in data for n in raw):
                self._text[p] = data
                hits.append(p)
        return hits

    def _peek(self, path: Path) -> bytes | None:
        """A file's bytes, from what was kept or from disk (not kept: scans read many files)."""
        data = self._text.get(path)
        if data is None:
            try:
                data = path.read_bytes()
            except OSError:
                return None
        return data

    def _scan(self, needles: set[str]) -> None:
        """One pass over the package for all `needles`; `def name(` needles share one regex."""
        names = {name: n for n in needles if (name := _def_name(n))}
        plain = [(n, n.encode()) for n in needles if n not in names.values()]
        rx = None
        if names:
            alt = b"|".join(re.escape(name.encode()) for name in sorted(names, key=len, reverse=True))
            rx = re.compile(b"def (" + alt + rb")\(")
        by_name = {name.encode(): n for name, n in names.items()}
        for n in needles:
            self._hits[n] = set()
        for p in self.files():
            data = self._peek(p)
            if data is None:
                continue
            found = {by_name[m] for m in rx.findall(data)} if rx is not None else set()
            found.update(n for n, b in plain if b in data)
            if found:
                self._text[p] = data
                for n in found:
                    self._hits[n].add(p)

    def hints(self, hints: Iterable[str]) -> list[Path]:
        """Hinted files that exist inside the package and are not symlinks out of it."""
        base = self.target.package_dir.resolve()
        out = []
        for h in hints:
            p = self.target.package_dir / h
            if p.is_file() and not p.is_symlink() and p.resolve().is_relative_to(base):
                out.append(p)
        return out
