"""Bundles: the kept recipes of one plan as patches anyone can apply with git, plus a manifest.

A bundle is a folder:

    manifest.json         what it is for (tool version, arch, probe rung, each package and
                          version), and per recipe: id, status, files with the sha256 before
                          and after it, and the probe's evidence (as `apply` records it)
    series                the patch files in apply order, one a line (FlashInfer first)
    0001-<recipe-id>.patch  one per exported recipe, in `git format-patch` form

Paths in every patch are relative to the folder that holds the package (`sglang/...`,
`flashinfer/...`): site-packages in an image, `python/` in an SGLang clone, the root of a
FlashInfer clone. `git apply`, `git am` and `patch -p1` from there give exactly the bytes
`sm120patch apply` gives on the same release. Export is a dry run (`transaction.plan_many`):
nothing is written to the trees. The output is reproducible: no wall clock (the date is
`$SOURCE_DATE_EPOCH`, else 1970), no machine paths, sorted keys.

Reading is strict, like recipes and journals: a damaged or hand-edited bundle is refused with
one line naming the file, the key and the fix, never half-trusted.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sm120patch import __version__
from sm120patch.errors import UserError
from sm120patch.status import EXPORTED, bundle_status  # noqa: F401 (EXPORTED: the bundle modules' name for it)

FORMAT = "sm120patch-bundle"
SCHEMA = 1
MANIFEST = "manifest.json"
SERIES = "series"
PACKAGES = ("flashinfer", "sglang")  # apply order: FlashInfer first
AUTHOR = "sm120patch <noreply@sm120patch.invalid>"
# where each package's parent folder is inside a git clone of that package
CLONE_DIRECTORY = {"sglang": "python", "flashinfer": ""}
APPLY_FROM = {
    "sglang": "the folder that holds sglang/: site-packages in an image, python/ in an SGLang clone",
    "flashinfer": "the folder that holds flashinfer/: site-packages in an image, the root of a FlashInfer clone",
}
HOW_TO_APPLY = [
    "with sm120patch (journaled, probed again on this machine, `sm120patch rollback` works): "
    "sm120patch apply --bundle BUNDLE [PATH...]",
    "without it: from the folder that holds the packages (see targets[].apply_from), each patch of "
    'series in order: while read p; do git apply "BUNDLE/$p" || break; done < BUNDLE/series '
    '(or patch -p1 < "BUNDLE/$p")',
    "in a git clone of SGLang run git apply --directory=python from the clone's root: git apply "
    "inside a clone's subfolder skips files outside it without an error",
    "check a node before serving: sm120patch preflight --bundle BUNDLE",
]
_PATCH_NAME = re.compile(r"\d{4}-[A-Za-z0-9][A-Za-z0-9._-]*\.patch")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


class BundleError(UserError):
    """A bundle folder is missing, damaged, or not for this tree."""


# --- the bundle as data ------------------------------------------------------------------------


@dataclass(frozen=True)
class FileChange:
    path: str  # relative to the folder that holds the package: sglang/srt/...
    before: str  # sha256 before this recipe
    after: str  # sha256 after it

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class BundleRecipe:
    id: str
    package: str
    title: str
    why: str
    status: str  # exported, or the plan's status (status.IN_BUNDLE: every one but applicable)
    reason: str
    proof: str  # the probe's one-line verdict ("" when none ran)
    patch: str | None  # file name in the bundle, for exported recipes
    patch_sha256: str | None
    recipe_sha256: str
    versions: str
    arch: list[str]
    needs: list[str]
    files: list[FileChange] = field(default_factory=list)
    evidence: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # export writes, and the reader accepts, the same words (an untested recipe once made a
        # manifest its own reader refused)
        bundle_status(self.status)

    @property
    def exported(self) -> bool:
        return self.patch is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # `files` as FileChange.to_dict gives them


@dataclass
class BundleTarget:
    package: str
    version: str
    apply_from: str
    clone_directory: str  # the package's parent inside a clone of it ("python" for SGLang)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class Bundle:
    dir: Path
    tool_version: str
    arch: list[str]
    probe_level: str
    targets: list[BundleTarget]
    flashinfer: dict[str, Any] | None  # the FlashInfer the probes judged when it was made
    recipes: list[BundleRecipe]

    @property
    def series(self) -> list[str]:
        return [r.patch for r in self.recipes if r.patch is not None]

    @property
    def exported(self) -> list[BundleRecipe]:
        return [r for r in self.recipes if r.exported]

    def target(self, package: str) -> BundleTarget | None:
        return next((t for t in self.targets if t.package == package), None)

    def net_files(self, package: str | None = None) -> dict[str, tuple[str, str]]:
        """path -> (sha256 of the release's bytes, sha256 once the whole series is applied)."""
        out: dict[str, tuple[str, str]] = {}
        for r in self.exported:
            if package and r.package != package:
                continue
            for f in r.files:
                out[f.path] = (out[f.path][0] if f.path in out else f.before, f.after)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "schema": SCHEMA,
            "tool_version": self.tool_version,
            "arch": self.arch,
            "probe_level": self.probe_level,
            "targets": [t.to_dict() for t in self.targets],
            "flashinfer": self.flashinfer,
            "series": self.series,
            "recipes": [r.to_dict() for r in self.recipes],
            "how_to_apply": HOW_TO_APPLY,
        }


