"""Memoizing per line changes no finding: a crash-looping server's log (real corpus excerpts, repeated) gets the
same diagnosis, to the byte, with the caches on as with them off; the caches stay bounded."""

from __future__ import annotations

import json

import pytest

from sm120patch.triage import memo
from sm120patch.triage.diagnose import diagnose
from tools.triage_score import load_corpus

STARTUP = (
    "[2026-01-02 10:{m:02d}:{s:02d} TP0] Init torch distributed begin.\n",
    "[2026-01-02 10:{m:02d}:{s:02d} TP0] Load weight begin. avail mem=93.12 GB\n",
    "[2026-01-02 10:{m:02d}:{s:02d} TP0] Capture cuda graph begin. This can take up to several minutes.\n",
)
# a fatal line with the restart's own timestamp: nothing names it, so the report shows it, stamp and all
UNNAMED = "[2026-01-02 10:{m:02d}:{s:02d} TP0] Scheduler hit an exception: ValueError: bad shard {s}\n"


def _crash_loop(stride: int, repeats: int) -> list[str]:
    """Every STRIDE-th corpus excerpt after a server's startup lines, the whole of it REPEATS times, each restart
    with its own timestamps (lines that differ only there share a cache entry)."""
    lines: list[str] = []
    n = 0
    for _ in range(repeats):
        for case in load_corpus()[::stride]:
            n += 1
            stamp = {"m": n // 60 % 60, "s": n % 60}
            lines += [x.format(**stamp) for x in STARTUP]
            lines += case.excerpt.splitlines(keepends=True)
            if n % 7 == 0:
                lines.append(UNNAMED.format(**stamp))
    return lines


def _answer(lines: list[str]) -> str:
    return json.dumps(diagnose(lines, [], None).to_dict(), sort_keys=True)


def test_a_crash_loop_gets_the_same_answer_with_and_without_memoization() -> None:
    lines = _crash_loop(stride=3, repeats=2)
    with memo.disabled():
        reference = _answer(lines)
    assert _answer(lines) == reference
    assert _answer(lines) == reference  # warm caches (a second log in the same process) too
    d = json.loads(reference)
    assert d["lines_read"] == len(lines) and any(f["count"] > 1 for f in d["findings"])
    last = next(x for x in reversed(lines) if "bad shard" in x)
    assert any(e["line"] == last.strip() for e in d["unnamed_errors"]), d["unnamed_errors"]  # its own stamp


def test_a_cache_that_fills_starts_afresh_and_answers_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = _crash_loop(stride=25, repeats=3)
    with memo.disabled():
        reference = _answer(lines)
    monkeypatch.setattr(memo, "MAX_CHARS", 2000)
    assert _answer(lines) == reference


def test_cache_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    @memo.per_line
    def upper(line: str) -> str:
        calls.append(line)
        return line.upper()

    monkeypatch.setattr(memo, "MAX_KEY", 10)
    assert upper("short") == upper("short") == "SHORT" and calls == ["short"]
    long = "x" * 11
    assert upper(long) == upper(long) and calls.count(long) == 2  # too long to keep: computed each time
    monkeypatch.setattr(memo, "MAX_CHARS", 200)
    for i in range(20):
        upper(f"line {i}")
    assert upper("short") and calls.count("short") == 2  # the cache started afresh when it passed MAX_CHARS
    with memo.disabled():
        upper("line 19")
    assert calls.count("line 19") == 2
