"""An SGLang release and the FlashInfer it pins, patched as a pair (issue 11's headline).

SGLang 0.5.9 pins FlashInfer 0.6.3 and 0.5.17 pins 0.6.15.post1; neither FlashInfer builds
trtllm_comm for SM12x, so on its own the allreduce-fusion recipe is `blocked`. With the
FlashInfer backport in the same run it is applied, proven on the patched FlashInfer; rolling
the FlashInfer tree back takes it back first; both trees end byte-identical to the releases.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import fetch_or_skip
from tools.releases import differences

pytestmark = pytest.mark.releases

CLI = [sys.executable, "-m", "sm120patch"]
AR, FIX = "sglang-allreduce-fusion-sm120", "flashinfer-trtllm-comm-sm120"


def sm(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize(("sglang", "fi"), [("0.5.9", "0.6.3"), ("0.5.17", "0.6.15.post1")])
def test_the_backport_opens_the_allreduce_gate_on_the_pinned_flashinfer(tmp_path: Path, sglang: str, fi: str) -> None:
    sg = fetch_or_skip("sglang", sglang, tmp_path / "sglang", layout="git")
    fit = fetch_or_skip("flashinfer", fi, tmp_path / "flashinfer")
    common = ["--arch", "sm_120", "--probe", "static", "--json"]
    alone = {x["id"]: x for x in json.loads(sm("plan", sg, "--flashinfer", fit, *common).stdout)["recipes"]}
    assert alone[AR]["status"] == "blocked" and "[9, 10]" in alone[AR]["reason"]

    r = sm("apply", sg, fit, *common)
    out = {x["id"]: x for x in json.loads(r.stdout)["recipes"]}
    assert out[FIX]["status"] == "applied" and out[AR]["status"] == "applied", (out[FIX]["reason"], out[AR]["reason"])
    (v,) = out[AR]["probe"]
    assert "[9, 10, 12]" in v["reason"] and "5 source check(s) hold" in v["reason"]
    assert "supported_major_versions=[9, 10, 12]" in (fit / "flashinfer/jit/comm.py").read_text()
    st = sm("status", sg, fit, "--json")
    assert st.returncode == 0, st.stdout

    r = sm("rollback", fit, "--json")
    assert r.returncode == 0, r.stderr
    said = json.loads(r.stdout)["targets"]
    assert said[0]["rolled_back"] == [AR] and "FlashInfer recipes" in said[0]["because"]
    assert said[1]["rolled_back"] == [FIX]
    assert differences("flashinfer", fi, fit) == []
    assert sm("rollback", sg).returncode == 0
    git = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=sg, capture_output=True, text=True)
    assert git.stdout == ""