# --- git format-patch text -----------------------------------------------------------------------


def patch_date() -> str:
    """RFC 2822 date of `$SOURCE_DATE_EPOCH` (reproducible builds), else the epoch: never the clock."""
    raw = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    seconds = int(raw) if raw.isdigit() else 0
    t = time.gmtime(seconds)
    clock = f"{t.tm_hour:02}:{t.tm_min:02}:{t.tm_sec:02}"
    return f"{_DAYS[t.tm_wday]}, {t.tm_mday} {_MONTHS[t.tm_mon - 1]} {t.tm_year} {clock} +0000"


def git_blob_id(data: bytes) -> str:
    """The object id git gives these bytes (the `index` line, so `git am -3` can find them)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def file_diff(path: str, before: bytes, after: bytes, mode: str = "100644") -> str:
    """One file's git diff, with the `index` line `git format-patch --full-index` writes."""
    from sm120patch.planning.diffs import unified

    text = unified(path, before.decode("utf-8"), after.decode("utf-8"))
    if not text:
        return ""
    head, rest = text.split("\n", 1)
    return f"{head}\nindex {git_blob_id(before)}..{git_blob_id(after)} {mode}\n{rest}"


def diffstat(diff: str) -> str:
    """`git diff --stat` lines for a diff (what format-patch puts between `---` and the diff)."""
    rows: list[tuple[str, int, int]] = []
    in_hunk = False
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            rows.append((line.split(" b/", 1)[-1], 0, 0))
            in_hunk = False
        elif line.startswith("@@"):
            in_hunk = True
        elif in_hunk and line.startswith("+"):
            name, add, rem = rows[-1]
            rows[-1] = (name, add + 1, rem)
        elif in_hunk and line.startswith("-"):
            name, add, rem = rows[-1]
            rows[-1] = (name, add, rem + 1)
    if not rows:
        return ""
    width = max(len(n) for n, _, _ in rows)
    digits = max(len(str(a + r)) for _, a, r in rows)
    biggest = max(a + r for _, a, r in rows)
    scale = min(1.0, 50 / biggest) if biggest else 1.0
    out = []
    for name, add, rem in rows:
        bar = "+" * (max(1, round(add * scale)) if add else 0) + "-" * (max(1, round(rem * scale)) if rem else 0)
        out.append(f" {name:<{width}} | {add + rem:>{digits}} {bar}")
    adds, rems = sum(a for _, a, _ in rows), sum(r for _, _, r in rows)
    summary = f" {len(rows)} file{'s' if len(rows) != 1 else ''} changed"
    if adds:
        summary += f", {adds} insertion{'s' if adds != 1 else ''}(+)"
    if rems:
        summary += f", {rems} deletion{'s' if rems != 1 else ''}(-)"
    return "\n".join([*out, summary]) + "\n"


def _safe_body(text: str) -> str:
    """Lines that `git am` or `patch` would take for the start of a diff are indented."""
    out = []
    for line in text.splitlines():
        if line.startswith(("---", "+++ ", "*** ", "diff ", "Index:", "From ")):
            line = "  " + line
        out.append(line.rstrip())
    return "\n".join(out)


def _subject(text: str) -> str:
    if text.isascii():
        return text
    from email.header import Header

    return Header(text, "utf-8").encode()


def format_patch(number: int, total: int, subject: str, body: str, diff: str) -> str:
    """A `git format-patch` message: `git am`, `git apply` and `patch -p1` all take it."""
    subject_line = f"[PATCH {number}/{total}] {subject}" if total > 1 else f"[PATCH] {subject}"
    text = (
        f"From: {AUTHOR}\n"
        f"Date: {patch_date()}\n"
        f"Subject: {_subject(subject_line)}\n"
        "MIME-Version: 1.0\n"
        "Content-Type: text/plain; charset=UTF-8\n"
        "Content-Transfer-Encoding: 8bit\n"
        "\n"
        f"{_safe_body(body)}\n"
        "---\n"
        f"{diffstat(diff)}\n"
        f"{diff}"
        "-- \n"
        f"sm120patch {__version__}\n"
        "\n"
    )
    commit = hashlib.sha1(text.encode("utf-8")).hexdigest()  # stands in for the commit id: same text, same id
    return f"From {commit} Mon Sep 17 00:00:00 2001\n{text}"


def diff_section(patch_text: str) -> str:
    """The unified diff inside a patch file (from the first `diff --git` to the signature)."""
    start = patch_text.find("\ndiff --git ")
    if start < 0:
        return ""
    body = patch_text[start + 1 :]
    end = body.rfind("\n-- \n")
    return body[: end + 1] if end >= 0 else body
