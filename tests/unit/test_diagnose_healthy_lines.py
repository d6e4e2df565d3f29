"""Healthy lines stay healthy (issue 32 item 4): a fallback the program chose, a signal handler it installed and
one-letter level tags read as levels ("(I) ..." is info whatever its words; "<E> ..." is logged at error level),
on hand-written lines; and tools/triage_score.py says which sm120patch it scored."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import sm120patch
from sm120patch.triage.diagnose import diagnose
from tests.unit.triage_lines import assert_prefilter_keeps, fatal_findings
from tools.triage_score import imported_from

HEALTHY = [
    "This GPU does not support FP8, using bf16 instead",
    "[2026-01-02 10:00:00 TP0] This GPU does not support FP8, using bf16 instead",
    "SIGILL handler installed",
    "[2026-01-02 10:00:00] SIGILL handler installed",
    "SIGSEGV, SIGBUS handlers installed",
    "Installed signal handler for SIGABRT",
    "(I) error handler registered",
    "<I> 0 errors in 12 files",
    "(W) kernel failed to autotune, falling back to the default config",
    "<W> NCCL init failed on the first try, retrying",
    "(D) Fatal: checking whether the cache is stale",
]


@pytest.mark.parametrize("line", HEALTHY)
def test_a_healthy_line_is_no_failure(line: str) -> None:
    log = f"Loading model\n{line}\nThe server is fired up and ready to roll!\n"
    d = diagnose(log.splitlines(True), [], None).to_dict()
    assert d["exit_code"] == 0 and d["findings"] == [] and d["unnamed_errors"] == [], d
    assert_prefilter_keeps(log)


@pytest.mark.parametrize("line", HEALTHY)
def test_a_healthy_line_is_not_the_answer_to_a_crash(line: str) -> None:
    log = f"{line}\nRuntimeError: CUDA error: an illegal memory access was encountered\n"
    d = diagnose(log.splitlines(True), [], None).to_dict()
    shown = [f["line"] for f in d["findings"]] + [e["line"] for e in d["unnamed_errors"]]
    assert shown and all(line.strip() not in s for s in shown), d


@pytest.mark.parametrize(
    "line",
    [
        "<E> something broke",
        "(E) something broke",
        "(F) Check failed: status == OK",
        "Fatal: received SIGILL",
        "*** SIGSEGV received at time=1767000000 on cpu 3 ***",
        "./run.sh: line 3: 1234 Illegal instruction (core dumped) ./server",
    ],
)
def test_error_tags_and_received_signals_still_fail(line: str) -> None:
    assert fatal_findings(f"Loading model\n{line}\n")
    assert_prefilter_keeps(f"Loading model\n{line}\n")


def test_triage_score_says_which_sm120patch_it_scored() -> None:
    where = Path(sm120patch.__file__).resolve().parent
    said = imported_from()
    assert str(where) in said
    git = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if git.returncode == 0:
        assert f"git {git.stdout.strip()}" in said
    else:
        assert "not a git checkout" in said or "git not available" in said
