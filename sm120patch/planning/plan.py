"""Plan: match every recipe against a target and compute exactly what would change.

`apply` writes what `plan` computed, through the journal; a dry run prints the
same plan. Recipes are applied in order, each on top of the files the previous
one produced, so two recipes may edit one file and the diffs compose.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from sm120patch.arch import Arch
from sm120patch.errors import TargetError

if TYPE_CHECKING:  # the CLI imports this module at start: what planning needs loads when it plans
    import libcst as cst

    from sm120patch.catalogue.recipes import Edit, Recipe
    from sm120patch.planning.targets import Target

from sm120patch.status import (  # noqa: F401 (the vocabulary, re-exported for the plan's users)
    APPLICABLE,
    APPLIED,
    BLOCKED,
    EXCLUDED,
    FAILED,
    NOT_APPLICABLE,
    REVERTED,
    SATISFIED,
    STALE,
    UNTESTED,
    Status,
)


class Outcome(str, Enum):
    """What one edit found: the closed set the plan and its readers (JSON, bundles) know."""

    CHANGED = "changed"
    SATISFIED = "satisfied"
    MISSING = "missing"
    ERROR = "error"

    __str__ = str.__str__  # the word, on every Python (as Status)
    __format__ = str.__format__


CHANGED, EDIT_SATISFIED, MISSING, ERROR = Outcome.CHANGED, Outcome.SATISFIED, Outcome.MISSING, Outcome.ERROR


class Unparsable(TargetError):
    """A file an edit must read does not decode or parse: that recipe fails with this line (the file,
    the line, the fix), the others go on."""


@dataclass
class EditResult:
    name: str
    outcome: Outcome
    files: list[str] = field(default_factory=list)
    note: str = ""

    def __post_init__(self) -> None:
        self.outcome = Outcome(self.outcome)  # an outcome outside the set is refused where it is made

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "outcome": self.outcome.value}


@dataclass
class RecipePlan:
    recipe: Recipe
    target: Target | None
    status: Status
    reason: str
    edits: list[EditResult] = field(default_factory=list)
    # rel path -> (bytes before this recipe, bytes after it)
    changes: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)
    probe: list[dict[str, object]] = field(default_factory=list)

    def __setattr__(self, name: str, value: object) -> None:
        # a status outside the vocabulary is refused where it is made (planned, read from the plan
        # cache, or changed by `mark`), never found later by a reader that does not know it
        object.__setattr__(self, name, Status.of(value) if name == "status" else value)

    def mark(self, status: Status, reason: str) -> None:
        """The one way a planned recipe's status changes (blocked by its probe, stale, applied,
        excluded, reverted): the status and the reason that says why, together."""
        self.status, self.reason = status, reason

    @property
    def files(self) -> list[str]:
        return sorted(self.changes)

    def diff(self) -> str:
        from sm120patch.planning.diffs import unified

        return "".join(
            unified(rel, a.decode("utf-8"), b.decode("utf-8")) for rel, (a, b) in sorted(self.changes.items())
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.recipe.id,
            "package": self.recipe.package,
            "status": self.status,
            "reason": self.reason,
            "files": self.files,
            "diff": self.diff(),
            "edits": [e.to_dict() for e in self.edits],
            "probe": self.probe,
        }


class Workspace:
    """The current text of every file touched so far, parsed at most once per version.

    Each parsed module is kept with the text it was parsed from (or generated), so a
    file several recipes edit is parsed once, and a recipe that is undone (missing,
    failed) hands the next one the module of the text it restored.
    """

    def __init__(self, target: Target, read: Callable[[Path], bytes] | None = None) -> None:
        self.target = target
        from sm120patch.planning.locate import PackageIndex

        self.index = PackageIndex(target)
        self._read = read or self.index.read
        self.text: dict[Path, str] = {}  # current text, after the edits so far
        self.base: dict[Path, str] = {}  # text as first read
        self._module: dict[Path, dict[str, cst.Module]] = {}  # path -> text -> its module
        self._generated: dict[Path, set[str]] = {}  # texts libcst generated (exactly module.code)
        self._bom: set[Path] = set()  # files that start with a UTF-8 BOM, which libcst would drop
        # `compile()` of a rewritten file: once per recipe and file, on the text the recipe leaves
        # (`plan_recipe`), unless `strict`: then after every edit, to name the edit that broke it
        self.strict = False
        self.uncompiled: set[Path] = set()

    def source(self, path: Path) -> str:
        if path not in self.text:
            raw = self._read(path)
            if raw.startswith(b"\xef\xbb\xbf"):
                self._bom.add(path)
                raw = raw[3:]
            try:
                self.text[path] = self.base[path] = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise Unparsable(f"{path}: not UTF-8; sm120patch only edits UTF-8 Python sources") from None
        return self.text[path]

    def encode(self, path: Path, text: str) -> bytes:
        """The bytes a text stands for in this file (its BOM put back)."""
        return (b"\xef\xbb\xbf" if path in self._bom else b"") + text.encode("utf-8")

    def module(self, path: Path) -> cst.Module:
        text = self.source(path)
        versions = self._module.setdefault(path, {})
        mod = versions.get(text)
        if mod is None:
            import libcst as cst

            try:
                mod = cst.parse_module(text)
            except cst.ParserSyntaxError as e:
                raise Unparsable(
                    f"{path}: does not parse (line {e.raw_line}: {e.message}); "
                    "restore the file from the release or your VCS"
                ) from None
            versions[text] = mod
        return mod

    def set(self, path: Path, code: str, module: cst.Module | None = None) -> None:
        """New text for `path`; `module` is its parse (or what generated it), when known."""
        self.text[path] = code
        if module is not None:
            self._module.setdefault(path, {})[code] = module

    def code(self, path: Path, module: cst.Module) -> str:
        """`module.code` for a new version of `path`. When the current text was itself
        generated (an earlier recipe changed the file), only the statements that differ
        are regenerated and spliced into it (`splice_code`); else the whole module."""
        text = self.text.get(path)
        if text is not None and text in self._generated.get(path, ()):
            from sm120patch.transforms.rewrite import splice_code

            old = self._module[path].get(text)
            code = splice_code(old, text, module) if old is not None else None
            if code is not None:
                if os.environ.get("SM120PATCH_CHECK_SPLICE"):  # tests: prove it equals the slow way
                    assert code == module.code, f"{path}: spliced code differs from module.code"
                self._generated[path].add(code)
                return code
        code = module.code
        self._generated.setdefault(path, set()).add(code)
        return code

    def snapshot(self) -> dict[Path, str]:
        return dict(self.text)

    def compiles(self, path: Path, code: str) -> SyntaxError | None:
        """None when `code` (a new text of `path`) compiles, or when the check waits for the
        recipe's end (not `strict`: `path` is then noted as not yet compiled)."""
        if not self.strict:
            self.uncompiled.add(path)
            return None
        try:
            compile(code, str(path), "exec")
        except SyntaxError as e:
            return e
        return None


