"""Honest about its input: a log that is empty or not text is refused (exit 2) with one line,
and a log that takes more than a second to read shows how far the reading is, on stderr (in place on
a terminal, a line every few seconds otherwise: a CI job or `2> file` sees it too)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import IO

HEAD_BYTES = 64 * 1024
PROGRESS_AFTER_S = 1.0  # a log read faster than this shows nothing
PROGRESS_EVERY_S = 0.5  # on a terminal, updated in place
PROGRESS_LINE_EVERY_S = 5.0  # elsewhere, one line each
CHECK_EVERY = 4096  # lines between looks at the clock
_TEXT_CONTROLS = {9, 10, 12, 13, 27}  # tab, newline, form feed, carriage return, ESC (colours)


def head(stream: IO[bytes]) -> bytes:
    """The first bytes of the stream, without consuming them (peek on pipes, seek back on files)."""
    if stream.seekable():
        data = stream.read(HEAD_BYTES)
        stream.seek(0)
        return data
    peek = getattr(stream, "peek", None)
    return peek(HEAD_BYTES)[:HEAD_BYTES] if peek else b""


def check_head(data: bytes, name: str) -> str | None:
    """A one-line reason the input is not a log, or None when it reads as text."""
    if not data.strip():
        return f"{name}: the log is empty; give the server's log file (its stdout/stderr), or pipe it to -"
    if data[:2] == b"\x1f\x8b" or data[:4] in (b"PK\x03\x04", b"\x28\xb5\x2f\xfd") or data[:3] == b"BZh":
        return f"{name}: is compressed, not a text log; decompress it first (e.g. zcat {name} | sm120patch diagnose -)"
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return (
            f"{name}: is UTF-16 text (a PowerShell redirect?), not UTF-8; convert it first: "
            f"iconv -f UTF-16 -t UTF-8 {name} | sm120patch diagnose -"
        )
    text = data.decode("utf-8", errors="replace")
    bad = sum(1 for ch in text if ch == "\ufffd" or (ord(ch) < 32 and ord(ch) not in _TEXT_CONTROLS))
    if b"\x00" in data or bad > max(8, len(text) // 20):
        return f"{name}: is not a text log (binary bytes); give the server's text log"
    return None


def with_progress(lines: Iterator[str], stream: IO[bytes], name: str, tty: bool) -> Iterator[str]:
    """Pass the lines through; once reading has taken PROGRESS_AFTER_S, say how far it is on stderr: in place on
    a terminal (TTY), else a line every PROGRESS_LINE_EVERY_S. Of a file: bytes of its size; of a pipe: lines."""
    try:
        total = os.fstat(stream.fileno()).st_size if stream.seekable() else 0
    except (OSError, ValueError, AttributeError):
        total = 0
    every = PROGRESS_EVERY_S if tty else PROGRESS_LINE_EVERY_S
    start = time.monotonic()
    due = start + PROGRESS_AFTER_S
    shown = False
    for n, line in enumerate(lines, 1):
        yield line
        if n % CHECK_EVERY == 0 and time.monotonic() >= due:
            due = time.monotonic() + every
            text = f"diagnose: {name}: {_how_far(stream, total, n)} ({time.monotonic() - start:.0f} s)"
            sys.stderr.write(f"\r{text}\033[K" if tty else f"{text}\n")
            sys.stderr.flush()
            shown = True
    if shown and tty:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


def _how_far(stream: IO[bytes], total: int, lines: int) -> str:
    if total:
        try:
            done = stream.tell()
        except (OSError, ValueError):
            done = 0
        if done:
            return f"read {done >> 20} of {total >> 20} MB ({100 * done // total}%)"
    return f"read {lines} lines"
