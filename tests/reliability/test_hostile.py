"""Broken and hostile input: every case ends in one `sm120patch: error:` line naming the file and
the fix, exit 2, no traceback, and not one byte written (every file's sha256 and mode, before/after).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sm120patch.arch import parse_arch
from sm120patch.catalogue.recipes import default_recipe_dir, load_recipes
from sm120patch.engine import tree as engine
from sm120patch.engine.journal import DIRNAME, Journal, state_dir_for
from sm120patch.errors import UserError
from sm120patch.planning.targets import discover
from tests.reliability.conftest import (
    APPLY,
    COMMUNICATOR,
    COMMUNICATOR_REL,
    SERVER_ARGS_REL,
    assert_clean_failure,
    cli,
    count,
    fingerprint,
    make_fake,
    unprivileged_user,
)

CATALOGUE = default_recipe_dir()
AR = "sglang-allreduce-fusion-sm120"


def refused(tree: Path, *args: str, names: tuple[str, ...] = (), outside: Path | None = None) -> str:
    """Run the CLI; it must refuse cleanly and leave `tree` (and `outside`) exactly as they were."""
    before = fingerprint(tree)
    out_before = fingerprint(outside) if outside else None
    r = cli(*args)
    assert_clean_failure(r, *names)
    assert fingerprint(tree) == before
    if outside:
        assert fingerprint(outside) == out_before
    count("hostile_cases")
    return r.stderr


def recipe_dir(tmp_path: Path, text: str | bytes, name: str = AR) -> Path:
    d = tmp_path / "recipes"
    shutil.copytree(CATALOGUE, d, dirs_exist_ok=True)
    p = d / "sglang" / f"{name}.toml"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return d


GOOD = (CATALOGUE / "sglang" / f"{AR}.toml").read_text()

BAD_RECIPES = {
    "truncated": GOOD[: len(GOOD) // 2],
    "malformed": "id = \n",
    "wrong-type-arch": GOOD.replace('arch = ["sm_120", "sm_121"]', 'arch = "sm_120"'),
    "wrong-type-optional": GOOD.replace("optional = true", 'optional = "yes"', 1),
    "unknown-transform": GOOD.replace('transform = "widen-arch-test"', 'transform = "rm-rf"', 1),
    "bad-specifier": GOOD.replace('versions = ">=0.5.5"', 'versions = "~=banana"'),
    "dotdot-hint": GOOD.replace('"srt/layers/communicator.py"', '"../../../etc/passwd"'),
    "absolute-hint": GOOD.replace('"srt/layers/communicator.py"', '"/etc/passwd"'),
    "unknown-key": GOOD + '\nrun = "rm -rf /"\n',
    "id-mismatch": GOOD.replace(f'id = "{AR}"', 'id = "something-else"'),
    "bad-arch": GOOD.replace('arch = ["sm_120", "sm_121"]', 'arch = ["sm_1200x"]'),
    "bad-params": GOOD.replace(
        'params = { has = ["sm90", "sm100"], add = "sm120"', 'params = { has = 5, add = "sm120"', 1
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_RECIPES))
@pytest.mark.parametrize("command", ["apply", "plan", "recipes"])
def test_bad_recipe_is_one_line_naming_the_file(case: str, command: str, fake: Path, tmp_path: Path) -> None:
    assert BAD_RECIPES[case] != GOOD, case
    d = recipe_dir(tmp_path, BAD_RECIPES[case])
    args = [command] + ([str(fake), *APPLY] if command != "recipes" else []) + ["--recipes", str(d)]
    if command == "plan":
        args.remove("--no-diff")
    err = refused(fake, *args, names=(f"{AR}.toml",))
    assert "; " in err  # problem; fix


def test_recipe_not_utf8_and_missing_folder(fake: Path, tmp_path: Path) -> None:
    d = recipe_dir(tmp_path, GOOD.encode() + b"\n# caf\xe9\n")
    assert "UTF-8" in refused(fake, "apply", str(fake), *APPLY, "--recipes", str(d), names=(f"{AR}.toml",))
    refused(fake, "apply", str(fake), *APPLY, "--recipes", str(tmp_path / "nope"), names=("nope",))


def test_target_is_a_file_an_empty_folder_or_missing(tmp_path: Path) -> None:
    f = tmp_path / "file.py"
    f.write_text("x = 1\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (f, empty, tmp_path / "missing"):
        for cmd in (["apply", str(path), *APPLY], ["rollback", str(path)], ["status", str(path)]):
            refused(tmp_path, *cmd, names=(str(path),))


def test_target_file_that_does_not_parse(fake: Path) -> None:
    """One unparsable file fails the recipe that edits it (exit 1, the file and line named), never
    the command: the file keeps its bytes, no traceback (issue 33)."""
    broken = fake / COMMUNICATOR_REL
    broken.write_text(COMMUNICATOR + "\ndef broken(:\n")
    before = broken.read_bytes()
    r = cli("apply", str(fake), *APPLY)
    assert r.returncode == 1 and "Traceback" not in r.stdout + r.stderr, (r.returncode, r.stdout, r.stderr)
    assert "does not parse" in r.stdout and COMMUNICATOR_REL in r.stdout and "line " in r.stdout, r.stdout
    assert broken.read_bytes() == before
    count("hostile_cases")


def test_non_utf8_source(fake: Path) -> None:
    """A file that does not decode is a file that does not parse: its recipe fails, named (issue 33)."""
    broken = fake / COMMUNICATOR_REL
    broken.write_bytes(COMMUNICATOR.encode() + b"# \xff\xfe latin-1\n")
    before = broken.read_bytes()
    r = cli("apply", str(fake), *APPLY)
    assert r.returncode == 1 and "Traceback" not in r.stdout + r.stderr, (r.returncode, r.stdout, r.stderr)
    assert "not UTF-8" in r.stdout and COMMUNICATOR_REL in r.stdout, r.stdout
    assert broken.read_bytes() == before
    count("hostile_cases")


def test_corrupt_journal_and_missing_blob(fake: Path) -> None:
    assert cli("apply", str(fake), *APPLY).returncode == 0
    journal = fake / DIRNAME / "journal.json"
    good = journal.read_bytes()
    for garbage in (b"{not json", b"", b"[]", good[: len(good) // 2], b"\x00\xff" * 10, b"[" * 100_000):
        journal.write_bytes(garbage)
        for cmd in (["rollback", str(fake)], ["status", str(fake)], ["apply", str(fake), *APPLY]):
            refused(fake, *cmd, names=("journal.json",))
    journal.write_bytes(good)
    blobs = fake / DIRNAME / "blobs"
    victim = sorted(blobs.iterdir())[0]
    victim.unlink()
    assert "blob" in refused(fake, "rollback", str(fake))
    victim.write_bytes(b"not the original")  # corrupt, not missing
    assert "corrupt" in refused(fake, "rollback", str(fake))


def test_journal_pointing_outside_the_tree_is_refused(fake: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.py").write_text("precious\n")
    assert cli("apply", str(fake), *APPLY).returncode == 0
    journal = fake / DIRNAME / "journal.json"
    data = json.loads(journal.read_text())
    entry = next(iter(data["files"].values()))
    for rel in ("../outside/victim.py", str(outside / "victim.py"), "sglang/../../outside/victim.py"):
        hostile = json.loads(json.dumps(data))
        hostile["pending"] = {"started": 0, "writes": {rel: {"before": entry["original"], "after": entry["current"]}}}
        journal.write_text(json.dumps(hostile))
        refused(fake, "rollback", str(fake), names=("journal.json",), outside=outside)
        hostile = json.loads(json.dumps(data))
        hostile["files"][rel] = entry
        hostile["applied"][0]["files"].append(rel)
        journal.write_text(json.dumps(hostile))
        refused(fake, "rollback", str(fake), names=("journal.json",), outside=outside)


def test_symlinks_out_of_the_tree_are_never_written_through(fake: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "layers").mkdir(parents=True)
    shutil.move(fake / COMMUNICATOR_REL, outside / "communicator.py")
    (fake / COMMUNICATOR_REL).symlink_to(outside / "communicator.py")  # a hinted file, linked out
    shutil.move(fake / SERVER_ARGS_REL, outside / "layers" / "server_args.py")
    (fake / SERVER_ARGS_REL).symlink_to(outside / "layers" / "server_args.py")
    before_out, before = fingerprint(outside), fingerprint(fake)
    r = cli("apply", str(fake), *APPLY)
    assert "Traceback" not in r.stderr and r.returncode in (0, 1, 2), r.stderr
    assert fingerprint(outside) == before_out
    assert (fake / COMMUNICATOR_REL).is_symlink() and (fake / SERVER_ARGS_REL).is_symlink()
    assert cli("rollback", str(fake)).returncode == 0
    assert fingerprint(fake) == before and fingerprint(outside) == before_out
    count("hostile_cases")


def test_symlinked_folder_out_of_the_tree(fake: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    shutil.move(fake / "sglang/srt/layers", outside)
    (fake / "sglang/srt/layers").symlink_to(outside, target_is_directory=True)
    before_out, before = fingerprint(outside), fingerprint(fake)
    r = cli("apply", str(fake), *APPLY)
    assert "Traceback" not in r.stderr and r.returncode in (0, 1, 2), r.stderr
    assert fingerprint(outside) == before_out
    assert cli("rollback", str(fake)).returncode == 0
    assert fingerprint(fake) == before and fingerprint(outside) == before_out
    count("hostile_cases")


def test_journal_folder_that_is_a_symlink_is_refused(fake: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (fake / DIRNAME).symlink_to(outside, target_is_directory=True)
    for cmd in (["apply", str(fake), *APPLY], ["rollback", str(fake)], ["status", str(fake)]):
        refused(fake, *cmd, names=(DIRNAME, "symlink"), outside=outside)


def test_file_changed_between_plan_and_write(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = discover(fake)[0]
    real = engine.plan
    edited: dict[str, tuple[str, int]] = {}

    def plan_then_user_edits(*a, **k):
        plans = real(*a, **k)
        (fake / SERVER_ARGS_REL).write_text((fake / SERVER_ARGS_REL).read_text() + "# user\n")
        edited.update(fingerprint(fake))
        return plans

    from sm120patch.engine import pipeline as transaction

    monkeypatch.setattr(engine, "plan", plan_then_user_edits)
    monkeypatch.setattr(transaction, "plan", plan_then_user_edits)  # the pipeline plans there
    with pytest.raises(UserError, match="changed while sm120patch was planning"):
        engine.apply(t, load_recipes(), parse_arch("sm_120"))
    assert fingerprint(fake) == {k: v for k, v in edited.items() if not k.startswith(DIRNAME)}
    count("hostile_cases")


# --- permissions: root ignores them, so these run as `nobody` via setpriv -----------------------------


def _as_nobody() -> str:
    return unprivileged_user()


def _share(tmp_path: Path) -> Path:
    """A folder `nobody` may use (pytest's tmp is 0700 under root)."""
    base = tmp_path / "shared"
    base.mkdir()
    for p in (tmp_path, *tmp_path.parents):
        if p == Path("/"):
            break
        if os.geteuid() == 0 and not os.stat(p).st_mode & 0o001:
            os.chmod(p, os.stat(p).st_mode | 0o001)
    return base


def _chown_all(root: Path, user: str) -> None:
    if user:
        subprocess.run(["chown", "-R", f"{user}:", str(root)], check=True)


@pytest.mark.parametrize(
    ("folder", "refused_file"),
    [
        ("sglang/srt/layers", "communicator.py"),  # the first file written: nothing to undo
        ("sglang/srt/model_executor", "model_runner.py"),  # the second: communicator.py is put back
    ],
)
def test_read_only_folder_refuses_and_writes_nothing(folder: str, refused_file: str, tmp_path: Path) -> None:
    user = _as_nobody()
    tree = make_fake(_share(tmp_path) / "tree")
    _chown_all(tree, user)
    (tree / folder).chmod(0o555)
    before = fingerprint(tree)
    r = cli("apply", str(tree), *APPLY, user=user or None, env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert_clean_failure(r, refused_file)
    assert "chmod" in r.stderr
    assert fingerprint(tree) == before
    count("hostile_cases")


def test_read_only_file_in_a_writable_folder_keeps_its_mode(tmp_path: Path) -> None:
    user = _as_nobody()
    tree = make_fake(_share(tmp_path) / "tree")
    _chown_all(tree, user)
    (tree / SERVER_ARGS_REL).chmod(0o444)
    before = fingerprint(tree)
    r = cli("apply", str(tree), *APPLY, user=user or None)
    assert r.returncode == 0, r.stderr
    assert (tree / SERVER_ARGS_REL).stat().st_mode & 0o777 == 0o444
    r = cli("rollback", str(tree), user=user or None)
    assert r.returncode == 0, r.stderr
    assert fingerprint(tree) == before
    count("hostile_cases")


def test_read_only_tree_keeps_the_journal_in_the_state_folder(tmp_path: Path) -> None:
    user = _as_nobody()
    share = _share(tmp_path)
    tree = make_fake(share / "tree")
    state = share / "state"
    state.mkdir()
    _chown_all(tree, user)
    _chown_all(state, user)
    tree.chmod(0o555)  # the root is read-only, the package folders are not
    before = fingerprint(tree)
    env = {"XDG_STATE_HOME": str(state)}
    r = cli("apply", str(tree), *APPLY, user=user or None, env=env)
    assert r.returncode == 0, r.stderr
    assert not (tree / DIRNAME).exists() and list(state.glob("sm120patch/*/journal.json"))
    r = cli("rollback", str(tree), user=user or None, env=env)
    assert r.returncode == 0, r.stderr
    assert fingerprint(tree) == before
    count("hostile_cases")


def test_unwritable_state_folder_is_a_clean_error(tmp_path: Path) -> None:
    user = _as_nobody()
    share = _share(tmp_path)
    tree = make_fake(share / "tree")
    _chown_all(tree, user)
    tree.chmod(0o555)
    state = share / "state"
    state.mkdir(mode=0o555)
    before = fingerprint(tree)
    r = cli("apply", str(tree), *APPLY, user=user or None, env={"XDG_STATE_HOME": str(state)})
    assert_clean_failure(r, str(state))
    assert fingerprint(tree) == before
    count("hostile_cases")


def test_state_dir_fallback_logic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The choice itself, independent of who runs the tests."""
    tree = make_fake(tmp_path / "tree")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert state_dir_for(tree) == tree / DIRNAME
    monkeypatch.setattr(os, "access", lambda p, mode: False)
    assert state_dir_for(tree).is_relative_to(tmp_path / "state" / "sm120patch")
    (tree / DIRNAME).mkdir()
    assert state_dir_for(tree) == tree / DIRNAME  # an existing journal folder wins
    assert Journal.open(tree).dir == tree / DIRNAME


def test_unprivileged_runs_do_not_need_to_read_the_clone() -> None:
    """`make test` in a private clone (mktemp -d, a home of mode 700): what `nobody` runs must
    come from a copy outside it, never from the clone or its editable install."""
    user = _as_nobody()
    if not user:
        pytest.skip("not root: the tests already run as an ordinary user, from the clone itself")
    from tests.reliability.conftest import REPO_ROOT, as_user, unprivileged_runtime

    rt = unprivileged_runtime(user)
    assert not rt.root.resolve().is_relative_to(REPO_ROOT)
    for entry in rt.pythonpath.split(os.pathsep):
        assert not Path(entry).resolve().is_relative_to(REPO_ROOT), entry
    code = "import sm120patch, sm120patch.catalogue.recipes as r; print(sm120patch.__file__, len(r.load_recipes()))"
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": rt.pythonpath, "PYTHONNOUSERSITE": "1"}
    out = subprocess.run(
        [*as_user(user), rt.python, "-s", "-c", code], capture_output=True, text=True, env=env, cwd=rt.root, timeout=120
    )
    assert out.returncode == 0, out.stderr
    where, n = out.stdout.split()
    assert Path(where).is_relative_to(rt.root) and int(n) >= 1
