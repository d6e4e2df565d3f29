"""`sm120patch export`: a dry run of the plan, written as a bundle (the format: bundle.py)."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sm120patch import __version__
from sm120patch.catalogue.datafile import one_line
from sm120patch.hints import rollback_command

if TYPE_CHECKING:
    from sm120patch.catalogue.recipes import Recipe
    from sm120patch.engine.pipeline import RunSettings
    from sm120patch.planning.plan import RecipePlan
    from sm120patch.planning.targets import Target
    from sm120patch.probes.recipe_probe import ProbeResult

from sm120patch.bundle.format import (
    _PATCH_NAME,
    APPLY_FROM,
    CLONE_DIRECTORY,
    EXPORTED,
    FORMAT,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    SCHEMA,
    SERIES,
    Bundle,
    BundleError,
    BundleRecipe,
    BundleTarget,
    FileChange,
    file_diff,
    format_patch,
)
from sm120patch.hashing import sha256

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
    from sm120patch.engine.journal import Journal

    for t in targets:
        journal = Journal.open(t.root)
        mine = [a["id"] for a in journal.applied if a.get("package", t.package) == t.package]
        if mine or journal.data.get("pending"):
            raise BundleError(
                f"{t.root}: sm120patch has changed this {t.package} tree ({', '.join(mine) or 'an interrupted run'}); "
                f"a bundle starts from the release's own bytes: run `{rollback_command(t.root)}` first, "
                "or export from a fresh copy"
            )
        if t.version is None:
            raise BundleError(
                f"{t.package_dir}: the {t.package} version is unknown ({t.version_source}); a bundle is tied "
                "to one release: export from a wheel, site-packages or a tagged clone"
            )


def _kept_plans(
    targets: Sequence[Target], recipes: Sequence[Recipe], run: RunSettings, plans: list[RecipePlan]
) -> None:
    """Without the blocked recipes a shared file's bytes chain differently: plan the kept ones
    again on their own, as `apply` does, so each patch applies on top of the previous one."""
    from sm120patch.engine import tree as engine
    from sm120patch.planning.plan import APPLICABLE, BLOCKED

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


def build(
    targets: Sequence[Target], recipes: Sequence[Recipe], run: RunSettings
) -> tuple[Bundle, dict[str, str], list]:
    """Plan (probes at `run.level`), and turn each kept recipe into a patch. Returns the bundle
    (its `dir` unset), the patch texts by file name, and the plans (for the report)."""
    from sm120patch.engine.pipeline import RunSettings, ordered, plan_many
    from sm120patch.planning.plan import APPLICABLE

    targets = ordered(targets)
    _check_clean(targets)
    seen: dict[str, ProbeResult] = {}

    def capturing(archs: Sequence[Any], fi: Any, level: str) -> Any:
        inner = run.make_probe(archs, fi, level)
        return None if inner is None else CapturingProbe(inner, seen)

    plans = plan_many(
        targets, recipes, RunSettings(run.archs, run.fi, run.level, capturing, run.allow_untested, exclude=run.exclude)
    )
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
    """A plan's reason names files from the tree's root (`python/sglang/...` in a clone, `srt/...`
    when PATH is the package folder); a bundle names them from the package's parent, as its
    patches do, whatever the layout."""
    if t is None or t.package_dir.parent == t.root:
        return reason
    if t.package_dir == t.root:  # PATH was the package folder: prefix each path of a file in it

        def prefixed(m: re.Match[str]) -> str:
            return f"{t.package}/{m[1]}" if (t.package_dir / m[1]).is_file() else m[1]

        return _PATH_TOKEN.sub(prefixed, reason)
    prefix = t.package_dir.parent.relative_to(t.root).as_posix()
    return reason.replace(f"{prefix}/{t.package}/", f"{t.package}/")


_PATH_TOKEN = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]+\.\w+)")


def _body(entry: BundleRecipe, t: Target, run: RunSettings, number: int, total: int, name: str) -> str:
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


def check_output(out: Path, trees: Sequence[Path] = (), *, force: bool = False) -> Path:
    """Refuse, before anything is planned, written or removed, an output folder export may not
    use: a symlink, a file, a folder inside a tree being exported (export writes nothing there),
    or a non-empty folder, which `force` may replace only when it is a bundle export wrote
    and holds nothing else. Returns `out`, absolute."""
    shown = out
    out = out.expanduser().absolute()
    if out.is_symlink():
        raise BundleError(
            f"{shown}: is a symlink ({os.readlink(out)}); give the folder itself (-o {out.resolve()}) or a new one"
        )
    if out.exists() and not out.is_dir():
        raise BundleError(f"{shown}: is a file; give a folder for the bundle (-o DIR)")
    real = out.resolve()
    for root in trees:
        if real.is_relative_to(root.resolve()):
            raise BundleError(
                f"{shown}: is inside {root}, a tree being exported (export writes nothing into it); "
                "choose a folder outside it"
            )
    if not out.is_dir() or not any(out.iterdir()):
        return out
    if not force:
        mine = _not_ours(out) is None
        hint = "pass --force to replace the earlier bundle" if mine else "choose an empty folder or remove it yourself"
        raise BundleError(f"{shown}: exists and is not empty; {hint}")
    why = _not_ours(out)
    if why is not None:
        raise BundleError(
            one_line(
                f"{shown}: --force replaces only a bundle sm120patch wrote, and {why}; "
                "choose an empty folder or remove it yourself"
            )
        )
    return out


def _not_ours(folder: Path) -> str | None:
    """Why `folder` is not a bundle export wrote, holding only its files (None: it is one)."""
    from sm120patch.bundle.read import check_shape, read_plain

    try:
        data = json.loads(read_plain(folder / MANIFEST, MAX_MANIFEST_BYTES, ""))
    except (BundleError, ValueError, RecursionError):
        return f"its {MANIFEST} is missing, not a plain file or not JSON"
    try:
        check_shape(folder / MANIFEST, data)
    except BundleError:
        return f"its {MANIFEST} is not an sm120patch bundle manifest (format {FORMAT!r}, schema {SCHEMA})"
    series = data["series"]
    if not all(isinstance(n, str) and _PATCH_NAME.fullmatch(n) for n in series):
        return f"its {MANIFEST} lists a patch that is not a patch file name"
    allowed = {MANIFEST, SERIES, *series}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name not in allowed:
            return f"it holds {entry.name!r}, which its {MANIFEST} does not list"
        if entry.is_symlink():
            return f"{entry.name} is a symlink, which export never writes"
        if not entry.is_file(follow_symlinks=False):
            return f"{entry.name} is not a plain file"
    return None


def write(
    bundle: Bundle, patches: dict[str, str], out: Path, *, force: bool = False, trees: Sequence[Path] = ()
) -> Path:
    """Write the bundle into `out` (absent or empty; with `force`, a bundle export wrote),
    through a temporary folder beside it, so a reader never sees half a bundle and a failed
    export leaves the earlier bundle as it was. Of the earlier bundle only the files its
    manifest lists are removed, each checked again as it goes, never a tree."""
    shown = out.expanduser()
    out = check_output(out, trees, force=force)
    tmp: Path | None = None
    old: Path | None = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o777 & ~mask)  # mkdtemp makes it 0700: the bundle is for the image's users too
        for name, text in patches.items():
            (tmp / name).write_bytes(text.encode("utf-8"))
        (tmp / SERIES).write_text("".join(f"{n}\n" for n in bundle.series), encoding="utf-8")
        manifest = json.dumps(bundle.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        (tmp / MANIFEST).write_bytes(manifest.encode("utf-8"))
        if out.is_dir() and any(out.iterdir()):
            check_output(out, trees, force=force)  # again: the plan took a while
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
            os.rename(out, old)  # onto the empty folder just made: no name another run could hold
            _move_in(tmp, out, old, shown)
        else:
            os.rename(tmp, out)  # onto an empty folder or none; a folder filled meanwhile: ENOTEMPTY
        tmp = None
    except OSError as e:
        if old is not None and old.is_dir() and not any(old.iterdir()):
            old.rmdir()  # made, but the bundle was never moved into it
        raise BundleError(
            f"{shown}: cannot write the bundle ({e.strerror or e}); what was there is as it was: "
            "choose a folder you may write, on a disk with space"
        ) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if old is not None:
        _remove_bundle(old, shown)
    bundle.dir = shown
    return out


def _move_in(tmp: Path, out: Path, old: Path, shown: Path) -> None:
    """The new bundle into place; if that fails, the earlier one (moved to `old`) back."""
    try:
        os.rename(tmp, out)
    except OSError:
        try:
            os.rename(old, out)
        except OSError as e:
            raise BundleError(
                f"{shown}: the new bundle could not be moved in, nor the earlier one back ({e.strerror}); "
                f"the earlier bundle is at {old}: move it back yourself"
            ) from None
        raise


def _remove_bundle(old: Path, shown: Path) -> None:
    """Remove the earlier bundle, moved aside: its plain files that a bundle holds, then the
    folder. Anything else (put there while export ran) stays, and the folder is named."""
    left = []
    for entry in os.scandir(old):
        ours = entry.name in (MANIFEST, SERIES) or _PATCH_NAME.fullmatch(entry.name)
        if ours and entry.is_file(follow_symlinks=False):
            os.unlink(entry.path)
        else:
            left.append(entry.name)
    if left:
        raise BundleError(
            one_line(
                f"{shown}: the bundle is written; the earlier one, moved to {old}, now holds "
                f"{', '.join(sorted(left))}, which export did not write: look at it and remove it yourself"
            )
        )
    old.rmdir()


# --- one entry point for the CLI ---------------------------------------------------------------


def export(
    targets: Sequence[Target], recipes: Sequence[Recipe], run: RunSettings, out: Path, *, force: bool = False
) -> tuple[Bundle, list]:
    """Plan the targets and write the bundle to `out`; nothing in the targets is written."""
    trees = [t.root for t in targets]
    check_output(out, trees, force=force)  # before the plan: a refusal costs no probe
    bundle, patches, plans = build(targets, recipes, run)
    write(bundle, patches, out, force=force, trees=trees)
    return bundle, plans