def plan(
    target: Target,
    recipes: Sequence[Recipe],
    arch: Arch | Sequence[Arch],
    applied: dict[str, str] | None = None,
    read: Callable[[Path], bytes] | None = None,
    allow_untested: bool = False,
) -> list[RecipePlan]:
    """Plan every recipe of `target.package` on `target`.

    `applied` maps recipe ids the journal holds to a reason line; those report
    `applied` without being re-run. `read` overrides how file bytes are read
    (rollback replays recipes over original bytes). A recipe that would open its gate
    on a release newer than the newest it was tested on is `untested` (diff shown,
    nothing applied) unless `allow_untested`.
    """
    return _plan(Workspace(target, read), recipes, arch, applied, allow_untested=allow_untested)


def _plan(
    ws: Workspace,
    recipes: Sequence[Recipe],
    arch: Arch | Sequence[Arch],
    applied: dict[str, str] | None,
    *,
    allow_untested: bool = False,
) -> list[RecipePlan]:
    from sm120patch.transforms import TRANSFORMS

    target = ws.target
    # a package scan (an edit not in its hints) looks for every edit's needles at once
    ws.index.expect(
        n
        for r in recipes
        if r.package == target.package and not (applied and r.id in applied)
        for e in r.edits
        if e.transform is not None
        for n in TRANSFORMS[e.transform](e.params, e.functions).needles()
    )
    plans = []
    for recipe in recipes:
        if recipe.package != target.package:
            continue
        if applied and recipe.id in applied:
            plans.append(RecipePlan(recipe, target, APPLIED, applied[recipe.id]))
            continue
        plans.append(plan_recipe(ws, recipe, arch, allow_untested=allow_untested))
    return plans


