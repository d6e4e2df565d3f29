"""What pip did to an applied recipe since apply, read from the bytes and the dist-info.

A pip user keeps changing site-packages under the journal: `pip install --force-reinstall`
puts the release's own bytes back over the patch, `pip install sglang==0.5.8` replaces the
release. Each applied entry is compared, on every command, with what is on disk now:

- `other-release`: the package's installed version (dist-info, else the tree's version file)
  is not the one the recipe was applied to. Every byte the journal holds for it belongs to
  another release: it is never written back (not even by `rollback --force`); the entry is
  retired and the release planned afresh.
- `replaced-by-pip`: every file of the recipe is back at its original bytes: pip (or the user)
  reinstalled the release. Nothing to undo; the entry is retired, no `--force` needed.
- anything else is today's rule: as applied, or a user edit (`changed-since-apply`).

Read-only commands (plan, status, preflight) report these states; apply and rollback retire
the entries (journal only, never a byte of the tree) and say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sm120patch.hashing import sha256

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sm120patch.engine.journal import Applied, Journal
    from sm120patch.planning.targets import Target

REPLACED = "replaced-by-pip"
OTHER_RELEASE = "other-release"


@dataclass
class Retired:
    """An applied entry pip made obsolete: which, how, and the sentence a user reads."""

    id: str
    package: str
    state: str  # REPLACED | OTHER_RELEASE
    why: str
    root: Path | None = None
    entry: dict[str, Any] = field(default_factory=dict, repr=False)  # the journal entry, as it was

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "package": self.package, "state": self.state, "why": self.why}


def installed_version(target: Target) -> tuple[str | None, str]:
    """(version now, what it is read from): the dist-info pip wrote, else the tree's own."""
    from sm120patch.planning.targets import dist_version

    v = dist_version(target.package, target.package_dir.parent)
    return (v, "dist-info") if v else (target.version, "tree")


def recorded_version(entry: Applied) -> tuple[str | None, str]:
    """(version at apply, what it was read from), as the entry recorded it."""
    if entry.dist_version:
        return entry.dist_version, "dist-info"
    return entry.version, "tree"


def entry_state(journal: Journal, target: Target, entry: Applied) -> tuple[str, str]:
    """(state, why) of one applied entry: OTHER_RELEASE, REPLACED, or "" (today's rules)."""
    was, was_from = recorded_version(entry)
    now, now_from = installed_version(target)
    if was_from == "tree" and now_from == "dist-info":
        now = target.version  # compare like with like (a journal from before dist-info was recorded)
    if was and now and was != now:
        return OTHER_RELEASE, (
            f"applied to {target.package} {was}; {target.package} {now} is installed now (another release): "
            "its recorded bytes are never written back; retired, and this release is planned afresh"
        )
    files = entry.files
    if files and all(_at_original(journal, rel) for rel in files):
        return REPLACED, (
            f"every file it changed is back at {target.package} {now or '?'}'s own bytes (pip reinstalled "
            "the release): nothing to undo; retired"
        )
    return "", ""


def _at_original(journal: Journal, rel: str) -> bool:
    entry = journal.file(rel)
    path = journal.root / rel
    if entry is None or not path.is_file():
        return False
    return sha256(path.read_bytes()) == entry.original


def obsolete(journal: Journal, target: Target) -> list[Retired]:
    """Entries of `target`'s package that pip made obsolete (read-only)."""
    out = []
    for a in journal.entries(target.package):
        state, why = entry_state(journal, target, a)
        if state:
            out.append(Retired(a.id, target.package, state, why, target.root, a.raw))
    return out


def retire(journal: Journal, target: Target, ids: Sequence[str] | None = None) -> list[Retired]:
    """Drop the entries pip made obsolete from the journal (never a byte of the tree), and the
    file records no remaining entry needs; `ids`: only those (what a reconciliation decided).
    The caller holds the lock; saved here."""
    gone = [r for r in obsolete(journal, target) if ids is None or r.id in ids]
    if not gone:
        return []
    out = {r.id for r in gone}
    keep = [a for a in journal.applied if not (a["id"] in out and a.get("package", target.package) == target.package)]
    needed = {rel for a in keep for rel in a.get("files") or []}
    journal.data["applied"] = keep
    for rel in [r for r in journal.data["files"] if r not in needed]:
        mine = (journal.root / rel).is_relative_to(target.package_dir)
        if mine:
            del journal.data["files"][rel]
    journal.note("retire", recipes=[r.to_dict() for r in gone])
    journal.save()
    return gone
