"""apply + probes on real releases: the seed's crash cannot happen through this tool.

SGLang 0.5.9 against FlashInfer 0.6.1 (trtllm_comm builds for majors [9, 10] only): the
allreduce-fusion recipe is written, probed, and reverted from the journal, while the
autotune and MoE-backend recipes stay. Against 0.6.17 ([9, 10, 12]) all three stay.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import fetch_or_skip
from tests.integration.fi_releases import unpacked

pytestmark = pytest.mark.releases

CLI = [sys.executable, "-m", "sm120patch"]
AR = "sglang-allreduce-fusion-sm120"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_old_flashinfer_reverts_allreduce_keeps_autotune(tmp_path: Path) -> None:
    tree = fetch_or_skip("sglang", "0.5.9", tmp_path / "site")
    communicator = tree / "sglang/srt/layers/communicator.py"
    before = _digest(communicator)
    fi = unpacked("flashinfer-python", "0.6.1")
    r = _run("apply", str(tree), "--arch", "sm_120", "--flashinfer", str(fi), "--json")
    assert r.returncode == 1, r.stderr  # a recipe was reverted
    out = json.loads(r.stdout)
    status = {x["id"]: x for x in out["recipes"]}
    assert status[AR]["status"] == "reverted"
    assert "static rung" in status[AR]["reason"] and "[9, 10]" in status[AR]["reason"]
    assert [v["result"] for v in status[AR]["probe"]] == ["fail"]
    assert status["sglang-autotune-flashinfer-cutlass"]["status"] == "applied"
    assert status["sglang-moe-backend-sm120"]["status"] == "applied"
    assert _digest(communicator) == before  # the gate is shut again, byte for byte

    st = json.loads(_run("status", str(tree), "--json").stdout)["targets"][0]
    assert sorted(a["id"] for a in st["applied"]) == [
        "sglang-autotune-flashinfer-cutlass",
        "sglang-gptoss-mxfp4-sm120",
        "sglang-moe-backend-sm120",
    ]

    # plan with the same FlashInfer says `blocked` up front
    r = _run("plan", str(tree), "--arch", "sm_120", "--flashinfer", str(fi), "--json")
    assert {x["id"]: x["status"] for x in json.loads(r.stdout)["recipes"]}[AR] == "blocked"


def test_new_flashinfer_keeps_all_three(tmp_path: Path) -> None:
    tree = fetch_or_skip("sglang", "0.5.9", tmp_path / "site")
    fi = unpacked("flashinfer-python", "0.6.17")
    r = _run("apply", str(tree), "--arch", "sm_120", "--flashinfer", str(fi), "--json")
    assert r.returncode == 0, r.stderr
    # (recipes for gates 0.5.9 does not have are not-applicable)
    assert {x["status"] for x in json.loads(r.stdout)["recipes"]} - {"not-applicable"} == {"applied"}
    assert "_is_sm120_supported" in (tree / "sglang/srt/layers/communicator.py").read_text()


def test_mixed_gpus_must_all_pass(tmp_path: Path) -> None:
    """sm_90 + sm_120 in one box: the recipes are for SM12x only, so none applies to the mix."""
    tree = fetch_or_skip("sglang", "0.5.9", tmp_path / "site")
    fi = unpacked("flashinfer-python", "0.6.17")
    r = _run("plan", str(tree), "--arch", "sm_90", "--arch", "sm_120", "--flashinfer", str(fi), "--json")
    assert r.returncode == 0
    recipes = json.loads(r.stdout)["recipes"]
    assert all(x["status"] == "not-applicable" and "sm_90" in x["reason"] for x in recipes)


def test_no_flashinfer_found_keeps_gates_shut(tmp_path: Path) -> None:
    """No FlashInfer to probe is not a pass: every recipe that needs kernels is reverted; the
    GPT-OSS recipe, which only routes SM12x away from SM100-only kernels, needs none and stays."""
    tree = fetch_or_skip("sglang", "0.5.9", tmp_path / "site")
    gpt = tree / "sglang/srt/server_args.py"
    before = {p: _digest(p) for p in tree.rglob("*.py") if p != gpt}
    empty = tmp_path / "nothing"
    empty.mkdir()
    r = subprocess.run(
        [*CLI, "apply", str(tree), "--arch", "sm_120", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(empty)},
        cwd=empty,
    )
    # this interpreter has no flashinfer installed: what needs kernels is reverted
    assert r.returncode == 1, r.stderr
    status = {x["id"]: x["status"] for x in json.loads(r.stdout)["recipes"] if x["status"] != "not-applicable"}
    assert status.pop("sglang-gptoss-mxfp4-sm120") == "applied"
    assert set(status.values()) == {"reverted"}
    assert {p: _digest(p) for p in tree.rglob("*.py") if p != gpt} == before