def plan_recipe(
    ws: Workspace, recipe: Recipe, arch: Arch | Sequence[Arch], *, allow_untested: bool = False
) -> RecipePlan:
    """A recipe is for a machine only if it covers every arch on it (mixed GPUs share one tree).

    Every file the recipe's transforms rewrote must still compile. That is checked once per
    file, on the text the recipe leaves (a 250 KB server_args.py costs ~25 ms a `compile()`);
    when one does not compile, the recipe is planned again checking after every edit, which
    names the edit (the recipe is `failed`, nothing of it kept)."""
    before = ws.snapshot()
    ws.uncompiled = set()
    result = _plan_recipe(ws, recipe, arch, allow_untested=allow_untested)
    rels = {ws.target.rel(p): p for p in ws.uncompiled}
    for rel, (_, after) in sorted(result.changes.items()):
        if rel not in rels:
            continue
        try:
            compile(after.decode("utf-8").removeprefix("\ufeff"), str(rels[rel]), "exec")
        except SyntaxError:
            ws.text, ws.strict = before, True
            try:
                return _plan_recipe(ws, recipe, arch, allow_untested=allow_untested)
            finally:
                ws.strict = False
    return result


def _plan_recipe(
    ws: Workspace, recipe: Recipe, arch: Arch | Sequence[Arch], *, allow_untested: bool = False
) -> RecipePlan:
    target = ws.target
    archs = [arch] if isinstance(arch, Arch) else list(arch)
    other = [a for a in archs if not recipe.covers_arch(a)]
    if other:
        return RecipePlan(
            recipe,
            target,
            NOT_APPLICABLE,
            f"for {', '.join(a.name for a in recipe.arch)}, not {', '.join(a.name for a in other)}",
        )
    if target.version is not None and not recipe.covers_version(target.version):
        return RecipePlan(
            recipe, target, NOT_APPLICABLE, f"{target.package} {target.version} is outside {recipe.versions}"
        )
    before = ws.snapshot()
    results: list[EditResult] = []
    for edit in recipe.edits:
        res = _run_edit_contained(ws, edit)
        results.append(res)
        if res.outcome == ERROR:
            ws.text = before
            return RecipePlan(recipe, target, FAILED, f"edit {edit.name}: {res.note}", results)
    required = [r for r, e in zip(results, recipe.edits, strict=True) if not e.optional]
    missing = [r for r in required if r.outcome == MISSING]
    changes = {}
    for path, code in ws.text.items():
        old = before.get(path, ws.base[path])
        if code != old:
            changes[target.rel(path)] = (ws.encode(path, old), ws.encode(path, code))
    if missing:
        ws.text = before
        return RecipePlan(recipe, target, NOT_APPLICABLE, "; ".join(r.note for r in missing), results)
    version_note = "" if target.version else " (version unknown: matched by structure only)"
    if changes and recipe.taken:
        from sm120patch.planning.taken import add_taken, marked_files

        # the taken line is only ever written with the recipe's own edits: code that carries it has them,
        # though the edits may no longer recognise their work around it (a bundle applied with git apply)
        # (so a file that carries it is left as it is, per file: rollback replays a kept recipe over a
        # tree where some of its files are patched and others are back at the release's bytes)
        marked = set(marked_files(recipe, {rel: old for rel, (old, _) in changes.items()}))
        if marked:
            for path in [p for p in ws.text if target.rel(p) in marked]:
                ws.text[path] = before.get(path, ws.base[path])
            changes = {rel: c for rel, c in changes.items() if rel not in marked}
            if not changes:
                ws.text = before
                return RecipePlan(
                    recipe,
                    target,
                    SATISFIED,
                    f"already applied here: its taken line is in {', '.join(sorted(marked))}{version_note}",
                    results,
                )

        changed_paths = [p for p, code in ws.text.items() if code != before.get(p, ws.base[p])]
        version_note += add_taken(ws, recipe, changed_paths)
        changes = {}
        for path, code in ws.text.items():
            old = before.get(path, ws.base[path])
            if code != old:
                changes[target.rel(path)] = (ws.encode(path, old), ws.encode(path, code))
    if changes:
        where = ", ".join(sorted({f for r in results for f in r.files if r.outcome == CHANGED}))
        if recipe.untested(target.version):
            newest = recipe.tested[-1]
            if not allow_untested:
                # the diff is kept for the dry run; the workspace is not, so no later recipe builds on it
                ws.text = before
                return RecipePlan(
                    recipe,
                    target,
                    UNTESTED,
                    f"UNTESTED: {target.package} {target.version} is newer than {newest}, the newest release this "
                    f"recipe was tested on; its gate was found in {where} but nothing is applied. Read the diff, "
                    "then pass --allow-untested to apply it anyway",
                    results,
                    changes,
                )
            version_note += (
                f" (untested: {target.package} {target.version} is newer than {newest}; applied because "
                "--allow-untested)"
            )
        return RecipePlan(recipe, target, APPLICABLE, f"gate found in {where}{version_note}", results, changes)
    return RecipePlan(
        recipe,
        target,
        SATISFIED,
        f"this release already does it for {recipe.arch[0].name}: "
        + ", ".join(f"{r.name} in {', '.join(r.files)}" for r in results if r.outcome == EDIT_SATISFIED)
        + version_note,
        results,
    )


