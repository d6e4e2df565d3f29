"""Two runs on one tree at once never interleave: the second waits (--wait) or refuses with exit 2,
and afterwards the tree is wholly patched or wholly original, with a valid journal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sm120patch.engine.journal import DIRNAME
from tests.conftest import fetch_or_skip, pristine_or_skip
from tests.reliability.conftest import APPLY, Baseline, cli, count, kill_group

pytestmark = pytest.mark.releases
VERSION = "0.5.9"


@pytest.fixture(scope="module")
def baseline() -> Baseline:
    return Baseline(pristine_or_skip("sglang", VERSION))


@pytest.fixture(scope="module")
def ids(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """What one run alone applies to this release (the catalogue grows)."""
    tree = fetch_or_skip("sglang", VERSION, tmp_path_factory.mktemp("ids") / "tree")
    r = cli("plan", str(tree), "--arch", "sm_120", "--probe", "none", "--json")
    assert r.returncode in (0, 1), r.stderr
    found = {p["id"] for p in json.loads(r.stdout)["recipes"] if p["status"] == "applicable"}
    assert found
    return found


def _start(*args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM120PATCH_FAULT")}
    return subprocess.Popen(
        [sys.executable, "-m", "sm120patch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )


def _both(a: list[str], b: list[str]) -> list[tuple[int, str]]:
    procs = [_start(*a), _start(*b)]
    out = []
    try:
        for p in procs:
            _, err = p.communicate(timeout=180)
            out.append((p.returncode, err))
    finally:
        for p in procs:
            kill_group(p)
    for _, err in out:
        assert "Traceback" not in err, err
    count("concurrent_runs", 2)
    return out


def _applied(tree: Path) -> set[str]:
    r = cli("status", str(tree), "--json")
    assert r.returncode in (0, 1), r.stderr
    (t,) = json.loads(r.stdout)["targets"]
    assert t["interrupted"] == [] and all(f["state"] == "as-applied" for f in t["files"])
    return {a["id"] for a in t["applied"]}


def _rolled_back_clean(tree: Path, baseline: Baseline) -> None:
    r = cli("rollback", str(tree))
    assert r.returncode == 0, r.stderr
    assert baseline.diff(tree) == []


def test_an_apply_while_another_is_writing_refuses(tmp_path: Path, baseline: Baseline, ids: set[str]) -> None:
    """The refusal itself, made certain: the first apply is stopped (SIGSTOP) at its first write
    step, under the lock; a second apply without --wait must refuse (exit 2, naming --wait) and
    write nothing; the first, continued, finishes the job."""
    for attempt in range(3):
        tree = fetch_or_skip("sglang", VERSION, tmp_path / f"tree-{attempt}")
        trace = tmp_path / f"trace-{attempt}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SM120PATCH_FAULT")}
        first = subprocess.Popen(
            [sys.executable, "-m", "sm120patch", "apply", str(tree), *APPLY],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "SM120PATCH_FAULT_TRACE": str(trace)},
            start_new_session=True,
        )
        try:
            while first.poll() is None and not (trace.exists() and trace.read_text()):
                time.sleep(0.005)
            os.kill(first.pid, signal.SIGSTOP)
            if first.poll() is not None:  # it finished before it could be stopped: try a fresh tree
                continue
            stopped_at = trace.read_text()
            r = cli("apply", str(tree), *APPLY)
            os.kill(first.pid, signal.SIGCONT)
            _, err = first.communicate(timeout=180)
        finally:
            kill_group(first)
        count("concurrent_runs", 2)
        assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
        assert r.stderr.startswith("sm120patch: error: ") and "another sm120patch run" in r.stderr, r.stderr
        assert "--wait" in r.stderr and "Traceback" not in r.stderr
        assert first.returncode == 0, err
        assert stopped_at and _applied(tree) == ids
        _rolled_back_clean(tree, baseline)
        return
    pytest.fail("the first apply finished three times before it could be stopped at its first write step")


@pytest.mark.parametrize("round_", range(2))
def test_two_applies_at_once_never_both_fail_and_end_whole(
    round_: int, tmp_path: Path, baseline: Baseline, ids: set[str]
) -> None:
    """Started together, without --wait: whichever order they take, at most one refuses (exit 2,
    naming --wait), and the tree ends wholly patched with a valid journal."""
    tree = fetch_or_skip("sglang", VERSION, tmp_path / "tree")
    (ra, ea), (rb, eb) = _both(["apply", str(tree), *APPLY], ["apply", str(tree), *APPLY])
    codes = sorted([ra, rb])
    assert codes in ([0, 0], [0, 2]), (ra, ea, rb, eb)
    if codes == [0, 2]:
        err = ea if ra == 2 else eb
        assert err.startswith("sm120patch: error: ") and "another sm120patch run" in err and "--wait" in err
    assert _applied(tree) == ids
    _rolled_back_clean(tree, baseline)


@pytest.mark.parametrize("round_", range(2))
def test_two_applies_with_wait_both_succeed_and_the_journal_survives(
    round_: int, tmp_path: Path, baseline: Baseline, ids: set[str]
) -> None:
    """The second run read the journal before it got the lock; it must not act on that stale copy
    (it used to find nothing applied, then delete the first run's journal: originals lost)."""
    tree = fetch_or_skip("sglang", VERSION, tmp_path / "tree")
    (ra, ea), (rb, eb) = _both(
        ["apply", str(tree), *APPLY, "--wait", "120"], ["apply", str(tree), *APPLY, "--wait", "120"]
    )
    assert (ra, rb) == (0, 0), (ea, eb)
    assert (tree / DIRNAME / "journal.json").is_file()
    assert _applied(tree) == ids
    _rolled_back_clean(tree, baseline)


def test_apply_and_rollback_at_once_end_whole(tmp_path: Path, baseline: Baseline, ids: set[str]) -> None:
    tree = fetch_or_skip("sglang", VERSION, tmp_path / "tree")
    assert cli("apply", str(tree), *APPLY).returncode == 0
    patched = {rel: v for rel, v in _fingerprint_changed(tree, baseline).items()}
    (ra, ea), (rb, eb) = _both(["rollback", str(tree), "--wait", "120"], ["apply", str(tree), *APPLY, "--wait", "120"])
    assert (ra, rb) == (0, 0), (ea, eb)
    state = baseline.diff(tree, skip_journal=True)
    if state:  # apply ran last: wholly patched
        assert baseline.diff(tree, patched, skip_journal=True) == []
        assert _applied(tree) == ids
    _rolled_back_clean(tree, baseline)


def _fingerprint_changed(tree: Path, baseline: Baseline) -> dict[str, tuple[str, int]]:
    import hashlib

    files = json.loads((tree / DIRNAME / "journal.json").read_text())["files"]
    return {
        rel: (hashlib.sha256((tree / rel).read_bytes()).hexdigest(), (tree / rel).stat().st_mode & 0o7777)
        for rel in files
    }
