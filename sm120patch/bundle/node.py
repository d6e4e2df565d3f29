"""What a machine does with a bundle: apply it through the engine, or check a node against it.

`apply --bundle` hands the engine the bundle's own patches as in-memory recipes (one diff edit
each, `needs`/`arch` from the manifest), so the bytes written are exactly the bundle's, even if
the catalogue changed since, and the journal, the probe, `rollback`, `status` and `stale` all
work as for `apply`. It refuses, before anything is written, a tree of another release or one
whose bytes are not those the bundle was made from.

`preflight --bundle` is for a GPU node (an init container): the installed packages must be the
bundle's releases holding the bundle's patched bytes, and each exported recipe's kernels are
probed again for this node's GPUs on the FlashInfer this node imports. Anything else is a
mismatch (exit 1) with the recipe and the command that takes it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sm120patch import hints
from sm120patch.bundle.format import Bundle, BundleError, BundleRecipe, diff_section
from sm120patch.hashing import sha256

if TYPE_CHECKING:
    from sm120patch.arch import Arch
    from sm120patch.catalogue.recipes import Recipe
    from sm120patch.planning.targets import Target


class FileState(str, Enum):
    """What a file the bundle changes holds on this node (closed, like `Status`)."""

    PATCHED = "patched"  # the bundle's final bytes
    UNPATCHED = "unpatched"  # the bytes the bundle was made from
    CHANGED = "changed"  # neither: another build, or edited
    MISSING = "missing"

    __str__ = str.__str__  # the word, on every Python (as Status)
    __format__ = str.__format__


class CheckState(str, Enum):
    """A recipe's verdict in `preflight --bundle` (closed, like `Status`)."""

    OK = "ok"  # the node holds its bytes, covers its arch and has its kernels
    MISMATCH = "mismatch"  # one of those does not hold: `problems` says which, `rollback` how back
    NOT_EXPORTED = "not-exported"  # the bundle carries no patch for it (blocked or not applicable at export)

    __str__ = str.__str__
    __format__ = str.__format__


OK, MISMATCH, NOT_EXPORTED = CheckState.OK, CheckState.MISMATCH, CheckState.NOT_EXPORTED


def same_version(a: str | None, b: str) -> bool:
    from packaging.version import InvalidVersion, Version

    if a is None:
        return False
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def bundle_targets(bundle: Bundle, found: Sequence[Target]) -> list[Target]:
    """The bundle's packages among `found`, in the bundle's order; refuses a missing one."""
    out = []
    for bt in bundle.targets:
        t = next((t for t in found if t.package == bt.package), None)
        if t is None:
            where = ", ".join(str(t.root) for t in found) or "the given paths"
            raise BundleError(
                f"{bundle.dir}: made for {bt.package} {bt.version}, and {where} holds no {bt.package}; "
                f"give its folder too (or the site-packages that holds both)"
            )
        out.append(t)
    return out


def version_problems(bundle: Bundle, targets: Sequence[Target]) -> list[str]:
    out = []
    for bt in bundle.targets:
        for t in targets:
            if t.package == bt.package and not same_version(t.version, bt.version):
                out.append(
                    f"{t.package_dir}: {t.package} {t.version or '(version unknown)'}, but the bundle {bundle.dir} "
                    f"was made for {bt.package} {bt.version}"
                )
    return out


def _rel_to_parent(t: Target, path: str) -> Path:
    return t.package_dir.parent / path


def file_states(bundle: Bundle, t: Target) -> dict[str, FileState]:
    """Each file the bundle changes in `t`, and what it holds."""
    out = {}
    for path, (before, after) in bundle.net_files(t.package).items():
        p = _rel_to_parent(t, path)
        if not p.is_file():
            out[path] = FileState.MISSING
            continue
        now = sha256(p.read_bytes())
        out[path] = FileState.PATCHED if now == after else FileState.UNPATCHED if now == before else FileState.CHANGED
    return out


def check_for_apply(bundle: Bundle, targets: Sequence[Target]) -> None:
    """Refuse (one line, exit 2) a tree the bundle was not made from; nothing is written."""
    from sm120patch.engine.journal import Journal

    problems = version_problems(bundle, targets)
    if problems:
        raise BundleError(f"{problems[0]}; install that release, or export a bundle from this tree")
    for t in targets:
        for path in bundle.net_files(t.package):
            _plain_file_in(t, path, bundle)
    for t in targets:
        journal = Journal.open(t.root)
        held = set(journal.applied_ids()) & {r.id for r in bundle.exported if r.package == t.package}
        if held:  # applied before (by this bundle or the same recipes): the engine says `applied`
            continue
        for path, state in file_states(bundle, t).items():
            if state is FileState.PATCHED:
                raise BundleError(
                    f"{_rel_to_parent(t, path)}: already holds the bundle's patched bytes, but no sm120patch journal "
                    f"records it (patched with git apply or patch?); apply --bundle starts from the release's own "
                    f"bytes: reinstall {t.package}=={t.version}, or check it with `sm120patch preflight --bundle`"
                )
            if state is not FileState.UNPATCHED:
                raise BundleError(
                    f"{_rel_to_parent(t, path)}: {state}, not the bytes the bundle {bundle.dir} was made from "
                    f"(another build of {t.package} {t.version}, or edited); reinstall the release, or export a "
                    "bundle from this tree with `sm120patch export`"
                )


