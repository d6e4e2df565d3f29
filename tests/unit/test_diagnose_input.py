"""diagnose is honest about its input: an empty, binary or compressed log is refused with one
line and exit 2 (nothing is diagnosed from it); a log that takes over a second shows progress on stderr, on a
terminal or not, unless --quiet."""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from sm120patch.triage import log_input
from tests.unit.cli_entry import SM120PATCH


@pytest.mark.parametrize(
    ("blob", "says"),
    [
        (b"", "the log is empty"),
        (b"\n\n  \n", "the log is empty"),
        (bytes(range(256)) * 40, "is not a text log"),
        (gzip.compress(b"RuntimeError: CUDA error: no kernel image is available\n", mtime=0), "is compressed"),
        ("RuntimeError: CUDA error\r\n".encode("utf-16"), "is UTF-16 text"),
    ],
    # ids by meaning: xdist requires every worker to collect the same ids
    ids=["empty", "blank-lines", "binary", "gzip", "utf-16"],
)
def test_not_a_log_is_exit_2_with_one_line(tmp_path: Path, blob: bytes, says: str) -> None:
    p = tmp_path / "server.log"
    p.write_bytes(blob)
    res = CliRunner().invoke(SM120PATCH, ["diagnose", str(p)])
    assert res.exit_code == 2, res.output
    assert res.output.count("\n") == 1 and says in res.output and str(p) in res.output


def test_random_bytes_on_stdin_are_refused() -> None:
    res = CliRunner().invoke(SM120PATCH, ["diagnose", "-"], input=os.urandom(4096))
    assert res.exit_code == 2 and "stdin: is not a text log" in res.output


def test_a_log_with_colours_and_a_few_odd_bytes_is_still_text(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    p.write_bytes(b"\x1b[31mRuntimeError: CUDA error: an illegal instruction was encountered\x1b[0m\n\xff ok\n")
    res = CliRunner().invoke(SM120PATCH, ["diagnose", str(p)])
    assert res.exit_code == 0 and "cuda-illegal-instruction" in res.output


def test_head_does_not_consume_the_stream() -> None:
    s = io.BytesIO(b"line one\nline two\n")
    assert log_input.head(s) == b"line one\nline two\n" and s.read() == b"line one\nline two\n"


def test_progress_on_a_terminal_goes_to_stderr_and_is_cleared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "big.log"
    p.write_bytes(b"decode batch\n" * 200_000)
    monkeypatch.setattr(log_input, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(log_input, "PROGRESS_EVERY_S", 0.0)
    with p.open("rb") as f:
        n = sum(1 for _ in log_input.with_progress(iter(f.readline, b""), f, "big.log", tty=True))
    err = capsys.readouterr().err
    assert n == 200_000 and "\rdiagnose: big.log: read " in err and " MB (" in err and err.endswith("\r\033[K")


def test_progress_off_a_terminal_is_whole_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "big.log"
    p.write_bytes(b"decode batch\n" * 50_000)
    monkeypatch.setattr(log_input, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(log_input, "PROGRESS_LINE_EVERY_S", 0.0)
    with p.open("rb") as f:
        n = sum(1 for _ in log_input.with_progress(iter(f.readline, b""), f, "big.log", tty=False))
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert n == 50_000 and lines and "\r" not in err and "\033" not in err
    assert all(line.startswith("diagnose: big.log: read ") for line in lines), err


def test_progress_of_a_pipe_counts_lines(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    r, w = os.pipe()
    os.write(w, b"x\n" * 20_000)
    os.close(w)
    monkeypatch.setattr(log_input, "PROGRESS_AFTER_S", 0.0)
    with os.fdopen(r, "rb") as f:
        n = sum(1 for _ in log_input.with_progress(iter(f.readline, b""), f, "stdin", tty=False))
    assert n == 20_000 and "diagnose: stdin: read 4096 lines" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "shown"), [([], True), (["--quiet"], False)])
def test_cli_progress_when_slow_and_quiet_silences_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: list[str], shown: bool
) -> None:
    p = tmp_path / "server.log"
    p.write_text("INFO decode batch\n" * 9000 + "RuntimeError: CUDA error: no kernel image is available\n")
    monkeypatch.setattr(log_input, "PROGRESS_AFTER_S", 0.0)  # as if reading took longer than a second
    res = CliRunner().invoke(SM120PATCH, ["diagnose", *flag, "--json", str(p)])
    assert res.exit_code in (0, 1), res.output
    assert json.loads(res.stdout)["lines_read"] == 9001  # progress never mixes into stdout
    assert ("diagnose: " in res.stderr) is shown, res.stderr


def test_no_progress_for_a_short_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "small.log"
    p.write_bytes(b"x\n" * 10)
    with p.open("rb") as f:
        assert len(list(log_input.with_progress(iter(f.readline, b""), f, "small.log", tty=True))) == 10
    assert capsys.readouterr().err == ""
