"""Every git operation sm120patch makes, through GitPython (imported on first use).

One place, one way: the engine asks which files are dirty, the journal where a
worktree keeps info/exclude, targets the `git describe` of a clone, plan whether a
diff applies, and `clone`/`--commit` make clones and commits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sm120patch.errors import UserError

TIMEOUT_S = 60.0


def _run(cwd: Path, *args: str, timeout: float = TIMEOUT_S, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `git ARGS` in `cwd`; (-1, "", why) if git cannot start."""
    import git

    try:
        code, out, err = git.Git(str(cwd)).execute(
            ["git", *args], with_extended_output=True, with_exceptions=False, kill_after_timeout=timeout, env=env
        )
    except (git.GitCommandNotFound, OSError) as e:
        return -1, "", str(e)
    return int(code), str(out), str(err)


def dirty_files(root: Path, rels: list[str]) -> list[str]:
    """Which of `rels` have uncommitted changes (as `git status --porcelain` sees them)."""
    code, out, _ = _run(root, "status", "--porcelain", "--", *rels)
    if code != 0:
        return []
    return [line[3:].strip() for line in out.splitlines() if line.strip()]


def identity_problem(root: Path) -> str | None:
    """Why `git commit` would refuse in `root` (no user.name/user.email), with the fix; None when it
    would not. Asked before a byte is written: `--commit` must not fail after the files changed."""
    import shlex

    for var in ("GIT_AUTHOR_IDENT", "GIT_COMMITTER_IDENT"):
        code, _, err = _run(root, "var", var)
        if code != 0:
            last = (err.strip().splitlines() or ["identity unknown"])[-1].removeprefix("fatal: ")
            q = shlex.quote(str(root))
            return (
                f"{root}: git has no identity to commit with ({last}); run `git -C {q} config user.name "
                f"'Your Name' && git -C {q} config user.email you@example.com`, or leave out --commit"
            )
    return None


def where(root: Path) -> dict[str, str | None]:
    """The branch (None when detached), HEAD and index tree a `--commit` apply starts from."""
    _, branch, _ = _run(root, "symbolic-ref", "--short", "-q", "HEAD")
    _, head, _ = _run(root, "rev-parse", "-q", "--verify", "HEAD")
    _, index, _ = _run(root, "write-tree")
    return {"branch": branch.strip() or None, "head": head.strip() or None, "index": index.strip() or None}


def go_back(root: Path, start: dict[str, str | None]) -> None:
    """Return HEAD and the index to where a `--commit` apply started (the work tree is the caller's:
    rollback has just written the original bytes back). The sm120patch/<arch> branch is kept."""
    if start.get("branch"):
        _run(root, "symbolic-ref", "HEAD", f"refs/heads/{start['branch']}")
    elif start.get("head"):
        _run(root, "update-ref", "--no-deref", "HEAD", str(start["head"]))
    if start.get("index"):
        _run(root, "read-tree", str(start["index"]))


def git_path(root: Path, name: str) -> Path | None:
    """Where git keeps `name` (e.g. info/exclude) for the repo at root: worktrees and submodules differ."""
    code, out, _ = _run(root, "rev-parse", "--git-path", name, timeout=30)
    return root / out.strip() if code == 0 and out.strip() else None


def describe(root: Path) -> str | None:
    code, out, _ = _run(root, "describe", "--tags", "--always", timeout=10)
    return out.strip() if code == 0 else None


def diff_applies(cwd: Path, patch: Path, *, reverse: bool = False, check: bool = True) -> bool:
    """`git apply [--check] [--reverse] PATCH` to the files under `cwd`, a scratch folder; no fuzz.

    Git must not take a repository above `cwd` (a TMPDIR inside a clone) for the one to patch."""
    import os

    flags = ["--check"] if check else []
    flags += ["--reverse"] if reverse else []
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(cwd.resolve().parent)}
    code, _, _ = _run(cwd, "apply", *flags, str(patch.resolve()), env=env)
    return code == 0


def split_ref(source: str) -> tuple[str, str | None]:
    """`URL@REF` -> (URL, REF). An `@` that belongs to the URL (`git@host:org/repo`) is left alone."""
    head, sep, tail = source.rpartition("@")
    if sep and head and tail and not set(tail) & {"/", ":"} and set(head) & {"/", ":"}:
        return head, tail
    return source, None


def git_reason(stderr: str) -> str:
    """Git's own reason from a failed command's stderr: the last `fatal:`/`error:` line, its prefix
    dropped. GitPython wraps stderr as `\n  stderr: '...'\n`; the wrapper's quotes are not git's."""
    text = stderr.strip()
    if text.startswith("stderr: '"):
        text = text[len("stderr: '") :]
        text = text[:-1] if text.endswith("'") else text
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    for line in reversed(lines):
        for prefix in ("fatal:", "error:"):
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
    rest = [x for x in lines if not x.startswith(("Cloning into", "remote:"))]
    return rest[-1] if rest else ""


def _undo_clone(dest: Path, existed: bool) -> None:
    """Take back what a failed clone left (a bad ref fails after the clone landed): the folder was
    empty or absent before, so everything in it is ours. An empty folder the user made stays."""
    import shutil

    if not dest.is_dir() or dest.is_symlink():
        return
    if not existed:
        shutil.rmtree(dest, ignore_errors=True)
        return
    for child in dest.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def clone(source: str, dest: Path) -> dict[str, Any]:
    import git

    url, ref = split_ref(source)
    existed = dest.exists()
    if existed and any(dest.iterdir()):
        raise UserError(f"{dest}: exists and is not empty; pick a new folder for the clone")
    try:
        repo = git.Repo.clone_from(url, dest)
        if ref:
            repo.git.checkout(ref)
    except git.GitCommandError as e:
        _undo_clone(dest, existed)
        reason = git_reason(str(e.stderr or "")) or f"git exit status {e.status}"
        raise UserError(
            f"{source}: git clone/checkout failed ({reason}); check the URL and the ref (tag, branch or commit)"
        ) from None
    return {"url": url, "ref": ref, "dest": str(dest), "commit": repo.head.commit.hexsha}
