"""Every command sm120patch tells a user to run is one a shell runs as meant, also for a path with
a space or a quote in it (issue 21: two of the three places that built it did not quote)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from sm120patch.hints import apply_command, rollback_command


@pytest.mark.parametrize("where", ["/srv/site-packages", "/home/a b/site", "/tmp/it's here", "/x/$HOME/`id`"])
def test_rollback_command_round_trips_through_the_shell(where: str) -> None:
    cmd = rollback_command(Path(where), ["sglang-allreduce-fusion-sm120", "id with space"])
    assert shlex.split(cmd) == [
        "sm120patch",
        "rollback",
        where,
        "--recipe",
        "sglang-allreduce-fusion-sm120",
        "--recipe",
        "id with space",
    ]
    assert shlex.split(rollback_command(where)) == ["sm120patch", "rollback", where]
    assert shlex.split(apply_command(where, "/b c", flags=["--arch", "sm_120"])) == [
        "sm120patch",
        "apply",
        where,
        "/b c",
        "--arch",
        "sm_120",
    ]


def test_the_command_export_prints_runs_as_printed_in_a_folder_with_a_space(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """End to end: `export` of a tree sm120patch has patched refuses with the rollback command; that
    command, pasted into a shell (split with shlex), restores the tree, though its path has a space."""
    import re

    from sm120patch.cli import main
    from tests.unit.sglang_fakes import make_sglang, snapshot

    def sm(*args: object) -> tuple[int, str]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as ei:
            main([str(a) for a in args])
        return int(ei.value.code or 0), capsys.readouterr().err

    root = tmp_path / "my trees" / "sg"
    make_sglang(root)
    pristine = snapshot(root)
    assert sm("apply", root, "--probe", "none", "--arch", "sm_120")[0] == 0
    code, err = sm("export", root, "--probe", "none", "--arch", "sm_120", "-o", tmp_path / "bundle")
    assert code == 2
    printed = re.search(r"run `([^`]+)` first", err)
    assert printed, err
    argv = shlex.split(printed[1])
    assert argv[:2] == ["sm120patch", "rollback"] and argv[2] == str(root)
    assert sm(*argv[1:])[0] == 0
    assert snapshot(root) == pristine
