"""The one "stands on" rule (`probes.evidence.stands_on`) that apply, rollback, pip's retirement
and preflight share: verdicts written by hand, in the shape `ProbeResult.record()` keeps."""

from __future__ import annotations

from pathlib import Path

from sm120patch.probes.evidence import stands_on

FI = "/site/flashinfer"


def verdict(files: dict[str, str], location: str | None = FI) -> dict[str, object]:
    return {"result": "pass", "evidence": {"files": files, "flashinfer": {"location": location, "version": "0.6.3"}}}


def test_a_proof_stands_on_a_recipe_whose_files_it_read() -> None:
    proof = [verdict({"jit/other.py": "a"}), verdict({"jit/comm.py": "b"})]
    assert stands_on(proof, {"jit/comm.py"})
    assert stands_on(proof, {"jit/comm.py"}, FI)
    assert stands_on(proof, {"jit/comm.py"}, Path(FI + "/"))  # the same folder, spelled as a Path
    assert not stands_on(proof, {"csrc/nothing_read.cu"})


def test_in_another_flashinfer_or_without_one_it_does_not() -> None:
    proof = [verdict({"jit/comm.py": "b"})]
    assert not stands_on(proof, {"jit/comm.py"}, "/elsewhere/flashinfer")
    assert not stands_on([verdict({"jit/comm.py": "b"}, location=None)], {"jit/comm.py"}, FI)
    assert not stands_on([{"result": "pass"}], {"jit/comm.py"})  # a verdict with no evidence
    assert not stands_on([], {"jit/comm.py"})
