"""Recipes: one TOML file per gate under patches/<package>/, loaded and validated strictly.

A recipe is data only: nothing in it is imported or executed. Validation rejects
unknown keys, wrong types, bad PEP 440 specifiers and unknown transforms with a
one-line error naming the file and the key, so a typo never becomes a silent no-op.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from sm120patch.arch import Arch, parse_arch
from sm120patch.catalogue.datafile import check_table, fail, read_toml, str_list
from sm120patch.errors import RecipeError, UserError
from sm120patch.hashing import sha256

PACKAGES = ("sglang", "flashinfer")

_RECIPE_KEYS: dict[str, type | tuple[type, ...]] = {
    "id": str,
    "package": str,
    "title": str,
    "why": str,
    "versions": str,
    "arch": list,
    "needs": list,
    "crash_signatures": list,
    "advice": str,
    "changes_outputs": str,
    "min_tool_version": str,
    "tested": list,
    "edit": list,
    "taken": list,
}
_REQUIRED = ("id", "package", "title", "why", "versions", "arch", "edit")
# what a recipe may change in a server's greedy outputs, in the order `guard --canary` takes them back:
# "tactics" (an autotune or tactic choice, the flashinfer#4841 kind) before "kernels" (another kernel
# computes the same op: bf16 results may differ in late digits)
CHANGES_OUTPUTS = ("tactics", "kernels")
_EDIT_KEYS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "transform": str,
    "diff": str,
    "functions": list,
    "files": list,
    "optional": bool,
    "params": dict,
}
# [[taken]]: where the patched code takes the recipe's gate (sm120patch/planning/taken.py wraps the
# anchor so the server logs `sm120patch: <id> taken` once per process)
LOGS_IF = ("true", "false", "reached")  # [[taken]].logs_if: which value of the anchor takes the gate
_TAKEN_KEYS: dict[str, type | tuple[type, ...]] = {
    "functions": list,
    "anchor": str,
    "logs_if": str,
    "near": str,
    "when": str,
}


@dataclass(frozen=True)
class Edit:
    """One change inside a recipe: a named transform, or a unified diff."""

    name: str
    transform: str | None = None
    diff_path: Path | None = None
    functions: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    optional: bool = False
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Taken:
    """Where a recipe's gate is taken: `anchor`, an expression in `functions` of the patched code
    (only in statements whose own arm mentions `near`), evaluated when the gate's path runs."""

    functions: tuple[str, ...]
    anchor: str
    when: str
    near: str | None = None
    # which value of the anchor takes the gate: "true" (the SM12x test passed), "false" (a test for another GPU
    # failed: the path for the rest is taken) or "reached" (a value that is no test: the line when it is evaluated)
    logs_if: str = "true"


@dataclass(frozen=True)
class Recipe:
    id: str
    package: str
    title: str
    why: str
    versions: SpecifierSet
    arch: tuple[Arch, ...]
    edits: tuple[Edit, ...]
    path: Path
    sha256: str
    needs: tuple[str, ...] = ()
    crash_signatures: tuple[str, ...] = ()
    advice: str = ""
    tested: tuple[str, ...] = ()  # releases the tests cover, oldest first
    changes_outputs: str = ""  # "" | "tactics" | "kernels" (CHANGES_OUTPUTS)
    taken: tuple[Taken, ...] = ()  # where the patched code takes the gate (the taken line)

    @property
    def newest_tested(self) -> Version | None:
        return max((Version(v) for v in self.tested), default=None)

    def untested(self, version: str | None) -> bool:
        """True when `version` is newer than every release this recipe was tested on: its code
        may have moved in ways the recipe's structural matching does not see."""
        newest = self.newest_tested
        if newest is None or version is None:
            return False
        try:
            return Version(version) > newest
        except InvalidVersion:
            return False

    def covers_version(self, version: str | None) -> bool:
        if version is None:
            return False
        try:
            return self.versions.contains(Version(version), prereleases=True)
        except InvalidVersion:
            return False

    def covers_arch(self, arch: Arch) -> bool:
        return any(a.major == arch.major and a.minor == arch.minor for a in self.arch)


def default_recipe_dir() -> Path:
    """`$SM120PATCH_RECIPES`, else this package's own data (importlib.resources), never a
    `patches/` folder that merely happens to sit next to the installed package."""
    env = os.environ.get("SM120PATCH_RECIPES")
    if env:
        return Path(env)
    return Path(str(resources.files("sm120patch.patches")))


