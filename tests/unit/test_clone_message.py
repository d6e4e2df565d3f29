"""`sm120patch clone` names git's own reason when it fails: the user must see "Could not resolve
host" (or "Repository not found", a bad ref), not a quote character."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sm120patch.gitops import git_reason


def test_a_host_that_cannot_resolve_is_named(tmp_path: Path) -> None:
    # `.invalid` never resolves (RFC 2606): git fails at once, without a network
    r = subprocess.run(
        [sys.executable, "-m", "sm120patch", "clone", "https://nonexistent.invalid/x.git", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "Could not resolve host: nonexistent.invalid" in line, line
    assert "('" not in line and "stderr:" not in line, line
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())


@pytest.mark.parametrize(
    ("stderr", "reason"),
    [
        (
            "\n  stderr: 'Cloning into '/tmp/x'...\nfatal: unable to access 'https://h/x.git/': "
            "Could not resolve host: h\n'",
            "unable to access 'https://h/x.git/': Could not resolve host: h",
        ),
        (
            "\n  stderr: 'error: pathspec 'v9.9.9' did not match any file(s) known to git\n'",
            "pathspec 'v9.9.9' did not match any file(s) known to git",
        ),
        (
            "\n  stderr: 'Cloning into 'x'...\nremote: Repository not found.\nfatal: repository "
            "'https://github.com/a/b.git/' not found\n'",
            "repository 'https://github.com/a/b.git/' not found",
        ),
        ("", ""),
    ],
)
def test_git_reason_is_the_fatal_line(stderr: str, reason: str) -> None:
    assert git_reason(stderr) == reason


def _local_repo(where: Path) -> Path:
    """A one-commit repository of our own: the clone's source, no network."""
    src = where / "src"
    src.mkdir()
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    import os

    env = {**os.environ, **env}
    subprocess.run(["git", "init", "-q", str(src)], check=True, env=env)
    (src / "a.txt").write_text("a\n")
    subprocess.run(["git", "-C", str(src), "add", "a.txt"], check=True, env=env)
    subprocess.run(["git", "-C", str(src), "commit", "-q", "-m", "a"], check=True, env=env)
    return src


@pytest.mark.needs("git")
@pytest.mark.parametrize("made_by_user", [False, True])
def test_a_bad_ref_leaves_no_clone_behind(tmp_path: Path, made_by_user: bool) -> None:
    # the clone itself succeeds; the checkout of the ref fails after it landed
    src = _local_repo(tmp_path)
    dest = tmp_path / "dest"
    if made_by_user:
        dest.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "sm120patch", "clone", f"{src}@no-such-ref", str(dest)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no-such-ref" in r.stderr, r.stderr
    # an empty folder the user made is kept, empty; one the clone made is gone
    assert dest.is_dir() == made_by_user
    assert not made_by_user or list(dest.iterdir()) == []
    assert (src / "a.txt").read_text() == "a\n"
