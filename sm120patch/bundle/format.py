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
`sm120patch apply` gives on the same release. Export is a dry run (`pipeline.plan_many`):
nothing is written to the trees. The output is reproducible: no wall clock (the date is
`$SOURCE_DATE_EPOCH`, else 1970), no machine paths, sorted keys.

Reading is strict, like recipes and journals: a damaged or hand-edited bundle is refused with
one line naming the file, the key and the fix, never half-trusted. A bundle is input to a tool
that runs as root in image builds, so a re-hashed patch proves nothing by its sha256: each patch
must touch exactly the files its manifest entry lists (`patch_targets` reads the whole file as
`git apply` would), every path a plain one under the package, every file of the bundle a plain
file of a bounded size. `export --force` replaces only a folder holding such a bundle and
nothing else.
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
# lines that `git apply` or `patch` would take for a diff's start, wherever they stand in a patch file
_HEADER_WORDS = ("diff ", "--- ", "+++ ", "*** ", "Index:", "@@", "GIT binary patch", "Binary files ")
# what a bundle's files may weigh: a real manifest is tens of KB, a real patch a few KB (a
# FlashInfer backport tens); far more is a damaged or hostile bundle, refused before it is read
MAX_MANIFEST_BYTES = 16 << 20
MAX_PATCH_BYTES = 16 << 20
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
    # patch file name -> the text the reader checked (apply uses these bytes, not a second read)
    patch_texts: dict[str, str] = field(default_factory=dict, repr=False)

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
    """Lines that `git am` or `patch` would take for the start of a diff are indented (and the
    reader, `patch_targets`, refuses a patch whose message holds one unindented)."""
    out = []
    for line in text.splitlines():
        if line.startswith(("---", "From ", *_HEADER_WORDS)):
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


# --- what a patch file touches ------------------------------------------------------------------

_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_INDEX = re.compile(r"index [0-9a-f]{7,64}\.\.[0-9a-f]{7,64}(?: 100644| 100755)?")
# extended git headers export never writes, each with what it would do
_REFUSED_HEADERS = {
    "new file mode": "creates a file",
    "deleted file mode": "deletes a file",
    "rename from": "renames a file",
    "rename to": "renames a file",
    "copy from": "copies a file",
    "copy to": "copies a file",
    "old mode": "changes a file's mode",
    "new mode": "changes a file's mode",
    "similarity index": "renames or copies a file",
    "dissimilarity index": "rewrites a file",
    "GIT binary patch": "holds a binary patch",
    "Binary files ": "holds a binary patch",
}


class PatchShapeError(ValueError):
    """A patch file that is not what export writes (the message says what it would do instead)."""


def patch_targets(text: str) -> list[str]:
    """Every path a patch file would touch with `git apply`, `git am` or `patch -p1`, in order.

    The whole file is read, message and signature too (git apply reads them all): every diff in it
    must be one export writes, `diff --git a/P b/P`, `index`, `--- a/P`, `+++ b/P`, then hunks
    whose line counts are followed exactly, so a removed line that reads like a header stays a
    line. A rename, copy, creation, deletion, mode change or binary patch, a header outside a
    diff, or a path named twice raises PatchShapeError: the check is about what the file does,
    so anything a patch tool could read another way is refused, never guessed at."""
    lines = text.split("\n")
    targets: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff "):
            path, i = _file_header(lines, i)
            if path in targets:
                raise PatchShapeError(f"patches {path} twice")
            targets.append(path)
            i = _hunks(lines, i, path)
            continue
        if line.startswith(_HEADER_WORDS):
            raise PatchShapeError(f"line {i + 1} reads as a diff header outside a diff ({line[:60]!r})")
        i += 1
    return targets


def _file_header(lines: list[str], i: int) -> tuple[str, int]:
    """`diff --git a/P b/P`, an `index` line, `--- a/P`, `+++ b/P`: the path, and where the hunks start."""
    first = lines[i]
    head = lines[i : i + 4]
    for n, line in enumerate(head[1:], 1):
        for word, what in _REFUSED_HEADERS.items():
            if line.startswith(word):
                raise PatchShapeError(f"line {i + n + 1} {what} ({line[:60]!r}); export never writes that")
    if len(head) < 4 or not head[2].startswith("--- ") or not head[3].startswith("+++ "):
        raise PatchShapeError(f"line {i + 1}: {first[:60]!r} is not followed by index, ---, +++ lines")
    old, new = head[2][4:], head[3][4:]
    if "/dev/null" in (old, new):
        raise PatchShapeError(f"line {i + 1}: creates or deletes a file ({first[:60]!r}); export never writes that")
    if not (old.startswith("a/") and new.startswith("b/") and old[2:] == new[2:]):
        raise PatchShapeError(f"line {i + 3}: --- {old[:40]!r} and +++ {new[:40]!r} are not one file's a/ and b/")
    path = new[2:]
    if first != f"diff --git a/{path} b/{path}" or not _INDEX.fullmatch(head[1]):
        raise PatchShapeError(f"line {i + 1}: {first[:60]!r} is not the header export writes for {path[:60]!r}")
    return path, i + 4


def _hunks(lines: list[str], i: int, path: str) -> int:
    """Step over a file's hunks, counting their lines; where the next thing starts."""
    if i >= len(lines) or not lines[i].startswith("@@"):
        raise PatchShapeError(f"line {i + 1}: the diff of {path[:60]!r} has no hunk")
    while i < len(lines) and lines[i].startswith("@@"):
        m = _HUNK.match(lines[i])
        if not m:
            raise PatchShapeError(f"line {i + 1}: {lines[i][:60]!r} is not a hunk header")
        old = int(m[2]) if m[2] is not None else 1
        new = int(m[4]) if m[4] is not None else 1
        i += 1
        while old > 0 or new > 0:
            if i >= len(lines):
                raise PatchShapeError(f"the diff of {path[:60]!r} ends inside a hunk")
            line = lines[i]
            kind = line[:1]
            if kind in (" ", ""):  # git takes an empty line for an empty context line
                old, new = old - 1, new - 1
            elif kind == "-":
                old -= 1
            elif kind == "+":
                new -= 1
            elif kind != "\\":
                raise PatchShapeError(f"line {i + 1}: {line[:60]!r} inside a hunk of {path[:60]!r}")
            if old < 0 or new < 0:
                raise PatchShapeError(f"line {i + 1}: a hunk of {path[:60]!r} is longer than its header says")
            i += 1
        while i < len(lines) and lines[i].startswith("\\"):  # "\ No newline at end of file"
            i += 1
    return i