def _safe_hint(path: Path, key: str, hint: str) -> str:
    """File hints are package-relative POSIX paths: no absolute paths, no `..`."""
    p = PurePosixPath(hint)
    if p.is_absolute() or ".." in p.parts or "\\" in hint or hint.startswith("~"):
        raise fail(
            path,
            key,
            f"{hint!r} leaves the package",
            "give a path relative to the package, e.g. srt/layers/communicator.py",
        )
    return str(p)


def _load_edit(path: Path, i: int, raw: Any) -> Edit:
    from sm120patch.transforms import TRANSFORMS  # late: keeps the registry import one-way

    key = f"edit[{i}]"
    if not isinstance(raw, dict):
        raise fail(path, key, "is not a table", "write it as [[edit]]")
    check_table(path, key, raw, _EDIT_KEYS)
    transform, diff = raw.get("transform"), raw.get("diff")
    if (transform is None) == (diff is None):
        raise fail(path, key, "needs exactly one of 'transform' or 'diff'", "name a transform or a diff file")
    files = tuple(_safe_hint(path, f"{key}.files", f) for f in str_list(path, f"{key}.files", raw.get("files", [])))
    functions = str_list(path, f"{key}.functions", raw.get("functions", []))
    params = raw.get("params", {})
    diff_path = None
    if transform is not None:
        cls = TRANSFORMS.get(transform)
        if cls is None:
            raise fail(
                path,
                f"{key}.transform",
                f"unknown transform {transform!r}",
                f"use one of {', '.join(sorted(TRANSFORMS))}",
            )
        problem = cls.check_params(params, functions)
        if problem:
            raise fail(path, f"{key}.params", problem, cls.PARAMS_HELP)
    else:
        rel = _safe_hint(path, f"{key}.diff", diff)
        diff_path = path.parent / rel
        try:
            exists = diff_path.is_file()
        except OSError:  # e.g. a name longer than the filesystem allows
            exists = False
        if not exists:
            raise fail(
                path, f"{key}.diff", f"{rel} does not exist next to the recipe", "add the diff file or fix the name"
            )
    name = raw.get("name") or transform or f"diff-{i}"
    return Edit(name, transform, diff_path, functions, files, raw.get("optional", False), params)


def _one_expression(code: str) -> bool:
    """True when `code` parses as an expression as it is written (a line break only inside brackets)."""
    import ast

    try:
        ast.parse(code.strip(), mode="eval")
    except SyntaxError:
        return False
    return True


def _load_taken(path: Path, i: int, raw: Any) -> Taken:
    from sm120patch.transforms.base import norm_expr

    key = f"taken[{i}]"
    if not isinstance(raw, dict):
        raise fail(path, key, "is not a table", "write it as [[taken]]")
    check_table(path, key, raw, _TAKEN_KEYS)
    for k in ("functions", "anchor", "when"):
        if k not in raw:
            raise fail(path, f"{key}.{k}", "missing", "every [[taken]] needs functions, anchor and when")
    functions = str_list(path, f"{key}.functions", raw["functions"])
    if not functions:
        raise fail(path, f"{key}.functions", "is empty", "name the functions that hold the anchor")
    for k in ("anchor", "when", "near"):
        if k in raw and not raw[k].strip():
            raise fail(path, f"{key}.{k}", "is empty", "give a non-empty string")
    if norm_expr(raw["anchor"]) is None:
        raise fail(
            path, f"{key}.anchor", f"{raw['anchor']!r} is not a Python expression", "write e.g. 'is_sm120_supported()'"
        )
    if not _one_expression(raw["anchor"]):  # the patched code is searched with the anchor parsed as it is written
        raise fail(path, f"{key}.anchor", "breaks its line outside brackets", "write it on one line")
    logs_if = raw.get("logs_if", "true")
    if logs_if not in LOGS_IF:
        raise fail(path, f"{key}.logs_if", repr(logs_if), f"use one of {', '.join(LOGS_IF)}")
    return Taken(functions, raw["anchor"], raw["when"].strip(), raw.get("near"), logs_if)


