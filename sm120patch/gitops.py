"""Git targets: make the fresh clone to patch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sm120patch.errors import UserError


def split_ref(source: str) -> tuple[str, str | None]:
    """`URL@REF` -> (URL, REF). An `@` that belongs to the URL (`git@host:org/repo`) is left alone."""
    head, sep, tail = source.rpartition("@")
    if sep and head and tail and not set(tail) & {"/", ":"} and set(head) & {"/", ":"}:
        return head, tail
    return source, None


def clone(source: str, dest: Path) -> dict[str, Any]:
    import git

    url, ref = split_ref(source)
    if dest.exists() and any(dest.iterdir()):
        raise UserError(f"{dest}: exists and is not empty; pick a new folder for the clone")
    try:
        repo = git.Repo.clone_from(url, dest)
        if ref:
            repo.git.checkout(ref)
    except git.GitCommandError as e:
        detail = (e.stderr or "").strip().splitlines()
        raise UserError(
            f"{source}: git clone/checkout failed ({detail[-1] if detail else e}); "
            "check the URL and the ref (tag, branch or commit)"
        ) from None
    return {"url": url, "ref": ref, "dest": str(dest), "commit": repo.head.commit.hexsha}
