"""A recipe's diff may only write inside the package it is for.

`--recipes DIR` takes recipe folders from anyone (a pull request, a colleague's branch): a diff
whose `+++ b/` names an absolute path, climbs out with `..`, or reaches out through a symlink in
the tree rewrote that file outside the tree (seen: an absolute path's file rewritten with its own
bytes, its mtime changed). Each is now that recipe's `failed`, named, with nothing written.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from sm120patch.catalogue.recipes import default_recipe_dir
from tests.unit.cli_entry import SM120PATCH
from tests.unit.sglang_fakes import make_sglang

VICTIM_TEXT = "VALUE = 1\n"


def _recipes(root: Path, target: str) -> Path:
    (root / "sglang").mkdir(parents=True)
    for name in ("signatures.toml", "kernels.toml"):
        shutil.copy(default_recipe_dir() / name, root / name)
    (root / "sglang" / "evil.diff").write_text(f"--- a/{target}\n+++ b/{target}\n@@ -1 +1 @@\n-VALUE = 1\n+VALUE = 2\n")
    (root / "sglang" / "evil.toml").write_text(
        'id = "evil"\npackage = "sglang"\ntitle = "test"\nwhy = "test data"\nversions = ">=0"\n'
        'arch = ["sm_120"]\n[[edit]]\nname = "evil"\ndiff = "evil.diff"\n'
    )
    return root


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink"])
def test_a_recipe_diff_aimed_outside_the_package_fails_that_recipe_and_writes_nothing(tmp_path: Path, how: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.py"
    victim.write_text(VICTIM_TEXT)
    pkg = make_sglang(tmp_path / "tree")
    if how == "absolute":
        target = str(victim).lstrip("/")  # `+++ b//abs/path`: git's b/ prefix, then the absolute path
        target = "/" + target
    elif how == "dotdot":
        target = os.path.relpath(victim, pkg)
    else:
        (pkg / "srt" / "link").symlink_to(outside, target_is_directory=True)
        target = "srt/link/victim.py"
    recipes = _recipes(tmp_path / "recipes", target)
    before_out, before_tree = _snapshot(outside), _snapshot(pkg)

    r = CliRunner().invoke(
        SM120PATCH, ["apply", str(pkg), "--arch", "sm_120", "--probe", "none", "--recipes", str(recipes)]
    )

    assert r.exit_code == 1, r.output
    assert "evil" in r.output and "outside the package" in r.output, r.output
    assert "Traceback" not in r.output
    assert victim.read_text() == VICTIM_TEXT
    assert _snapshot(outside) == before_out  # bytes and mtimes: not rewritten, not even with its own bytes
    assert _snapshot(pkg) == before_tree
