"""plan / apply / rollback / status on small fake SGLang trees, and the journal underneath them.

Every rollback is checked byte for byte against a snapshot of the tree taken before apply.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sm120patch.arch import parse_arch
from sm120patch.catalogue.recipes import load_recipes
from sm120patch.engine import journal
from sm120patch.engine import tree as engine
from sm120patch.engine.journal import DIRNAME, Journal, atomic_write, sha256, state_dir_for
from sm120patch.errors import JournalError, UserError
from sm120patch.planning.diffs import NO_EOL, unified
from sm120patch.planning.plan import APPLICABLE, APPLIED, BLOCKED, NOT_APPLICABLE, SATISFIED, plan
from sm120patch.planning.targets import Target, discover
from sm120patch.probes.recipe_probe import ProbeResult
from tests.unit.sglang_fakes import (
    ALL_IDS,
    ALLREDUCE,
    AUTOTUNE,
    COMMUNICATOR_REL,
    GIT_ENV,
    MODEL_RUNNER_REL,
    MOE,
    SERVER_ARGS_REL,
    git,
    make_clone,
    make_sglang,
    snapshot,
)

ARCH = parse_arch("sm_120")
RECIPES = [r for r in load_recipes() if r.id in ALL_IDS]  # the recipes the fake tree is shaped for


@pytest.fixture(autouse=True)
def _git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in GIT_ENV.items():
        monkeypatch.setenv(k, v)


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site-packages"
    make_sglang(root)
    return root


def target_at(path: Path) -> Target:
    (t,) = discover(path)
    return t


def statuses(plans: list) -> dict[str, str]:
    return {p.recipe.id: p.status for p in plans}


def one_line(e: pytest.ExceptionInfo[BaseException]) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


# --- plan -----------------------------------------------------------------------------------------------


def test_plan_statuses_on_a_fresh_tree_write_nothing(site: Path) -> None:
    before = snapshot(site)
    plans = engine.make_plan(target_at(site), RECIPES, ARCH)
    assert statuses(plans) == dict.fromkeys(ALL_IDS, APPLICABLE)
    by_id = {p.recipe.id: p for p in plans}
    assert by_id[ALLREDUCE].files == [COMMUNICATOR_REL, SERVER_ARGS_REL]
    assert by_id[AUTOTUNE].files == [MODEL_RUNNER_REL]
    assert by_id[MOE].files == [SERVER_ARGS_REL]
    # recipes compose: the second recipe on server_args.py starts from the first one's output
    assert by_id[MOE].changes[SERVER_ARGS_REL][0] == by_id[ALLREDUCE].changes[SERVER_ARGS_REL][1]
    for p in plans:
        for rel, (_, after) in p.changes.items():
            compile(after, rel, "exec")
    assert snapshot(site) == before and not (site / DIRNAME).exists()


def test_plan_not_applicable_for_other_arch_and_old_version(tmp_path: Path) -> None:
    make_sglang(tmp_path / "old", version="0.5.4")
    make_sglang(tmp_path / "new")
    for p in plan(target_at(tmp_path / "old"), RECIPES, ARCH):
        assert p.status == NOT_APPLICABLE and "0.5.4 is outside >=0.5.5" in p.reason
    for p in plan(target_at(tmp_path / "new"), RECIPES, parse_arch("sm_90")):
        assert p.status == NOT_APPLICABLE and "not sm_90" in p.reason


def test_plan_satisfied_after_upstream_opened_the_gates(site: Path) -> None:
    t = target_at(site)
    for p in plan(t, RECIPES, ARCH):  # write what the plan computes: upstream "already did it"
        for rel, (_, after) in p.changes.items():
            (t.root / rel).write_bytes(after)
    plans = plan(t, RECIPES, ARCH)
    assert statuses(plans) == dict.fromkeys(ALL_IDS, SATISFIED)
    assert all(p.changes == {} and p.diff() == "" for p in plans)


def test_plan_not_applicable_when_the_gate_is_gone(site: Path) -> None:
    (site / SERVER_ARGS_REL).write_text("class ServerArgs:\n    pass\n")
    plans = {p.recipe.id: p for p in plan(target_at(site), RECIPES, ARCH)}
    assert plans[MOE].status == NOT_APPLICABLE and "_handle_moe_kernel_config()" in plans[MOE].reason
    # the allreduce recipe's server-args edit is optional; its required runtime check is still there
    assert plans[ALLREDUCE].status == APPLICABLE and plans[ALLREDUCE].files == [COMMUNICATOR_REL]


def test_plan_failed_edit_leaves_other_recipes_alone(site: Path) -> None:
    text = (site / SERVER_ARGS_REL).read_text()
    one_liner = text.replace(
        '    def _handle_moe_kernel_config(self):\n        """Choose the MoE runner backend."""\n'
        '        if self.quantization == "fp8" and is_sm100_supported():\n'
        '            self.moe_runner_backend = "flashinfer_trtllm"\n',
        "    def _handle_moe_kernel_config(self): pass\n",
    )
    assert one_liner != text
    (site / SERVER_ARGS_REL).write_text(one_liner)
    plans = {p.recipe.id: p for p in plan(target_at(site), RECIPES, ARCH)}
    assert plans[MOE].status == "failed" and "one-line def" in plans[MOE].reason
    assert plans[ALLREDUCE].status == APPLICABLE and plans[AUTOTUNE].status == APPLICABLE


def test_plan_keeps_a_utf8_bom(site: Path) -> None:
    p = site / COMMUNICATOR_REL
    p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes())
    (allreduce,) = [x for x in plan(target_at(site), RECIPES, ARCH) if x.recipe.id == ALLREDUCE]
    assert allreduce.changes[COMMUNICATOR_REL][1].startswith(b"\xef\xbb\xbf")
    assert "-\ufeff" not in allreduce.diff()


def test_plan_keeps_crlf_line_endings(site: Path) -> None:
    for rel in (COMMUNICATOR_REL, SERVER_ARGS_REL, MODEL_RUNNER_REL):
        p = site / rel
        p.write_bytes(p.read_bytes().replace(b"\n", b"\r\n"))
    plans = plan(target_at(site), RECIPES, ARCH)
    assert statuses(plans) == dict.fromkeys(ALL_IDS, APPLICABLE)
    for x in plans:
        for rel, (_, after) in x.changes.items():
            assert after.count(b"\n") == after.count(b"\r\n"), rel  # no bare LF mixed in
            compile(after, rel, "exec")


# --- apply / rollback ---------------------------------------------------------------------------------------


def test_apply_writes_journals_and_is_idempotent(site: Path) -> None:
    t = target_at(site)
    pristine = snapshot(site)
    planned = {p.recipe.id: p for p in plan(t, RECIPES, ARCH)}
    plans = engine.apply(t, RECIPES, ARCH)
    assert statuses(plans) == dict.fromkeys(ALL_IDS, APPLIED)
    now = snapshot(site)
    changed = {rel for rel in pristine if now[rel] != pristine[rel]}
    assert changed == {COMMUNICATOR_REL, SERVER_ARGS_REL, MODEL_RUNNER_REL}
    assert now[SERVER_ARGS_REL] == planned[MOE].changes[SERVER_ARGS_REL][1]
    data = json.loads((site / DIRNAME / "journal.json").read_text())
    assert [a["id"] for a in data["applied"]] == list(ALL_IDS) and data["pending"] is None
    for rel in changed:
        entry = data["files"][rel]
        assert entry["original"] == sha256(pristine[rel]) and entry["current"] == sha256(now[rel])
        assert (site / DIRNAME / "blobs" / entry["original"]).read_bytes() == pristine[rel]
    # a second apply changes nothing and reports the recipes as applied
    again = engine.apply(t, RECIPES, ARCH)
    assert statuses(again) == dict.fromkeys(ALL_IDS, APPLIED)
    assert snapshot(site) == now


def test_rollback_restores_every_byte_and_removes_the_journal(site: Path) -> None:
    t = target_at(site)
    pristine = snapshot(site)
    engine.apply(t, RECIPES, ARCH)
    result = engine.rollback(t, RECIPES)
    assert result["rolled_back"] == list(ALL_IDS) and result["remaining"] == [] and result["kept_copies"] == []
    assert snapshot(site) == pristine
    assert not (site / DIRNAME).exists()
    assert engine.rollback(t, RECIPES)["rolled_back"] == []  # nothing left: a no-op, not an error


@pytest.mark.parametrize(("drop", "keep"), [(ALLREDUCE, MOE), (MOE, ALLREDUCE)])
def test_per_recipe_rollback_keeps_the_other_recipes_change_in_a_shared_file(site: Path, drop: str, keep: str) -> None:
    t = target_at(site)
    pristine = snapshot(site)
    # what server_args.py looks like with only `keep` applied, planned on the pristine tree
    (expected,) = [p for p in plan(t, [r for r in RECIPES if r.id == keep], ARCH)]
    engine.apply(t, RECIPES, ARCH)
    result = engine.rollback(t, RECIPES, ids=[drop])
    assert result["rolled_back"] == [drop] and set(result["remaining"]) == set(ALL_IDS) - {drop}
    now = snapshot(site)
    assert now[SERVER_ARGS_REL] == expected.changes[SERVER_ARGS_REL][1]
    compile(now[SERVER_ARGS_REL], SERVER_ARGS_REL, "exec")
    if drop == ALLREDUCE:
        assert now[COMMUNICATOR_REL] == pristine[COMMUNICATOR_REL]
        assert b"or is_sm120_supported()" not in now[SERVER_ARGS_REL]
        assert b'self.moe_runner_backend = "flashinfer_cutlass"' in now[SERVER_ARGS_REL]
    assert engine.status(t)["files"]
    assert all(f["state"] == "as-applied" for f in engine.status(t)["files"])
    # then the rest goes, and the tree is pristine again
    engine.rollback(t, RECIPES)
    assert snapshot(site) == pristine and not (site / DIRNAME).exists()


def test_rollback_of_a_recipe_not_applied_is_refused(site: Path) -> None:
    t = target_at(site)
    engine.apply(t, [r for r in RECIPES if r.id == AUTOTUNE], ARCH)
    with pytest.raises(UserError) as ei:
        engine.rollback(t, RECIPES, ids=[MOE])
    assert MOE in one_line(ei) and AUTOTUNE in str(ei.value)


def test_rollback_refuses_a_file_edited_since_apply_and_force_keeps_a_copy(site: Path) -> None:
    t = target_at(site)
    pristine = snapshot(site)
    engine.apply(t, RECIPES, ARCH)
    edited = (site / SERVER_ARGS_REL).read_bytes() + b"# my own edit\n"
    (site / SERVER_ARGS_REL).write_bytes(edited)
    st = engine.status(t)
    states = {f["path"]: f["state"] for f in st["files"]}
    assert states[SERVER_ARGS_REL] == "changed-since-apply" and states[COMMUNICATOR_REL] == "as-applied"
    assert {f["path"]: f["recipes"] for f in st["files"]}[SERVER_ARGS_REL] == [ALLREDUCE, MOE]
    before_refusal = snapshot(site)
    with pytest.raises(UserError) as ei:
        engine.rollback(t, RECIPES)
    assert SERVER_ARGS_REL in one_line(ei) and "--force" in str(ei.value)
    assert snapshot(site) == before_refusal
    result = engine.rollback(t, RECIPES, force=True)
    assert snapshot(site) == pristine
    (copy,) = result["kept_copies"]
    assert Path(copy).read_bytes() == edited
    assert Path(copy).is_relative_to(site / DIRNAME / "saved")
    assert (site / DIRNAME).is_dir()  # the user's copy keeps the folder


def test_crash_mid_apply_leaves_pending_and_rollback_restores(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = target_at(site)
    pristine = snapshot(site)
    real = journal.atomic_write
    written: list[Path] = []

    def crashing(path: Path, data: bytes, mode: int | None = None) -> None:
        if DIRNAME not in path.parts:
            if written:
                raise KeyboardInterrupt("killed")
            written.append(path)
        real(path, data, mode)

    monkeypatch.setattr(journal, "atomic_write", crashing)
    with pytest.raises(KeyboardInterrupt):
        engine.apply(t, RECIPES, ARCH)
    monkeypatch.setattr(journal, "atomic_write", real)
    assert len(written) == 1 and snapshot(site) != pristine  # half written
    data = json.loads((site / DIRNAME / "journal.json").read_text())
    assert data["pending"] and data["applied"] == []
    st = engine.status(t)
    assert st["interrupted"] == sorted([COMMUNICATOR_REL, SERVER_ARGS_REL, MODEL_RUNNER_REL])
    result = engine.rollback(t, RECIPES)
    assert result["recovered"] == [t.rel(written[0])]
    assert snapshot(site) == pristine
    assert not (site / DIRNAME).exists()


def test_apply_after_a_crash_recovers_first(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = target_at(site)
    pristine = snapshot(site)
    real = journal.atomic_write
    calls = {"n": 0}

    def crashing(path: Path, data: bytes, mode: int | None = None) -> None:
        if DIRNAME not in path.parts:
            calls["n"] += 1
            if calls["n"] == 2:
                raise OSError(28, "No space left on device")
        real(path, data, mode)

    monkeypatch.setattr(journal, "atomic_write", crashing)
    with pytest.raises(OSError):
        engine.apply(t, RECIPES, ARCH)
    monkeypatch.setattr(journal, "atomic_write", real)
    plans = engine.apply(t, RECIPES, ARCH)
    assert statuses(plans) == dict.fromkeys(ALL_IDS, APPLIED)
    assert engine.status(t)["interrupted"] == []
    engine.rollback(t, RECIPES)
    assert snapshot(site) == pristine


@pytest.mark.parametrize("content", ["{not json", json.dumps({"schema": 99, "applied": [], "files": {}}), "[]"])
def test_corrupt_journal_is_a_journal_error(site: Path, content: str) -> None:
    t = target_at(site)
    (site / DIRNAME).mkdir()
    (site / DIRNAME / "journal.json").write_text(content)
    for call in (
        lambda: engine.status(t),
        lambda: engine.apply(t, RECIPES, ARCH),
        lambda: engine.rollback(t, RECIPES),
        lambda: engine.make_plan(t, RECIPES, ARCH),
    ):
        with pytest.raises(JournalError) as ei:
            call()
        assert "journal.json" in one_line(ei)


def test_missing_blob_is_a_journal_error(site: Path) -> None:
    t = target_at(site)
    engine.apply(t, RECIPES, ARCH)
    shutil.rmtree(site / DIRNAME / "blobs")
    with pytest.raises(JournalError) as ei:
        engine.rollback(t, RECIPES)
    assert "blob" in one_line(ei)


def test_lock_refuses_a_concurrent_writer_and_wait_waits(site: Path) -> None:
    t = target_at(site)
    pristine = snapshot(site)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with Journal.open(t.root).lock():
            held.set()
            release.wait(10)

    th = threading.Thread(target=hold)
    th.start()
    try:
        assert held.wait(5)
        with pytest.raises(UserError) as ei:
            engine.apply(t, RECIPES, ARCH)
        assert "another sm120patch run" in one_line(ei)
        with pytest.raises(UserError, match="--wait"):  # waits a little, then still refuses
            engine.apply(t, RECIPES, ARCH, wait_s=0.2)
        assert snapshot(site) == pristine
        threading.Timer(0.3, release.set).start()
        plans = engine.apply(t, RECIPES, ARCH, wait_s=10)
        assert statuses(plans) == dict.fromkeys(ALL_IDS, APPLIED)
    finally:
        release.set()
        th.join()


def test_lock_in_another_process(site: Path) -> None:
    t = target_at(site)
    (site / DIRNAME).mkdir()
    code = (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(30)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(site / DIRNAME / "lock")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        with pytest.raises(UserError, match="another sm120patch run"):
            engine.apply(t, RECIPES, ARCH)
    finally:
        proc.kill()
        proc.wait()
    assert statuses(engine.apply(t, RECIPES, ARCH)) == dict.fromkeys(ALL_IDS, APPLIED)


def _probe_failing(*ids: str):  # noqa: ANN202
    """A probe that finds no kernels for the recipes `ids` and proves every other one."""

    def probe(recipe):  # noqa: ANN001, ANN202
        if recipe.id in ids:
            return ProbeResult(False, "no trtllm_comm kernels for sm_120", "static", "static", [{"rung": "static"}])
        return ProbeResult(True, "kernels proven at the static rung", "static", "static", [])

    return probe


def test_probe_failure_blocks_only_that_recipe_and_writes_nothing_of_it(site: Path) -> None:
    t = target_at(site)
    pristine = snapshot(site)
    (moe_only,) = plan(t, [r for r in RECIPES if r.id == MOE], ARCH)
    plans = {p.recipe.id: p for p in engine.apply(t, RECIPES, ARCH, probe=_probe_failing(ALLREDUCE))}
    assert plans[ALLREDUCE].status == BLOCKED and "static" in plans[ALLREDUCE].reason
    assert plans[ALLREDUCE].probe == [{"rung": "static"}]
    assert plans[MOE].status == APPLIED and plans[AUTOTUNE].status == APPLIED
    now = snapshot(site)
    assert now[COMMUNICATOR_REL] == pristine[COMMUNICATOR_REL]
    assert now[SERVER_ARGS_REL] == moe_only.changes[SERVER_ARGS_REL][1]
    assert Journal.open(t.root).applied_ids() == [AUTOTUNE, MOE]


def test_apply_only_one_recipe_sharing_a_file(site: Path) -> None:
    t = target_at(site)
    plans = statuses(engine.apply(t, RECIPES, ARCH, only=[MOE]))
    assert plans[MOE] == APPLIED and plans[ALLREDUCE] == APPLICABLE


def test_commit_after_a_blocked_recipe_matches_the_working_tree(tmp_path: Path) -> None:
    root = make_clone(tmp_path / "sglang")

    plans = statuses(engine.apply(target_at(root), RECIPES, ARCH, probe=_probe_failing(ALLREDUCE), commit=True))
    assert plans[ALLREDUCE] == BLOCKED and plans[MOE] == APPLIED
    head = git(root, "show", f"HEAD:python/{SERVER_ARGS_REL}")
    assert "or is_sm120_supported()" not in head
    assert git(root, "status", "--porcelain") == ""


def test_rollback_when_a_patched_file_was_deleted(site: Path) -> None:
    t = target_at(site)
    pristine = snapshot(site)
    engine.apply(t, RECIPES, ARCH)
    (site / COMMUNICATOR_REL).unlink()
    assert {f["path"]: f["state"] for f in engine.status(t)["files"]}[COMMUNICATOR_REL] == "missing"
    with pytest.raises(UserError):  # refuse like an edited file...
        engine.rollback(t, RECIPES)
    engine.rollback(t, RECIPES, force=True)  # ...and restore the original with --force
    assert snapshot(site) == pristine


def test_apply_only_one_recipe_in_its_own_file(site: Path) -> None:
    t = target_at(site)
    pristine = snapshot(site)
    plans = statuses(engine.apply(t, RECIPES, ARCH, only=[AUTOTUNE]))
    assert plans[AUTOTUNE] == APPLIED and plans[ALLREDUCE] == APPLICABLE and plans[MOE] == APPLICABLE
    now = snapshot(site)
    assert {rel for rel in now if now[rel] != pristine[rel]} == {MODEL_RUNNER_REL}
    assert engine.applied_recipes(site) == {AUTOTUNE}
    assert engine.rollback_recipes(site, [AUTOTUNE, MOE]) == [AUTOTUNE]
    assert snapshot(site) == pristine


def test_replay_needs_the_kept_recipe_in_the_catalogue(site: Path) -> None:
    t = target_at(site)
    engine.apply(t, RECIPES, ARCH)
    with pytest.raises(UserError) as ei:
        engine.rollback(t, [r for r in RECIPES if r.id != MOE], ids=[ALLREDUCE])
    assert MOE in one_line(ei) and "no longer in the catalogue" in str(ei.value)


def test_file_mode_is_preserved(site: Path) -> None:
    t = target_at(site)
    path = site / COMMUNICATOR_REL
    os.chmod(path, 0o754)
    engine.apply(t, RECIPES, ARCH)
    assert stat.S_IMODE(path.stat().st_mode) == 0o754 and b"_is_sm120_supported" in path.read_bytes()
    engine.rollback(t, RECIPES)
    assert stat.S_IMODE(path.stat().st_mode) == 0o754 and b"_is_sm120_supported" not in path.read_bytes()


# --- git targets ----------------------------------------------------------------------------------------------


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    return make_clone(tmp_path / "sglang", tag="v0.5.9")


def test_git_uncommitted_change_in_a_touched_file_needs_force(clone: Path) -> None:
    t = target_at(clone)
    rel = f"python/{SERVER_ARGS_REL}"
    with open(clone / rel, "a") as f:
        f.write("# local experiment\n")
    before = snapshot(clone)
    with pytest.raises(UserError) as ei:
        engine.apply(t, RECIPES, ARCH)
    assert rel in one_line(ei) and "--force" in str(ei.value)
    assert snapshot(clone) == before and Journal.open(t.root).applied == []
    plans = engine.apply(t, RECIPES, ARCH, force=True)
    assert statuses(plans) == dict.fromkeys(ALL_IDS, APPLIED)
    assert (clone / rel).read_text().endswith("# local experiment\n")
    engine.rollback(t, RECIPES)
    assert snapshot(clone) == before


def test_git_dirty_elsewhere_and_our_own_changes_are_fine(clone: Path) -> None:
    t = target_at(clone)
    with open(clone / "python/sglang/srt/utils.py", "a") as f:
        f.write("# untouched by recipes\n")
    engine.apply(t, RECIPES, ARCH)
    assert git(clone, "status", "--porcelain", "--", ".sm120patch") == ""
    assert DIRNAME not in git(clone, "status", "--porcelain", "--untracked-files=all")
    # our own (uncommitted) applied change does not count as dirty for the next apply
    engine.rollback(t, RECIPES, ids=[MOE])
    assert statuses(engine.apply(t, RECIPES, ARCH))[MOE] == APPLIED


def test_git_worktree_keeps_the_journal_out_of_git_status(clone: Path, tmp_path: Path) -> None:
    wt = tmp_path / "wt"
    git(clone, "worktree", "add", "-q", str(wt), "-b", "wt")
    t = target_at(wt)
    assert t.is_git and t.root == wt.resolve()
    engine.apply(t, RECIPES, ARCH)
    assert DIRNAME not in git(wt, "status", "--porcelain", "--untracked-files=all")


def test_git_commit_one_commit_per_recipe_on_a_branch(clone: Path) -> None:
    t = target_at(clone)
    engine.apply(t, RECIPES, ARCH, commit=True)
    assert git(clone, "rev-parse", "--abbrev-ref", "HEAD").strip() == "sm120patch/sm_120"
    subjects = git(clone, "log", "--format=%s", "main..HEAD").splitlines()
    assert subjects == [f"sm120patch: {i}" for i in reversed(ALL_IDS)]
    assert git(clone, "status", "--porcelain") == ""
    touched = {}
    for sha in git(clone, "rev-list", "main..HEAD").split():
        subject = git(clone, "log", "-1", "--format=%s", sha).strip()
        touched[subject.split(": ")[1]] = set(git(clone, "show", "--name-only", "--format=", sha).split())
    assert touched == {
        ALLREDUCE: {f"python/{COMMUNICATOR_REL}", f"python/{SERVER_ARGS_REL}"},
        AUTOTUNE: {f"python/{MODEL_RUNNER_REL}"},
        MOE: {f"python/{SERVER_ARGS_REL}"},
    }


def test_git_commit_keeps_the_executable_bit(clone: Path) -> None:
    rel = f"python/{COMMUNICATOR_REL}"
    os.chmod(clone / rel, 0o755)
    git(clone, "commit", "-q", "-am", "make it executable")
    engine.apply(target_at(clone), RECIPES, ARCH, commit=True)
    assert git(clone, "ls-files", "-s", rel).split()[0] == "100755"
    assert git(clone, "status", "--porcelain") == ""


# --- diffs ----------------------------------------------------------------------------------------------------------


def test_plan_diffs_apply_with_git_to_a_pristine_copy(tmp_path: Path) -> None:
    patched = tmp_path / "patched"
    make_sglang(patched, runner_final_newline=False)
    pristine = tmp_path / "pristine"
    shutil.copytree(patched, pristine)
    t = target_at(patched)
    plans = plan(t, RECIPES, ARCH)
    autotune = next(p for p in plans if p.recipe.id == AUTOTUNE).diff()
    assert NO_EOL in autotune
    for p in plans:  # in order: later diffs build on earlier ones
        d = p.diff().encode()
        r = subprocess.run(["git", "apply", "--check", "-"], cwd=pristine, input=d, capture_output=True)
        assert r.returncode == 0, r.stderr.decode()
        subprocess.run(["git", "apply", "-"], cwd=pristine, input=d, check=True, capture_output=True)
    engine.apply(t, RECIPES, ARCH)
    assert snapshot(pristine) == snapshot(patched)
    assert not (pristine / MODEL_RUNNER_REL).read_bytes().endswith(b"\n")


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("a = 1\nb = 2", "a = 1\nb = 3"),
        ("a = 1\nb = 2", "a = 1\nb = 2\n"),
        ("a = 1\nb = 2\n", "a = 1\nb = 2"),
        ("a = 1\r\nb = 2\r\n", "a = 1\r\nb = 3\r\n"),
        ("", "x = 1\n"),
    ],
)
def test_unified_round_trips_through_git_apply(tmp_path: Path, before: str, after: str) -> None:
    (tmp_path / "f.py").write_bytes(before.encode())
    d = unified("f.py", before, after)
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=d.encode(), check=True, capture_output=True)
    assert (tmp_path / "f.py").read_bytes() == after.encode()
    assert unified("f.py", after, after) == ""


@pytest.mark.parametrize("odd", ["\x0c", "\u2028"])
def test_unified_with_form_feed_or_line_separator(tmp_path: Path, odd: str) -> None:
    before = f"a = 1\n{odd}\ns = '{odd}'\nb = 2\n"
    after = before.replace("b = 2", "b = 3")
    (tmp_path / "f.py").write_bytes(before.encode())
    d = unified("f.py", before, after)
    r = subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=d.encode(), capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    assert (tmp_path / "f.py").read_bytes() == after.encode()


# --- the journal itself ----------------------------------------------------------------------------------------------


def test_atomic_write_replaces_and_sets_mode(tmp_path: Path) -> None:
    p = tmp_path / "f.py"
    p.write_bytes(b"old")
    atomic_write(p, b"new", 0o640)
    assert p.read_bytes() == b"new" and stat.S_IMODE(p.stat().st_mode) == 0o640
    assert [x.name for x in tmp_path.iterdir()] == ["f.py"]  # no temp file left


def test_atomic_write_failure_leaves_old_bytes_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "f.py"
    p.write_bytes(b"old")

    def boom(*a: object) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(journal.os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write(p, b"new")
    assert p.read_bytes() == b"old" and [x.name for x in tmp_path.iterdir()] == ["f.py"]


def test_state_dir_is_in_a_writable_tree(tmp_path: Path) -> None:
    assert state_dir_for(tmp_path) == tmp_path / DIRNAME


def test_write_refuses_while_pending(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_bytes(b"a")
    j = Journal.open(tmp_path)
    j.data["pending"] = {"started": 0, "writes": {}}
    with pytest.raises(JournalError, match="interrupted run is pending"):
        j.write({"a.py": b"b"})
    assert (tmp_path / "a.py").read_bytes() == b"a"


def test_write_then_recover_round_trip(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_bytes(b"one")
    j = Journal.open(tmp_path)
    j.write({"a.py": b"two"})
    j.save()
    assert (tmp_path / "a.py").read_bytes() == b"two"
    j2 = Journal.open(tmp_path)
    assert j2.file("a.py") is not None and j2.original("a.py") == b"one"
    assert j2.recover() == []  # nothing pending
    j2.write({"a.py": b"one"})  # back to the original: the entry goes away
    assert j2.file("a.py") is None


def test_a_probe_that_raises_leaves_the_tree_and_journal_untouched(site: Path) -> None:
    """Probe first, write after: an interrupt (or any error) during a probe, which can take
    minutes at the build rung, must leave no gate open and nothing to recover."""
    pristine = snapshot(site)

    def interrupted(recipe):  # noqa: ANN001, ANN202
        if recipe.needs:
            raise KeyboardInterrupt
        return ProbeResult(True, "needs no kernels", "-", "spec")

    with pytest.raises(KeyboardInterrupt):
        engine.apply(target_at(site), RECIPES, ARCH, probe=interrupted)
    assert snapshot(site) == pristine
    assert not (site / DIRNAME).exists()


def test_killed_during_the_probe_leaves_the_old_tree(site: Path, tmp_path: Path) -> None:
    """SIGKILL while the spec rung's interpreter runs: nothing was written yet, nothing pending."""
    import signal
    import time

    from tests.unit.fi_fakes import make_tree

    pristine = snapshot(site)
    fi = make_tree(tmp_path / "fi", gate="[9, 10, 12]", host="fixed")
    started = tmp_path / "probe-started"
    slow = tmp_path / "slow-python"
    slow.write_text(f'#!/bin/sh\ntouch {started}\nsleep 60\nexec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    cmd = [sys.executable, "-m", "sm120patch", "apply", str(site), "--arch", "sm_120", "--probe", "spec"]
    cmd += ["--flashinfer", str(fi), "--python", str(slow)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the probe never started"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert snapshot(site) == pristine
    j = Journal.open(target_at(site).root)
    assert j.applied == [] and not j.data.get("pending")


def test_a_journal_path_no_filesystem_can_hold_is_a_damaged_journal(site: Path) -> None:
    """Found by the journal fuzzer: a 300-character file name in `pending` ended in an OSError
    (exit 3); it is a damaged journal (exit 2, one line), refused before any file is touched."""
    t = target_at(site)
    engine.apply(t, RECIPES, ARCH)
    path = Journal.open(t.root).dir / "journal.json"
    data = json.loads(path.read_text())
    data["pending"] = {"started": 0, "writes": {"x" * 300: {"before": "0" * 64, "after": "1" * 64}}}
    path.write_text(json.dumps(data))
    with pytest.raises(JournalError, match="damaged journal"):
        engine.rollback(t, RECIPES)


def test_typed_entries_read_journals_of_older_versions_and_keep_unknown_keys(tmp_path: Path) -> None:
    """journal.json stays the storage: an entry without package/dist_version (older versions) reads
    as the tree's package, and a key a newer version wrote survives a load and a save."""
    root = tmp_path / "tree"
    (root / ".sm120patch").mkdir(parents=True)
    old = {
        "schema": 1,
        "files": {},
        "pending": None,
        "history": [],
        "applied": [{"id": "r1", "files": [], "arch": "sm_120,sm_121", "at": "", "version": "0.5.9", "later": 7}],
    }
    (root / ".sm120patch" / "journal.json").write_text(json.dumps(old))
    j = Journal.open(root)
    (e,) = j.entries("sglang")
    assert (e.id, e.archs, e.version, e.dist_version, e.dependents) == ("r1", ["sm_120", "sm_121"], "0.5.9", None, [])
    j.save()
    assert json.loads((root / ".sm120patch" / "journal.json").read_text())["applied"][0]["later"] == 7
