"""apply + probes on real releases: the seed's crash cannot happen through this tool.

SGLang 0.5.9 against FlashInfer 0.6.1 (trtllm_comm builds for majors [9, 10] only): the
allreduce-fusion recipe is probed first and never written (`blocked`), while the autotune
and MoE-backend recipes are written. Against 0.6.17 ([9, 10, 12]) all of them stay, until
the FlashInfer under the tree is swapped for 0.6.16: then plan, status and preflight say
`stale` (exit 1, with the rollback command) and apply takes the recipe back itself.
"""

from __future__ import annotations

import hashlib
import json
import os
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


def test_old_flashinfer_blocks_allreduce_before_a_byte_is_written(tmp_path: Path) -> None:
    tree = fetch_or_skip("sglang", "0.5.9", tmp_path / "site")
    communicator = tree / "sglang/srt/layers/communicator.py"
    before = (_digest(communicator), communicator.stat().st_ino)
    fi = unpacked("flashinfer-python", "0.6.1")
    r = _run("apply", str(tree), "--arch", "sm_120", "--flashinfer", str(fi), "--json")
    assert r.returncode == 1, r.stderr  # a recipe was blocked
    out = json.loads(r.stdout)
    status = {x["id"]: x for x in out["recipes"]}
    assert status[AR]["status"] == "blocked"
    assert "static rung" in status[AR]["reason"] and "[9, 10]" in status[AR]["reason"]
    assert [(v["result"], v["rung"], v["asked"]) for v in status[AR]["probe"]] == [("fail", "static", "spec")]
    assert status["sglang-autotune-flashinfer-cutlass"]["status"] == "applied"
    assert status["sglang-moe-backend-sm120"]["status"] == "applied"
    # never written, not even replaced by an identical copy (the test tree is hard-linked to the cache)
    assert (_digest(communicator), communicator.stat().st_ino) == before

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
    assert set(status.values()) == {"blocked"}
    assert {p: _digest(p) for p in tree.rglob("*.py") if p != gpt} == before


def _install_flashinfer(site: Path, version: str) -> None:
    """FlashInfer `version` as the tree's sibling in site-packages (what `pip install` would leave)."""
    import shutil

    dest = site / "flashinfer"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(unpacked("flashinfer-python", version) / "flashinfer", dest, copy_function=os.link)


def test_flashinfer_swapped_under_an_applied_tree_is_stale_and_apply_takes_it_back(tmp_path: Path) -> None:
    site = fetch_or_skip("sglang", "0.5.9", tmp_path / "site")
    communicator = site / "sglang/srt/layers/communicator.py"
    pristine = _digest(communicator)
    _install_flashinfer(site, "0.6.17")
    r = _run("apply", str(site), "--arch", "sm_120", "--probe", "static", "--json")
    assert r.returncode == 0, r.stderr
    assert {x["id"]: x["status"] for x in json.loads(r.stdout)["recipes"]}[AR] == "applied"
    st = _run("status", str(site), "--json")
    assert st.returncode == 0, st.stdout
    row = {a["id"]: a for a in json.loads(st.stdout)["targets"][0]["applied"]}[AR]
    assert row["recheck"]["holds"] and "unchanged" in row["recheck"]["reason"]
    assert row["proof"]["rung"] == "static"

    _install_flashinfer(site, "0.6.16")  # a `pip install` re-pinned FlashInfer under the patched tree
    hint = f"sm120patch rollback {site} --recipe {AR}"
    st = _run("status", str(site), "--json")
    assert st.returncode == 1
    out = json.loads(st.stdout)["targets"][0]
    assert out["stale"] == [AR]
    row = {a["id"]: a for a in out["applied"]}[AR]
    assert row["rollback"] == hint and "0.6.17 -> 0.6.16" in row["recheck"]["reason"]
    assert "[9, 10]" in row["recheck"]["reason"]
    r = _run("plan", str(site), "--package", "sglang", "--arch", "sm_120", "--json")
    assert r.returncode == 1
    ar = {x["id"]: x for x in json.loads(r.stdout)["recipes"]}[AR]
    assert ar["status"] == "stale" and hint in ar["reason"]
    # the pair (this site-packages holds both): the backport would heal it, and plan judges the
    # applied recipe on FlashInfer as the change leaves it, as apply does: it holds there
    r = _run("plan", str(site), "--arch", "sm_120", "--json")
    rows = {x["id"]: x for x in json.loads(r.stdout)["recipes"]}
    assert r.returncode == 0 and rows["flashinfer-trtllm-comm-sm120"]["status"] == "applicable"
    assert rows[AR]["status"] == "applied" and "0.6.17 -> 0.6.16" in rows[AR]["reason"]
    assert "probed again" in rows[AR]["reason"]
    args = ["--package", "sglang", "--arch", "sm_120", "--no-torch", "--probe", "static", "--json"]
    r = _run("preflight", str(site), *args)
    assert r.returncode == 1
    assert {x["id"]: x["status"] for x in json.loads(r.stdout)["recipes"]}[AR] == "stale"
    assert _digest(communicator) != pristine  # nothing above wrote

    r = _run("apply", str(site), "--package", "sglang", "--arch", "sm_120", "--probe", "static", "--json")
    assert r.returncode == 1
    ar = {x["id"]: x for x in json.loads(r.stdout)["recipes"]}[AR]
    assert ar["status"] == "reverted" and "0.6.17 -> 0.6.16" in ar["reason"]
    assert _digest(communicator) == pristine
    st = json.loads(_run("status", str(site), "--json").stdout)["targets"][0]
    assert AR not in [a["id"] for a in st["applied"]] and st["stale"] == []


def test_guard_takes_a_stale_recipe_back_before_the_server_starts(tmp_path: Path) -> None:
    site = fetch_or_skip("sglang", "0.5.9", tmp_path / "site")
    communicator = site / "sglang/srt/layers/communicator.py"
    pristine = _digest(communicator)
    _install_flashinfer(site, "0.6.17")
    assert _run("apply", str(site), "--arch", "sm_120", "--probe", "static").returncode == 0
    _install_flashinfer(site, "0.6.16")
    server = tmp_path / "server.py"
    server.write_text(
        "import pathlib, sys\n"
        f"text = pathlib.Path({str(communicator)!r}).read_text()\n"
        "print('gate open' if '_is_sm120_supported' in text else 'gate shut')\n"
        "print('The server is fired up and ready to roll!')\n"
    )
    r = _run("guard", "--target", str(site), "--", sys.executable, str(server))
    assert r.returncode == 0, r.stderr
    assert f"stale before start: {AR}" in r.stderr and f"rolled back {AR}" in r.stderr
    assert "gate shut" in r.stdout  # the server never saw the gate open
    assert _digest(communicator) == pristine
