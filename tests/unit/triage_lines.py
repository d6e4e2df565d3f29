"""Shared by the triage family tests (tests/unit/test_triage_*_families.py): diagnose a hand-written log with the
catalogue off, so that only the structural rules can answer, and check that the prefilter drops no line a rule
reads."""

from __future__ import annotations

from sm120patch.triage.diagnose import diagnose


def fatal_findings(log: str) -> list[dict]:
    """The fatal findings for LOG with no signature catalogue; the log must be answered as a failure (exit 1)."""
    d = diagnose(log.splitlines(keepends=True), [], None, signatures=[]).to_dict()
    assert d["exit_code"] == 1, f"not answered as a failure: {log!r} -> {d}"
    return [f for f in d["findings"] if f["fatal"]]


def assert_prefilter_keeps(log: str, cls: str | None = None) -> None:
    """The prefilter only skips lines no rule reads. The oracle is written by hand, not the prefilter off:
    with it on, the structural rules still give the class written beside the log (`cls`, where the family
    names one); the whole answer is also the same with it off. (A cited line need not pass the prefilter:
    the end-of-log rules read the tail whatever it passed.)"""
    lines = log.splitlines(True)
    on = diagnose(lines, [], None, signatures=[]).to_dict()
    if cls is not None:
        assert cls in {f["class"] for f in on["findings"] if f["fatal"]}, (log, on["findings"])
    assert diagnose(lines, [], None).to_dict() == diagnose(lines, [], None, prefilter=False).to_dict()