def load_recipe(path: Path) -> Recipe:
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise RecipeError(f"{path}: cannot read ({e.strerror}); check the path and permissions") from None
    data = read_toml(path, blob, "the recipe")
    check_table(path, "", data, _RECIPE_KEYS)
    for k in _REQUIRED:
        if k not in data:
            raise fail(path, k, "missing", "every recipe needs " + ", ".join(_REQUIRED))
    rid = data["id"]
    if rid != path.stem:
        raise fail(path, "id", f"{rid!r} differs from the file name", f"rename the file to {rid}.toml or fix the id")
    if data["package"] not in PACKAGES:
        raise fail(path, "package", f"unknown package {data['package']!r}", f"use one of {', '.join(PACKAGES)}")
    try:
        versions = SpecifierSet(data["versions"])
    except InvalidSpecifier:
        raise fail(
            path, "versions", f"{data['versions']!r} is not a PEP 440 specifier", "write e.g. '>=0.5.5,<0.6'"
        ) from None
    arches = []
    for i, a in enumerate(str_list(path, "arch", data["arch"])):
        try:
            arches.append(parse_arch(a))
        except UserError:
            raise fail(path, f"arch[{i}]", f"{a!r} is not an architecture", "write e.g. sm_120") from None
    tested = _tested(path, data.get("tested", []), versions)
    changes = data.get("changes_outputs", "")
    if changes and changes not in CHANGES_OUTPUTS:
        raise fail(
            path, "changes_outputs", f"{changes!r} is not one of {', '.join(CHANGES_OUTPUTS)}", "write e.g. 'tactics'"
        )
    if not data["edit"]:
        raise fail(path, "edit", "is empty", "add at least one [[edit]]")
    edits = tuple(_load_edit(path, i, e) for i, e in enumerate(data["edit"]))
    taken = tuple(_load_taken(path, i, t) for i, t in enumerate(data.get("taken", [])))
    return Recipe(
        id=rid,
        package=data["package"],
        title=data["title"],
        why=data["why"].strip(),
        versions=versions,
        arch=tuple(arches),
        edits=edits,
        path=path,
        sha256=sha256(blob),
        needs=str_list(path, "needs", data.get("needs", [])),
        crash_signatures=str_list(path, "crash_signatures", data.get("crash_signatures", [])),
        advice=data.get("advice", "").strip(),
        tested=tested,
        changes_outputs=changes,
        taken=taken,
    )


def _tested(path: Path, raw: Any, versions: SpecifierSet) -> tuple[str, ...]:
    """`tested`: the releases the tests run this recipe on, each a version inside `versions`."""
    values = str_list(path, "tested", raw)
    parsed: list[Version] = []
    for i, v in enumerate(values):
        try:
            parsed.append(Version(v))
        except InvalidVersion:
            raise fail(path, f"tested[{i}]", f"{v!r} is not a version", "write e.g. '0.5.23'") from None
        if not versions.contains(parsed[-1], prereleases=True):
            raise fail(path, f"tested[{i}]", f"{v} is outside versions {versions}", "drop it or widen versions")
    if len(set(parsed)) != len(parsed):
        raise fail(path, "tested", "lists a release twice", "list each release once")
    return tuple(v for _, v in sorted(zip(parsed, values, strict=True)))


def load_recipes(directory: Path | None = None, package: str | None = None) -> list[Recipe]:
    """Every recipe under `directory` (default: the catalogue), sorted by package then id."""
    root = directory or default_recipe_dir()
    if not root.is_dir():
        raise UserError(f"{root}: recipe folder not found; pass --recipes DIR or set SM120PATCH_RECIPES")
    recipes = [load_recipe(p) for p in sorted(root.glob("*/*.toml"))]
    if not recipes:
        raise RecipeError(
            f"{root}: no recipes here (looked for <package>/<id>.toml); "
            "pass --recipes DIR or fix SM120PATCH_RECIPES, or reinstall sm120patch"
        )
    seen: dict[str, Path] = {}
    for r in recipes:
        if r.id in seen:
            raise RecipeError(f"{r.path}: id: {r.id!r} also used by {seen[r.id]}; ids must be unique")
        seen[r.id] = r.path
        if r.path.parent.name != r.package:
            raise RecipeError(
                f"{r.path}: package: {r.package!r} but the file is under {r.path.parent.name}/; "
                f"move it to patches/{r.package}/"
            )
    if package:
        recipes = [r for r in recipes if r.package == package]
    return sorted(recipes, key=lambda r: (r.package, r.id))
