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

import copy
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from sm120patch import __version__
from sm120patch.errors import UserError

if TYPE_CHECKING:
    from sm120patch.gatekeeper import ProbeResult
    from sm120patch.plan import RecipePlan
    from sm120patch.recipes import Recipe
    from sm120patch.targets import Target
    from sm120patch.transaction import Run

FORMAT = "sm120patch-bundle"
SCHEMA = 1
MANIFEST = "manifest.json"
SERIES = "series"
EXPORTED = "exported"  # the manifest's status for a recipe whose patch is in the series
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


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- the bundle as data ------------------------------------------------------------------------


@dataclass(frozen=True)
class FileChange:
    path: str  # relative to the folder that holds the package: sglang/srt/...
    before: str  # sha256 before this recipe
    after: str  # sha256 after it

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "before": self.before, "after": self.after}


@dataclass
class BundleRecipe:
    id: str
    package: str
    title: str
    why: str
    status: str  # exported, or the plan's status (blocked, satisfied, not-applicable, failed)
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

    @property
    def exported(self) -> bool:
        return self.patch is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "package": self.package,
            "title": self.title,
            "why": self.why,
            "status": self.status,
            "reason": self.reason,
            "proof": self.proof,
            "patch": self.patch,
            "patch_sha256": self.patch_sha256,
            "recipe_sha256": self.recipe_sha256,
            "versions": self.versions,
            "arch": self.arch,
            "needs": self.needs,
            "files": [f.to_dict() for f in self.files],
            "evidence": self.evidence,
        }


@dataclass
class BundleTarget:
    package: str
    version: str
    apply_from: str
    clone_directory: str  # the package's parent inside a clone of it ("python" for SGLang)

    def to_dict(self) -> dict[str, str]:
        return {
            "package": self.package,
            "version": self.version,
            "apply_from": self.apply_from,
            "clone_directory": self.clone_directory,
        }


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
    from sm120patch.diffs import unified

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


# --- export: a dry run, written as a bundle ----------------------------------------------------


class CapturingProbe:
    """A recipe probe that remembers each result, so the manifest records what `apply` would."""

    def __init__(self, inner: Any, seen: dict[str, ProbeResult]) -> None:
        self.inner, self.seen = inner, seen
        self.fi, self.archs, self.level = inner.fi, inner.archs, inner.level

    def __call__(self, recipe: Recipe) -> ProbeResult:
        result = self.inner(recipe)
        self.seen[recipe.id] = result
        return result


def portable_evidence(result: ProbeResult | None, level: str) -> dict[str, Any]:
    """`ProbeResult.record()` without this machine's paths (a bundle travels), with each verdict's reason."""
    if result is None:
        return {"level": level, "rung": "-", "verdicts": []} if level != "none" else {"level": "none"}
    rec = copy.deepcopy(result.record())
    for v, full in zip(rec["verdicts"], result.verdicts, strict=True):
        v["reason"] = full.get("reason", "")
        ev = v.get("evidence") or {}
        if isinstance(ev.get("flashinfer"), dict):
            ev["flashinfer"] = {"version": ev["flashinfer"].get("version")}
    return rec


def _check_clean(targets: Sequence[Target]) -> None:
    from sm120patch.journal import Journal

    for t in targets:
        journal = Journal.open(t.root)
        mine = [a["id"] for a in journal.applied if a.get("package", t.package) == t.package]
        if mine or journal.data.get("pending"):
            raise BundleError(
                f"{t.root}: sm120patch has changed this {t.package} tree ({', '.join(mine) or 'an interrupted run'}); "
                f"a bundle starts from the release's own bytes: run `sm120patch rollback {t.root}` first, "
                "or export from a fresh copy"
            )
        if t.version is None:
            raise BundleError(
                f"{t.package_dir}: the {t.package} version is unknown ({t.version_source}); a bundle is tied "
                "to one release: export from a wheel, site-packages or a tagged clone"
            )


def _kept_plans(targets: Sequence[Target], recipes: Sequence[Recipe], run: Run, plans: list[RecipePlan]) -> None:
    """Without the blocked recipes a shared file's bytes chain differently: plan the kept ones
    again on their own, as `apply` does, so each patch applies on top of the previous one."""
    from sm120patch import engine
    from sm120patch.plan import APPLICABLE, BLOCKED

    for t in targets:
        mine = [i for i, p in enumerate(plans) if p.target is not None and p.target.package_dir == t.package_dir]
        if not any(plans[i].status == BLOCKED for i in mine):
            continue
        keep = {plans[i].recipe.id for i in mine if plans[i].status == APPLICABLE}
        again = engine.replan(t, recipes, run.archs, {}, [plans[i] for i in mine], keep, run.allow_untested)
        for i, p in zip(mine, again, strict=True):
            plans[i] = p


