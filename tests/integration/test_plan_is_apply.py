"""`apply` carries out exactly what `plan` printed for the same inputs (issue 33's reconciler).

On every SGLang release in the matrix, with the FlashInfer it pins as the second tree (the pair
layout, where the FlashInfer backport is written first and the SGLang proofs stand on it): the
action list `plan --json` printed equals the list `apply --json` reports it carried out, and the
bytes apply left are the release's bytes with plan's diffs applied by `git apply` (git, not
sm120patch, is the oracle for the bytes; `tools.releases.differences` against the release's own
unpacked wheel for the files nothing should touch). A second plan then has nothing to do, and a
second apply does nothing. The release trees are hard-linked copies of the shared cache's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import fetch_or_skip
from tools.releases import FLASHINFER_PINS, SGLANG_RELEASES, differences, pristine

pytestmark = pytest.mark.releases

CLI = [sys.executable, "-m", "sm120patch"]
COMMON = ["--arch", "sm_120", "--probe", "static", "--json"]


def sm(*args: object) -> dict:
    r = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=900)
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)


def _expected_bytes(package: str, version: str, tree: Path, diffs: list[str], scratch: Path) -> dict[str, bytes]:
    """The files plan's diffs change, as `git apply` leaves them on a real copy of the release."""
    if not "".join(diffs):
        return {}
    src = pristine(package, version)
    scratch.mkdir(parents=True)
    shutil.copytree(src, scratch, dirs_exist_ok=True)  # a real copy: git apply must not write through links
    patch = scratch / "plan.diff"
    patch.write_text("".join(diffs))
    subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch)], cwd=scratch, check=True, capture_output=True)
    return {rel: (scratch / rel).read_bytes() for rel in differences(package, version, scratch) if rel != "plan.diff"}


@pytest.mark.parametrize("version", SGLANG_RELEASES)
def test_apply_carries_out_exactly_the_actions_plan_printed(tmp_path: Path, version: str) -> None:
    fi = FLASHINFER_PINS[version]
    sg = fetch_or_skip("sglang", version, tmp_path / "sglang")
    fit = fetch_or_skip("flashinfer", fi, tmp_path / "flashinfer")
    planned = sm("plan", sg, fit, *COMMON)
    actions = planned["actions"]
    writes = {a["recipe"] for a in actions if a["kind"] == "write"}
    assert writes, f"nothing to write on SGLang {version} + FlashInfer {fi}: the comparison would be empty"
    assert {a["kind"] for a in actions} <= {"write", "record-proof"}  # fresh trees: nothing to take back

    done = sm("apply", sg, fit, *COMMON)
    assert done["actions"] == actions

    for package, version_, tree in (("sglang", version, sg), ("flashinfer", fi, fit)):
        mine = [r for r in planned["recipes"] if r["package"] == package and r["id"] in writes]
        want = _expected_bytes(package, version_, tree, [r["diff"] for r in mine], tmp_path / f"expect-{package}")
        assert sorted(want) == differences(package, version_, tree)  # no file beyond plan's diffs changed
        for rel, data in want.items():
            assert (tree / rel).read_bytes() == data, rel
        files = sorted({f for a in actions if a["kind"] == "write" and a["package"] == package for f in a["files"]})
        assert files == sorted(want), package  # each write action names exactly the files its diff changes

    assert sm("plan", sg, fit, *COMMON)["actions"] == []
    assert sm("apply", sg, fit, *COMMON)["actions"] == []


def _reinstall(package: str, version: str, tree: Path) -> list[str]:
    """What `pip install --force-reinstall` does to a patched tree: the release's own bytes back."""
    src = pristine(package, version)
    changed = differences(package, version, tree)
    for rel in changed:
        (tree / rel).unlink()
        shutil.copyfile(src / rel, tree / rel)
    return changed


@pytest.mark.parametrize(("version", "fi"), [("0.5.9", "0.6.3"), ("0.5.17", "0.6.15.post1")])
def test_after_pip_put_flashinfer_back_apply_does_what_plan_said(tmp_path: Path, version: str, fi: str) -> None:
    """The take-backs too: pip reinstalled the FlashInfer the allreduce gate stands on, so plan says
    the entry is retired, the SGLang recipe standing on it rolled back, and both written again;
    apply then reports exactly that list and leaves both trees as the first apply did."""
    sg = fetch_or_skip("sglang", version, tmp_path / "sglang")
    fit = fetch_or_skip("flashinfer", fi, tmp_path / "flashinfer")
    sm("apply", sg, fit, *COMMON)
    first = {rel: (sg / rel).read_bytes() for rel in differences("sglang", version, sg)}
    assert _reinstall("flashinfer", fi, fit), "the backport wrote nothing to take back"
    actions = sm("plan", sg, fit, *COMMON)["actions"]
    kinds = [(a["kind"], a["package"]) for a in actions]
    assert kinds[:2] == [("retire", "flashinfer"), ("rollback-dependent", "sglang")], kinds
    assert ("write", "flashinfer") in kinds and ("write", "sglang") in kinds, kinds
    done = sm("apply", sg, fit, *COMMON)
    assert done["actions"] == actions
    assert {rel: (sg / rel).read_bytes() for rel in differences("sglang", version, sg)} == first