def _run_edit_contained(ws: Workspace, edit: Edit) -> EditResult:
    """One edit, its failure kept to its recipe (as LibCST's codemod runner keeps a failure to its
    file): a file that does not parse, or a transform that raises, is this edit's `error` with the
    reason; the other recipes are still planned. SM120PATCH_DEBUG=1 lets a transform's exception
    through, with its traceback, for the developer fixing it."""
    try:
        return run_edit(ws, edit)
    except Unparsable as e:
        return EditResult(edit.name, ERROR, [], str(e))
    except Exception as e:
        if os.environ.get("SM120PATCH_DEBUG"):
            raise
        frame = traceback.extract_tb(e.__traceback__)[-1]
        return EditResult(
            edit.name,
            ERROR,
            [],
            f"transform {edit.transform or 'diff'} raised {type(e).__name__}: {e} (at {Path(frame.filename).name}:"
            f"{frame.lineno}; a bug in sm120patch: rerun with SM120PATCH_DEBUG=1 and report it)",
        )


def run_edit(ws: Workspace, edit: Edit) -> EditResult:
    if edit.diff_path is not None:
        return _run_diff(ws, edit)
    assert edit.transform is not None
    from sm120patch.transforms import TRANSFORMS

    transform = TRANSFORMS[edit.transform](edit.params, edit.functions)
    idx = ws.index
    needles = transform.needles()
    # an optional edit (a part some releases lack) looks in its hinted files only: a package
    # scan to confirm each absence would cost more than the rest of the plan on a large tree
    searches = [idx.containing(needles, idx.hints(edit.files))]
    if not (edit.optional and edit.files):
        searches.append(None)
    for paths in searches:
        if paths is None:  # hints found nothing: search the package
            hinted = set(idx.hints(edit.files))
            paths = [p for p in idx.containing(needles) if p not in hinted]
        outcomes = []
        for path in paths:
            # needles can only tell "maybe"; parse to be sure
            if not any(n in ws.source(path) for n in needles):
                continue
            out = transform.apply(ws.module(path))
            if out.changed or out.satisfied or out.notes:
                outcomes.append((path, out))
        if not outcomes:
            continue
        rel = [ws.target.rel(p) for p, _ in outcomes]
        if transform.ONE_SITE and any(o.satisfied for _, o in outcomes):
            sat = [p for p, o in outcomes if o.satisfied]
            return _satisfied(ws, edit, sat)
        changed = [(p, o) for p, o in outcomes if o.module is not None]
        if transform.ONE_SITE:
            changed = changed[:1]
        for path, out in changed:
            assert out.module is not None
            code = ws.code(path, out.module)
            broken = ws.compiles(path, code)
            if broken is not None:
                return EditResult(
                    edit.name, ERROR, [ws.target.rel(path)], f"rewritten code does not compile ({broken})"
                )
            if out.notes:
                return EditResult(edit.name, ERROR, [ws.target.rel(path)], "; ".join(out.notes))
            ws.set(path, code, out.module)
        if changed:
            return EditResult(edit.name, CHANGED, [ws.target.rel(p) for p, _ in changed])
        notes = [n for _, o in outcomes for n in o.notes]
        if notes:
            return EditResult(edit.name, ERROR, rel, "; ".join(notes))
        return _satisfied(ws, edit, [p for p, _ in outcomes])
    return EditResult(edit.name, MISSING, [], transform.describe_missing())