def _verify_applies(parent_files: dict[str, bytes], diff: str, expected: dict[str, bytes]) -> None:
    """`git apply` the patch to a scratch copy of its before-bytes: it must give the planned bytes."""
    from sm120patch.gitops import diff_applies

    with tempfile.TemporaryDirectory(prefix="sm120patch-export-") as tmp:
        scratch = Path(tmp) / "tree"
        for rel, data in parent_files.items():
            (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
            (scratch / rel).write_bytes(data)
        patch = Path(tmp) / "p.diff"
        patch.write_text(diff, encoding="utf-8", newline="")
        ok = diff_applies(scratch, patch, check=False)
        got = {rel: (scratch / rel).read_bytes() for rel in expected} if ok else {}
    if got != expected:
        raise RuntimeError(f"export: git apply of the patch for {', '.join(sorted(expected))} does not give the plan")


def build(targets: Sequence[Target], recipes: Sequence[Recipe], run: Run) -> tuple[Bundle, dict[str, str], list]:
    """Plan (probes at `run.level`), and turn each kept recipe into a patch. Returns the bundle
    (its `dir` unset), the patch texts by file name, and the plans (for the report)."""
    from sm120patch.plan import APPLICABLE
    from sm120patch.transaction import Run, ordered, plan_many

    targets = ordered(targets)
    _check_clean(targets)
    seen: dict[str, ProbeResult] = {}

    def capturing(archs: Sequence[Any], fi: Any, level: str) -> Any:
        inner = run.make_probe(archs, fi, level)
        return None if inner is None else CapturingProbe(inner, seen)

    plans = plan_many(targets, recipes, Run(run.archs, run.fi, run.level, capturing, run.allow_untested))
    _kept_plans(targets, recipes, run, plans)
    by_dir = {t.package_dir: t for t in targets}
    total = sum(1 for p in plans if p.status == APPLICABLE)
    entries: list[BundleRecipe] = []
    patches: dict[str, str] = {}
    for p in plans:
        t = by_dir[p.target.package_dir] if p.target is not None else None
        r = p.recipe
        exported = p.status == APPLICABLE and t is not None
        entry = BundleRecipe(
            id=r.id,
            package=r.package,
            title=r.title,
            why=r.why,
            status=EXPORTED if exported else p.status,
            reason=_portable_reason(p.reason, t),
            proof=seen[r.id].reason if r.id in seen else "",
            patch=None,
            patch_sha256=None,
            recipe_sha256=r.sha256,
            versions=str(r.versions),
            arch=[a.name for a in r.arch],
            needs=list(r.needs),
            evidence=portable_evidence(seen.get(r.id), run.level) if (exported or r.id in seen) else None,
        )
        if exported:
            assert t is not None
            number = len(patches) + 1
            name = f"{number:04d}-{r.id}.patch"
            diffs, before_files, after_files = [], {}, {}
            for rel, (before, after) in sorted(p.changes.items()):
                path = (t.root / rel).relative_to(t.package_dir.parent).as_posix()
                disk = t.root / rel
                mode = "100755" if disk.exists() and disk.stat().st_mode & 0o111 else "100644"
                diffs.append(file_diff(path, before, after, mode))
                entry.files.append(FileChange(path, sha256(before), sha256(after)))
                before_files[path], after_files[path] = before, after
            diff = "".join(diffs)
            _verify_applies(before_files, diff, after_files)
            text = format_patch(number, total, r.title, _body(entry, t, run, number, total, name), diff)
            entry.patch, entry.patch_sha256 = name, sha256(text.encode("utf-8"))
            patches[name] = text
        entries.append(entry)
    fi = run.fi
    fi_info = None
    if fi is not None and getattr(fi, "found", False):
        fi_info = {
            "version": fi.version,
            "patched_by": [e.id for e in entries if e.package == "flashinfer" and e.exported],
        }
    bundle = Bundle(
        dir=Path(),
        tool_version=__version__,
        arch=[a.name for a in run.archs],
        probe_level=run.level,
        targets=[
            BundleTarget(t.package, t.version or "", APPLY_FROM[t.package], CLONE_DIRECTORY[t.package]) for t in targets
        ],
        flashinfer=fi_info,
        recipes=entries,
    )
    return bundle, patches, plans


def _portable_reason(reason: str, t: Target | None) -> str:
    """A plan's reason names files from the tree's root (`python/sglang/...` in a clone); a
    bundle names them from the package's parent, as its patches do, whatever the layout."""
    if t is None or t.package_dir.parent == t.root:
        return reason
    prefix = t.package_dir.parent.relative_to(t.root).as_posix()
    return reason.replace(f"{prefix}/{t.package}/", f"{t.package}/")


def _body(entry: BundleRecipe, t: Target, run: Run, number: int, total: int, name: str) -> str:
    """The commit message body: why, where it was made and checked, where to apply it, the proof."""
    clone = CLONE_DIRECTORY[t.package]
    lines = [
        entry.why,
        "",
        f"Recipe: {entry.id} (sha256 {entry.recipe_sha256[:16]}), for {t.package} {entry.versions} "
        f"on {', '.join(entry.arch)}",
        f"Made from: {t.package} {t.version}; this patch applies to that release only",
        f"Apply from: {APPLY_FROM[t.package]}",
        f"  git apply {name}    (or: patch -p1 < {name})",
    ]
    if clone:
        lines.append(f"  in a clone, from its root: git apply --directory={clone} {name}")
    lines.append(
        f"Bundle: patch {number} of {total}, sm120patch {__version__}, arch {', '.join(a.name for a in run.archs)}"
    )
    ev = entry.evidence or {}
    if not entry.needs:
        lines.append("Probe: needs no kernels")
    elif ev.get("level") == "none":
        lines.append("Probe: not run (--probe none)")
    else:
        versions = sorted(
            {str(((v.get("evidence") or {}).get("flashinfer") or {}).get("version")) for v in ev.get("verdicts") or []}
        )
        lines.append(f"Probe: {entry.proof} (asked: {ev.get('level')}); FlashInfer {', '.join(versions)}")
        for v in ev.get("verdicts") or []:
            lines.append(
                f"  {v.get('result')} {v.get('kernel')} {v.get('arch')} ({v.get('rung')} rung): {v.get('reason')}"
            )
    return "\n".join(lines)


def write(bundle: Bundle, patches: dict[str, str], out: Path, *, force: bool = False) -> Path:
    """Write the bundle into `out` (absent or empty; an earlier bundle only with `force`),
    through a temporary folder beside it, so a reader never sees half a bundle."""
    out = out.expanduser()
    if out.exists() and not out.is_dir():
        raise BundleError(f"{out}: is a file; give a folder for the bundle (-o DIR)")
    existing = out.is_dir() and any(out.iterdir())
    if existing and not (force and (out / MANIFEST).is_file()):
        hint = "pass --force to replace the earlier bundle" if (out / MANIFEST).is_file() else "pick a new folder"
        raise BundleError(f"{out}: exists and is not empty; {hint}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        for name, text in patches.items():
            (tmp / name).write_bytes(text.encode("utf-8"))
        (tmp / SERIES).write_text("".join(f"{n}\n" for n in bundle.series), encoding="utf-8")
        manifest = json.dumps(bundle.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        (tmp / MANIFEST).write_bytes(manifest.encode("utf-8"))
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    bundle.dir = out
    return out


# --- reading: strict ---------------------------------------------------------------------------

_TOP: dict[str, Any] = {
    "format": str,
    "schema": int,
    "tool_version": str,
    "arch": list,
    "probe_level": str,
    "targets": list,
    "flashinfer": (dict, type(None)),
    "series": list,
    "recipes": list,
    "how_to_apply": list,
}
_TARGET: dict[str, Any] = {"package": str, "version": str, "apply_from": str, "clone_directory": str}
_RECIPE: dict[str, Any] = {
    "id": str,
    "package": str,
    "title": str,
    "why": str,
    "status": str,
    "reason": str,
    "proof": str,
    "patch": (str, type(None)),
    "patch_sha256": (str, type(None)),
    "recipe_sha256": str,
    "versions": str,
    "arch": list,
    "needs": list,
    "files": list,
    "evidence": (dict, type(None)),
}
_FILE: dict[str, Any] = {"path": str, "before": str, "after": str}
_STATUSES = {EXPORTED, "blocked", "satisfied", "not-applicable", "failed", "stale", "reverted", "applied"}


def _fail(path: Path, key: str, problem: str, fix: str) -> BundleError:
    from sm120patch.datafile import one_line

    return BundleError(one_line(f"{path}: {key}: {problem}; {fix}"))


def _table(path: Path, where: str, raw: Any, keys: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _fail(path, where, "is not an object", "export the bundle again")
    for k in keys:
        if k not in raw:
            raise _fail(path, f"{where}.{k}" if where else k, "missing", "export the bundle again")
    for k, v in raw.items():
        key = f"{where}.{k}" if where else k
        if k not in keys:
            raise _fail(path, key, "unknown key", "export the bundle again with this sm120patch, or upgrade it")
        want = keys[k]
        if isinstance(v, bool) or not isinstance(v, want):
            raise _fail(path, key, f"is a {type(v).__name__}", "export the bundle again")
    return raw


def _is_sha(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


def _safe_path(rel: str, package: str) -> bool:
    p = PurePosixPath(rel)
    return (
        bool(rel)
        and "\\" not in rel
        and "\x00" not in rel
        and not p.is_absolute()
        and ".." not in p.parts
        and len(p.parts) > 1
        and p.parts[0] == package
    )


def _strings(path: Path, key: str, raw: list[Any]) -> list[str]:
    for i, v in enumerate(raw):
        if not isinstance(v, str) or not v:
            raise _fail(path, f"{key}[{i}]", "is not a non-empty string", "export the bundle again")
    return list(raw)


def read(folder: Path) -> Bundle:
    """Load and check a bundle: manifest shape, series, every patch's sha256, the byte chain."""
    from sm120patch.arch import parse_arch
    from sm120patch.rungs import LEVELS

    folder = folder.expanduser().absolute()  # commands printed for a node name it from anywhere
    mpath = folder / MANIFEST
    if not folder.is_dir():
        raise BundleError(f"{folder}: no such folder; give the folder `sm120patch export -o DIR` wrote")
    if not mpath.is_file():
        raise BundleError(f"{mpath}: missing; {folder} is not a bundle (make one with `sm120patch export -o DIR`)")
    try:
        data = json.loads(mpath.read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise BundleError(f"{mpath}: unreadable ({e}); export the bundle again") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _fail(mpath, "format", f"not {FORMAT!r}", "this is not an sm120patch bundle manifest")
    if data.get("schema") != SCHEMA:
        raise _fail(
            mpath,
            "schema",
            f"{data.get('schema')!r}, this sm120patch reads {SCHEMA}",
            "export it again with this version",
        )
    _table(mpath, "", data, _TOP)
    for i, a in enumerate(_strings(mpath, "arch", data["arch"])):
        try:
            parse_arch(a)
        except UserError:
            raise _fail(mpath, f"arch[{i}]", f"{a!r} is not an architecture", "export the bundle again") from None
    if data["probe_level"] not in LEVELS:
        raise _fail(mpath, "probe_level", f"{data['probe_level']!r} is not a rung", f"use one of {', '.join(LEVELS)}")
    targets = []
    for i, raw in enumerate(data["targets"]):
        t = _table(mpath, f"targets[{i}]", raw, _TARGET)
        if t["package"] not in PACKAGES:
            raise _fail(mpath, f"targets[{i}].package", f"unknown package {t['package']!r}", "use sglang or flashinfer")
        if any(x.package == t["package"] for x in targets):
            raise _fail(mpath, f"targets[{i}]", f"{t['package']} listed twice", "export the bundle again")
        if not t["version"]:
            raise _fail(mpath, f"targets[{i}].version", "is empty", "export from a tree whose version is known")
        targets.append(BundleTarget(t["package"], t["version"], t["apply_from"], t["clone_directory"]))
    if not targets:
        raise _fail(mpath, "targets", "is empty", "export the bundle again")
    recipes = [
        _read_recipe(folder, mpath, i, raw, {t.package for t in targets}) for i, raw in enumerate(data["recipes"])
    ]
    bundle = Bundle(
        folder, data["tool_version"], list(data["arch"]), data["probe_level"], targets, data["flashinfer"], recipes
    )
    _check_series(folder, mpath, data, bundle)
    _check_chain(mpath, bundle)
    return bundle


def _read_recipe(folder: Path, mpath: Path, i: int, raw: Any, packages: set[str]) -> BundleRecipe:
    from sm120patch.arch import parse_arch

    key = f"recipes[{i}]"
    r = _table(mpath, key, raw, _RECIPE)
    if r["package"] not in packages:
        raise _fail(mpath, f"{key}.package", f"{r['package']!r} is not among targets", "export the bundle again")
    if r["status"] not in _STATUSES:
        raise _fail(
            mpath, f"{key}.status", f"unknown status {r['status']!r}", f"use one of {', '.join(sorted(_STATUSES))}"
        )
    if (r["status"] == EXPORTED) != (r["patch"] is not None):
        raise _fail(mpath, f"{key}.patch", "an exported recipe has a patch, no other does", "export the bundle again")
    for j, a in enumerate(_strings(mpath, f"{key}.arch", r["arch"])):
        try:
            parse_arch(a)
        except UserError:
            raise _fail(mpath, f"{key}.arch[{j}]", f"{a!r} is not an architecture", "export the bundle again") from None
    _strings(mpath, f"{key}.needs", r["needs"])
    files = []
    for j, f in enumerate(r["files"]):
        f = _table(mpath, f"{key}.files[{j}]", f, _FILE)
        if not _safe_path(f["path"], r["package"]):
            raise _fail(
                mpath, f"{key}.files[{j}].path", f"{f['path']!r} is not a path inside {r['package']}/", "export again"
            )
        if not (_is_sha(f["before"]) and _is_sha(f["after"])):
            raise _fail(mpath, f"{key}.files[{j}]", "before/after are not sha256", "export the bundle again")
        files.append(FileChange(f["path"], f["before"], f["after"]))
    if r["patch"] is not None:
        name = r["patch"]
        if not _PATCH_NAME.fullmatch(name):
            raise _fail(mpath, f"{key}.patch", f"{name!r} is not a patch file name", "export the bundle again")
        ppath = folder / name
        if not ppath.is_file() or ppath.is_symlink():
            raise _fail(
                mpath, f"{key}.patch", f"{name} is missing from the bundle", "copy the whole folder, or export again"
            )
        if sha256(ppath.read_bytes()) != r["patch_sha256"]:
            raise BundleError(
                f"{ppath}: its sha256 is not the one manifest.json records (edited or damaged); export the bundle again"
            )
        if not files:
            raise _fail(mpath, f"{key}.files", "an exported recipe changes no file", "export the bundle again")
    return BundleRecipe(
        r["id"], r["package"], r["title"], r["why"], r["status"], r["reason"], r["proof"], r["patch"],
        r["patch_sha256"], r["recipe_sha256"], r["versions"], list(r["arch"]), list(r["needs"]), files, r["evidence"],
    )  # fmt: skip


def _check_series(folder: Path, mpath: Path, data: dict[str, Any], bundle: Bundle) -> None:
    spath = folder / SERIES
    if not spath.is_file():
        raise BundleError(f"{spath}: missing; copy the whole bundle folder, or export it again")
    listed = [line.strip() for line in spath.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    if listed != bundle.series or data["series"] != bundle.series:
        raise BundleError(
            f"{spath}: does not list the exported recipes' patches in manifest order "
            f"({', '.join(bundle.series) or 'none'}); export the bundle again"
        )
    ids = [r.id for r in bundle.recipes]
    if len(set(ids)) != len(ids):
        raise _fail(mpath, "recipes", "a recipe id is listed twice", "export the bundle again")
    packages = [r.package for r in bundle.exported]
    if packages != sorted(packages, key=PACKAGES.index):
        raise _fail(
            mpath, "series", "a FlashInfer patch comes after an SGLang one", "FlashInfer goes first: export again"
        )


def _check_chain(mpath: Path, bundle: Bundle) -> None:
    """Each patch starts from the bytes the previous one left (per file)."""
    last: dict[str, str] = {}
    for r in bundle.exported:
        for f in r.files:
            if f.path in last and last[f.path] != f.before:
                raise _fail(
                    mpath, f"{r.id}.files", f"{f.path} does not start where the previous patch left it", "export again"
                )
            last[f.path] = f.after


# --- one entry point for the CLI ---------------------------------------------------------------


def export(
    targets: Sequence[Target], recipes: Sequence[Recipe], run: Run, out: Path, *, force: bool = False
) -> tuple[Bundle, list]:
    """Plan the targets and write the bundle to `out`; nothing in the targets is written."""
    bundle, patches, plans = build(targets, recipes, run)
    write(bundle, patches, out, force=force)
    return bundle, plans
