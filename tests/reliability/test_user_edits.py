"""A file the user edited after apply is never silently overwritten: not by rollback, not by a
second apply. `--force` goes ahead and keeps the user's version in .sm120patch/saved/."""

from __future__ import annotations

from pathlib import Path

from sm120patch.engine.journal import DIRNAME
from tests.reliability.conftest import (
    APPLY,
    COMMUNICATOR_REL,
    SERVER_ARGS_REL,
    assert_clean_failure,
    cli,
    count,
    fingerprint,
)

AR, MOE = "sglang-allreduce-fusion-sm120", "sglang-moe-backend-sm120"


def _saved(tree: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted((tree / DIRNAME / "saved").rglob("*")) if p.is_file()]


def test_rollback_refuses_an_edited_file_and_force_keeps_a_copy(fake: Path) -> None:
    pristine = fingerprint(fake)
    assert cli("apply", str(fake), *APPLY).returncode == 0
    edited = (fake / COMMUNICATOR_REL).read_bytes() + b"# my tuning\n"
    (fake / COMMUNICATOR_REL).write_bytes(edited)
    before = fingerprint(fake)
    r = cli("rollback", str(fake))
    assert_clean_failure(r, COMMUNICATOR_REL, "--force")
    assert fingerprint(fake) == before
    st = cli("status", str(fake))
    assert st.returncode == 1 and "changed-since-apply" in st.stdout
    r = cli("rollback", str(fake), "--force")
    assert r.returncode == 0, r.stderr
    assert fingerprint(fake, skip_journal=True) == pristine
    assert _saved(fake) == [edited]
    count("user_edit_cases")


def test_second_apply_refuses_to_write_over_an_edited_file(fake: Path) -> None:
    pristine = fingerprint(fake)
    assert cli("apply", str(fake), *APPLY, "--recipe", AR).returncode == 0  # patches server_args.py too
    edited = (fake / SERVER_ARGS_REL).read_bytes() + b"# my setting\n"
    (fake / SERVER_ARGS_REL).write_bytes(edited)
    before = fingerprint(fake)
    r = cli("apply", str(fake), *APPLY, "--recipe", MOE)  # would write server_args.py again
    assert_clean_failure(r, SERVER_ARGS_REL, "--force")
    assert fingerprint(fake) == before
    r = cli("apply", str(fake), *APPLY, "--recipe", MOE, "--force")
    assert r.returncode == 0, r.stderr
    assert _saved(fake) == [edited]
    assert b"# my setting" in (fake / SERVER_ARGS_REL).read_bytes()  # the plan built on the user's text
    r = cli("rollback", str(fake))
    assert r.returncode == 0, r.stderr
    assert fingerprint(fake, skip_journal=True) == pristine
    assert _saved(fake) == [edited]  # the edit survives, in saved/
    count("user_edit_cases")


def test_apply_with_nothing_to_do_leaves_an_edited_file_alone(fake: Path) -> None:
    assert cli("apply", str(fake), *APPLY).returncode == 0
    (fake / COMMUNICATOR_REL).write_bytes((fake / COMMUNICATOR_REL).read_bytes() + b"# mine\n")
    before = fingerprint(fake)
    r = cli("apply", str(fake), *APPLY)
    assert r.returncode == 0, r.stderr
    assert fingerprint(fake) == before
    count("user_edit_cases")


def test_file_deleted_since_apply_needs_force_then_comes_back(fake: Path) -> None:
    pristine = fingerprint(fake)
    assert cli("apply", str(fake), *APPLY).returncode == 0
    (fake / COMMUNICATOR_REL).unlink()  # e.g. by a pip upgrade
    before = fingerprint(fake)
    assert_clean_failure(cli("rollback", str(fake)), COMMUNICATOR_REL, "--force")
    assert fingerprint(fake) == before
    r = cli("rollback", str(fake), "--force")
    assert r.returncode == 0, r.stderr
    assert fingerprint(fake) == pristine
    count("user_edit_cases")
