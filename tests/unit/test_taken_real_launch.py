"""The taken line read back from a real SGLang launch on a real GPU (tests/data/real-launch/README.md).

The oracle is the record of what SGLang 0.5.17's `launch_server` printed on an H200, not our own
fixtures: the line sits inside SGLang's log prefix and again bare on stderr, and the reader counts it
once; the DSA recipe as it is now is silent on an SM90 GPU, the one before 0a0b6b4 was not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sm120patch.taken_line import taken_in_text, taken_positions

DATA = Path(__file__).resolve().parents[1] / "data" / "real-launch"
DSA = "sglang-dsa-sparse-mla-sm120"


def _log(which: str, kv: str) -> str:
    return (DATA / f"sglang-0.5.17-h200-{which}-recipe-kv-{kv}.log").read_text(encoding="utf-8")


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_the_old_dsa_anchor_logged_taken_on_an_h200_twice_and_is_read_once(kv: str) -> None:
    text = _log("old", kv)
    assert "NVIDIA H200, 9.0" in (DATA / "gpu.txt").read_text()
    lines = text.splitlines()
    assert [rid for _, rid in taken_positions(lines)] == [DSA, DSA]  # SGLang's handler, then stderr
    assert any(line.startswith("[2026-12-03 ") and line.endswith(f"sm120patch: {DSA} taken") for line in lines)
    assert taken_in_text(text) == [DSA]


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_the_dsa_recipe_now_is_silent_on_an_h200(kv: str) -> None:
    text = _log("new", kv)
    assert "for DeepSeek with DSA" in text  # SGLang reached its DSA handling in this launch
    assert taken_in_text(text) == []


def test_diagnose_ties_the_real_crash_to_no_recipe_with_the_new_anchor(capsys: pytest.CaptureFixture[str]) -> None:
    from sm120patch.cli import main

    for which, want in (("old", [DSA]), ("new", [])):
        with pytest.raises(SystemExit):
            main(["diagnose", str(DATA / f"sglang-0.5.17-h200-{which}-recipe-kv-auto.log"), "--json"])
        data = json.loads(capsys.readouterr().out)
        assert data["taken_before_crash"] == want, which
