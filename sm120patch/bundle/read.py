"""Reading a bundle, strictly: a damaged or hand-edited one is refused with one line naming
the file, the key and the fix, never half-trusted (the format: bundle.py)."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from sm120patch.bundle.format import (
    _PATCH_NAME,
    EXPORTED,
    FORMAT,
    MANIFEST,
    PACKAGES,
    SCHEMA,
    SERIES,
    Bundle,
    BundleError,
    BundleRecipe,
    BundleTarget,
    FileChange,
)
from sm120patch.errors import UserError
from sm120patch.hashing import sha256
from sm120patch.status import IN_BUNDLE

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


def _fail(path: Path, key: str, problem: str, fix: str) -> BundleError:
    from sm120patch.catalogue.datafile import one_line

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
    from sm120patch.probes.rungs import LEVELS

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
    if r["status"] not in IN_BUNDLE:  # the vocabulary export writes from (status.py)
        raise _fail(
            mpath, f"{key}.status", f"unknown status {r['status']!r}", f"use one of {', '.join(sorted(IN_BUNDLE))}"
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