def _plain_file_in(t: Target, path: str, bundle: Bundle) -> None:
    """`path` (a plain relative path, read.py checked) must be a regular file reached without a
    symlink from the folder holding the package: a link would carry the write elsewhere."""
    import stat

    here = t.package_dir.parent
    parts = path.split("/")
    for n, part in enumerate(parts, 1):
        here = here / part
        try:
            mode = here.lstat().st_mode
        except OSError as e:
            raise BundleError(
                f"{here}: {e.strerror.lower() if e.strerror else 'unreadable'}, and the bundle {bundle.dir} patches "
                f"{path}; give the tree of {t.package} {t.version} the bundle was made from"
            ) from None
        if stat.S_ISLNK(mode):
            raise BundleError(
                f"{here}: is a symlink, and the bundle {bundle.dir} patches {path} through it; apply --bundle writes "
                "only plain files inside the tree: replace the link with the files, or apply to the folder it points to"
            )
        if n < len(parts) and not stat.S_ISDIR(mode) or n == len(parts) and not stat.S_ISREG(mode):
            raise BundleError(
                f"{here}: not a {'folder' if n < len(parts) else 'plain file'}, and the bundle {bundle.dir} patches "
                f"{path}; give the tree of {t.package} {t.version} the bundle was made from"
            )


def as_recipes(bundle: Bundle, scratch: Path) -> list[Recipe]:
    """The exported recipes as engine recipes whose one edit is the bundle's patch (paths made
    relative to the package, as a recipe's diff is)."""
    from packaging.specifiers import SpecifierSet

    from sm120patch.arch import parse_arch
    from sm120patch.catalogue.recipes import Edit, Recipe

    out = []
    for r in bundle.exported:
        assert r.patch is not None
        # the text the reader checked (patch_targets): a file swapped since is never read
        text = diff_section(bundle.patch_texts[r.patch])
        prefix = f"{r.package}/"
        lines = []
        for line in text.splitlines(keepends=True):
            if line.startswith("diff --git "):
                line = line.replace(f" a/{prefix}", " a/", 1).replace(f" b/{prefix}", " b/", 1)
            elif line.startswith(("--- a/", "+++ b/")) and line[6:].startswith(prefix):
                line = line[:6] + line[6 + len(prefix) :]
            lines.append(line)
        diff = scratch / f"{Path(r.patch).stem}.diff"  # NNNN-<id>: read.py checked the name and id
        diff.write_text("".join(lines), encoding="utf-8", newline="")
        version = bundle.target(r.package).version  # type: ignore[union-attr]
        out.append(
            Recipe(
                id=r.id,
                package=r.package,
                title=r.title,
                why=r.why,
                versions=SpecifierSet(f"=={version}"),
                arch=tuple(parse_arch(a) for a in r.arch),
                edits=(Edit(name=r.patch, diff_path=diff),),
                path=bundle.dir / r.patch,
                sha256=r.recipe_sha256,
                needs=tuple(r.needs),
            )
        )
    return out


def bytes_match(bundle: Bundle, targets: Sequence[Target]) -> list[str]:
    """Files that do not hold the bundle's final bytes (after `apply --bundle` kept everything)."""
    return [
        f"{t.package_dir.parent / path}: {state}"
        for t in targets
        for path, state in file_states(bundle, t).items()
        if state is not FileState.PATCHED
    ]


# --- the node check ------------------------------------------------------------------------------


@dataclass
class RecipeCheck:
    id: str
    package: str
    state: CheckState
    reason: str
    problems: list[str] = field(default_factory=list)
    probe: list[dict[str, Any]] = field(default_factory=list)
    rollback: str | None = None

    def __post_init__(self) -> None:
        self.state = CheckState(self.state)  # a word outside the set is refused here

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "state": self.state.value}