def _satisfied(ws: Workspace, edit: Edit, paths: Sequence[Path]) -> EditResult:
    """An edit the code already does counts only when every name the gate's functions read is
    bound: a gate opened by hand that names an unbound `_is_sm120_supported` would raise NameError
    on SM12x, so it is an error, named with the fix (the same rule our own edits are held to)."""
    from sm120patch.transforms.bindings import unbound_reads

    rel = [ws.target.rel(p) for p in paths]
    for path in paths:
        missing = unbound_reads(ws.source(path), edit.functions)
        if missing:
            where = ws.target.rel(path)
            return EditResult(
                edit.name,
                ERROR,
                [where],
                f"{where} already opens this gate, but {', '.join(sorted(missing))} is bound nowhere in the "
                "module (NameError on the GPU the gate admits): bind it, or restore the file from the release "
                "and apply again",
            )
    return EditResult(edit.name, EDIT_SATISFIED, rel)


def _inside(package_dir: Path, rel: str) -> bool:
    """A diff's target is a plain relative path that stays in the package, symlinks resolved."""
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts or "\\" in rel:
        return False
    root = package_dir.resolve()
    return (package_dir / rel).resolve().is_relative_to(root)


def _run_diff(ws: Workspace, edit: Edit) -> EditResult:
    """Apply a unified diff (paths relative to the package) to a scratch copy with git.

    `git apply --check` first; a diff whose reverse applies is already in: satisfied.
    No fuzz: a diff that no longer fits is `missing`, never applied loosely.
    """
    assert edit.diff_path is not None
    patch = edit.diff_path.read_text()
    rels = sorted({line[6:].strip() for line in patch.splitlines() if line.startswith("+++ b/")})
    if not rels:
        return EditResult(edit.name, ERROR, [], f"{edit.diff_path}: no '+++ b/<path>' lines")
    outside = [r for r in rels if not _inside(ws.target.package_dir, r)]
    if outside:  # a recipe's diff writes inside the package it is for, never beside or above it
        return EditResult(
            edit.name,
            ERROR,
            [],
            f"{edit.diff_path}: patches {', '.join(map(repr, outside))}, outside the package; "
            "a recipe's diff names files relative to the package folder, without '..' or a leading '/'",
        )
    import tempfile

    from sm120patch.gitops import diff_applies

    with tempfile.TemporaryDirectory(prefix="sm120patch-diff-") as tmp:
        scratch = Path(tmp) / "tree"
        for rel in rels:
            src = ws.target.package_dir / rel
            if not src.is_file():
                return EditResult(edit.name, MISSING, [], f"{rel} not in this release")
            (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
            (scratch / rel).write_bytes(ws.source(src).encode("utf-8"))  # bytes: line ends kept
        patch_file = edit.diff_path
        if diff_applies(scratch, patch_file):
            diff_applies(scratch, patch_file, check=False)
            for rel in rels:
                ws.set(ws.target.package_dir / rel, (scratch / rel).read_bytes().decode("utf-8"))
            return EditResult(edit.name, CHANGED, [ws.target.rel(ws.target.package_dir / r) for r in rels])
        if diff_applies(scratch, patch_file, reverse=True):
            return EditResult(edit.name, EDIT_SATISFIED, [ws.target.rel(ws.target.package_dir / r) for r in rels])
    return EditResult(edit.name, MISSING, [], f"{edit.diff_path.name} does not apply to this release")
