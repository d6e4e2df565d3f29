"""Per-line memoization: a log that repeats (a server in a restart loop writes the same traceback hundreds of
times) costs what its distinct lines cost, not what its bytes cost.

Only pure functions of one line's text are memoized (what a line's words show, which catalogue signature
matches it); what depends on where a line is (its number, the lines around it) is computed each time from
the memoized facts. Memory is bounded: lines longer than MAX_KEY are computed every time, and a cache whose keys pass
MAX_CHARS characters starts afresh (tens of MB at worst over all caches).

Lines that differ only in their leading timestamp (each restart writes new ones) share an entry, unless the result
shows the timestamp. `disabled()` turns every cache off (the check that memoization changes no finding compares
with it).
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

MAX_KEY = 16 * 1024  # characters; longer lines are rare and computed each time
MAX_CHARS = 4 * 1024 * 1024  # characters of keys one cache holds before it starts afresh (bounded memory)

T = TypeVar("T")
_enabled = True
_caches: list[_Cache] = []

# A log line's leading timestamp (and the pid of a vLLM worker's prefix): every restart of a crash-looping server
# writes its lines again with new ones. Lines that differ only there share an entry, keyed by the stamp's shape
# (its digits as 0), unless the result holds the stamp's text (then it is computed per line).
_STAMP = re.compile(
    r"^\W{0,3}(?:\(\w+ pid=\d+\)\s*)?(?:[A-Z]{4,8}\s+)?\d{2,4}[-/]\d\d(?:[-/]\d\d)?[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?"
    r"(?: (?:DP|TP|PP|EP)\d+)*"
)
_DIGITS = re.compile(r"\d")


class _Cache:
    """One function's memo: exact lines, then lines that differ only in their leading timestamp."""

    def __init__(self, fn: Callable[[str], Any]) -> None:
        self.fn = fn
        self.entries: dict[str, Any] = {}
        self.size = 0

    def __call__(self, line: str) -> Any:
        if not _enabled:
            return self.fn(line)
        entries = self.entries
        try:
            return entries[line]
        except KeyError:
            pass
        m = _STAMP.match(line) if line[:1] in "[(0123456789" or line[:1].isupper() else None
        key = line
        if m is not None:
            key = "\0" + _DIGITS.sub("0", m.group(0)) + line[m.end() :]
            try:
                return entries[key]
            except KeyError:
                pass
        got = self.fn(line)
        if len(line) > MAX_KEY or (m is not None and m.group(0).strip("[( ") in repr(got)):
            return got  # too long to keep, or the result shows this line's own stamp
        self.size += len(key) + 64
        if self.size > MAX_CHARS:  # cheaper than LRU bookkeeping on every hit; a restart loop fits well within
            entries.clear()
            self.size = len(key) + 64
        entries[key] = got
        return got

    def clear(self) -> None:
        self.entries.clear()
        self.size = 0


def per_line(fn: Callable[[str], T]) -> Callable[[str], T]:
    """Memoize FN, a pure function of one line of text (its result is shared: callers must not mutate it)."""
    cache = _Cache(fn)
    _caches.append(cache)
    return functools.wraps(fn)(cache)  # type: ignore[return-value]


class LineMemo(_Cache):
    """per_line for one object's own function (a Diagnoser's matcher holds its own signatures)."""


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Every per-line cache off (and emptied) for the duration: the reference the memoized run must equal."""
    global _enabled
    for c in _caches:
        c.clear()
    _enabled = False
    try:
        yield
    finally:
        _enabled = True