def rollback_command(bundle: Bundle, r: BundleRecipe, t: Target) -> str:
    """How to take `r` back on this tree: through the journal when `apply --bundle` wrote it;
    else reverse its patch (and the later ones that touch the same files, last first)."""
    from sm120patch.engine.journal import Journal
    from sm120patch.errors import UserError

    try:
        held = r.id in Journal.open(t.root).applied_ids()
    except UserError:  # an unreadable journal: status and rollback say so themselves
        held = False
    if held:
        return hints.rollback_command(t.root, [r.id])
    chain = [r]
    touched = {f.path for f in r.files}
    exported = bundle.exported
    for later in exported[exported.index(r) + 1 :]:
        if touched & {f.path for f in later.files}:
            chain.append(later)
            touched |= {f.path for f in later.files}
    parent = t.package_dir.parent
    if t.is_git and parent != t.root:
        where, directory = t.root, parent.relative_to(t.root).as_posix()
    else:
        where, directory = parent, None
    patches = [bundle.dir / x.patch for x in reversed(chain) if x.patch]
    return hints.git_reverse_command(where, patches, directory)


def check_node(
    bundle: Bundle,
    targets: Sequence[Target],
    archs: Sequence[Arch],
    fi: Any,
    level: str,
) -> tuple[list[RecipeCheck], list[str]]:
    """Per recipe: does this node hold its bytes, cover its arch, and have its kernels?
    Returns the checks and the node-level problems (a package of another release)."""
    from sm120patch.probes.evidence import changes
    from sm120patch.probes.recipe_probe import RecipeProbe

    node_problems = version_problems(bundle, targets)
    by_package = {t.package: t for t in targets}
    wrong_release = {
        t.package for t in targets if (bt := bundle.target(t.package)) and not same_version(t.version, bt.version)
    }
    states = {t.package: file_states(bundle, t) for t in targets}
    probe = None if level == "none" else RecipeProbe(archs, fi, level)
    adapters: dict[str, Recipe] = {}
    checks = []
    for r in bundle.recipes:
        t = by_package[r.package]
        if not r.exported:
            checks.append(RecipeCheck(r.id, r.package, NOT_EXPORTED, f"{r.status} when exported: {r.reason}"))
            continue
        problems = []
        if r.package in wrong_release:
            made = bundle.target(r.package)
            problems.append(f"{r.package} {t.version} here, the bundle was made for {made.version if made else '?'}")
        bad = {f.path: states[r.package][f.path] for f in r.files if states[r.package][f.path] is not FileState.PATCHED}
        if bad:
            shown = ", ".join(f"{p} {s}" for p, s in sorted(bad.items()))
            problems.append(f"not the bundle's bytes: {shown}")
        other = [a for a in archs if a.name not in r.arch and not _covers(r.arch, a)]
        if other:
            problems.append(f"opens a gate for {', '.join(r.arch)}; this node has {', '.join(a.name for a in other)}")
        verdicts: list[dict[str, Any]] = []
        reason = "needs no kernels"
        if r.needs and not other:
            if probe is None:
                reason = "kernels not re-checked (--probe none)"
            else:
                recipe = adapters.setdefault(r.id, _probe_recipe(r))
                result = probe(recipe)
                verdicts = result.verdicts
                recorded = list((r.evidence or {}).get("verdicts") or [])
                moved = _differs(recorded, fi, changes)
                reason = result.reason + (f" ({'; '.join(moved)})" if moved else "")
                if not result.passed:
                    problems.append(result.reason + (f"; since export: {'; '.join(moved)}" if moved else ""))
        state = MISMATCH if problems else OK
        check = RecipeCheck(r.id, r.package, state, "; ".join(problems) if problems else reason, problems, verdicts)
        if problems:
            check.rollback = rollback_command(bundle, r, t)
        checks.append(check)
    return checks, node_problems


def _covers(names: Sequence[str], arch: Arch) -> bool:
    from sm120patch.arch import parse_arch

    return any(parse_arch(n) == arch for n in names)


def _probe_recipe(r: BundleRecipe) -> Recipe:
    """Enough of a recipe for the probe: its id and what it needs."""
    from packaging.specifiers import SpecifierSet

    from sm120patch.arch import parse_arch
    from sm120patch.catalogue.recipes import Recipe

    return Recipe(
        id=r.id, package=r.package, title=r.title, why=r.why, versions=SpecifierSet(),
        arch=tuple(parse_arch(a) for a in r.arch), edits=(), path=Path(r.patch or r.id),
        sha256=r.recipe_sha256, needs=tuple(r.needs),
    )  # fmt: skip


def _differs(recorded: Sequence[dict[str, Any]], fi: Any, changes: Any) -> list[str]:
    """How this node's FlashInfer differs from the one the bundle's proof read (version, files)."""
    if not getattr(fi, "found", False):
        return []
    out: list[str] = []
    for v in recorded:
        ev = dict(v.get("evidence") or {})
        ev["flashinfer"] = {**(ev.get("flashinfer") or {}), "location": fi.location}  # a node's paths differ
        out += [c for c in changes(ev, fi) if c not in out]
    return out
