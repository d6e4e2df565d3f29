"""diagnose is honest about its input: an empty, binary or compressed log is refused with one
line and exit 2 (nothing is diagnosed from it); a long log read on a terminal shows progress."""

from __future__ import annotations

import gzip
import io
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
        (gzip.compress(b"RuntimeError: CUDA error: no kernel image is available\n"), "is compressed"),
        ("RuntimeError: CUDA error\r\n".encode("utf-16"), "is UTF-16 text"),
    ],
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


def test_progress_on_a_long_file_goes_to_stderr_and_is_cleared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "big.log"
    p.write_bytes(b"decode batch\n" * 200_000)
    monkeypatch.setattr(log_input, "PROGRESS_BYTES", 1024)
    monkeypatch.setattr(log_input, "PROGRESS_EVERY_S", 0.0)
    with p.open("rb") as f:
        n = sum(1 for _ in log_input.with_progress(iter(f.readline, b""), f, "big.log"))
    err = capsys.readouterr().err
    assert n == 200_000 and "diagnose: big.log: read " in err and err.endswith("\r\033[K")


def test_no_progress_for_a_short_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "small.log"
    p.write_bytes(b"x\n" * 10)
    with p.open("rb") as f:
        assert len(list(log_input.with_progress(iter(f.readline, b""), f, "small.log"))) == 10
    assert capsys.readouterr().err == ""
