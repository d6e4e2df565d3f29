"""Reading a bundle, strictly: a damaged or hand-edited one is refused with one line naming
the file, the key and the fix, never half-trusted (the format: bundle.py)."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from sm120patch.bundle.format import (
    _PATCH_NAME,
    EXPORTED,
    FORMAT,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    MAX_PATCH_BYTES,
    PACKAGES,
    SCHEMA,
    SERIES,
    Bundle,
    BundleError,
    BundleRecipe,
    BundleTarget,
    FileChange,
    PatchShapeError,
    patch_targets,
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


_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")  # what a catalogue file name can hold
_MAX_PATH = 1024  # characters of a path in a bundle; a package's deepest file is ~150
_MAX_PARTS = 32


def _safe_path(rel: str, package: str) -> bool:
    """A plain relative path under `package/`, spelt one way only (no `.`, `..`, `//`, `\\`,
    control characters), short enough that every file call on it answers."""
    p = PurePosixPath(rel)
    return (
        bool(rel)
        and len(rel) <= _MAX_PATH
        and len(p.parts) <= _MAX_PARTS
        and "\\" not in rel
        and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in rel)
        and not p.is_absolute()
        and p.as_posix() == rel
        and not {".", ".."} & set(rel.split("/"))
        and all(len(part.encode("utf-8", "surrogatepass")) <= 255 for part in p.parts)
        and len(p.parts) > 1
        and p.parts[0] == package
    )


def read_plain(path: Path, limit: int, fix: str) -> bytes:
    """A bundle file's bytes: a regular file (never through a symlink, never a FIFO or device,
    which would hang or read elsewhere) of at most `limit` bytes, opened once, checked on the
    open file itself so nothing can be swapped in between."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise BundleError(f"{path}: missing; {fix}") from None
    except OSError as e:
        if e.errno == errno.ELOOP or path.is_symlink():
            raise BundleError(f"{path}: is a symlink; a bundle holds plain files: {fix}") from None
        raise BundleError(f"{path}: unreadable ({e.strerror}); {fix}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise BundleError(f"{path}: not a plain file; a bundle holds plain files: {fix}")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise BundleError(f"{path}: over {limit >> 20} MiB, far more than a bundle file holds; {fix}")
    return data


def _strings(path: Path, key: str, raw: list[Any]) -> list[str]:
    for i, v in enumerate(raw):
        if not isinstance(v, str) or not v:
            raise _fail(path, f"{key}[{i}]", "is not a non-empty string", "export the bundle again")
    return list(raw)


def _no_control_characters(mpath: Path, data: Any) -> None:
    """No string of the manifest holds a control character but a newline or tab: they are printed
    to terminals (ids, reasons, proofs) and written into the journal, and a lone surrogate
    (`"\\ud800"` in JSON) cannot be written at all. Export never writes either."""
    todo: list[tuple[str, Any]] = [("", data)]
    while todo:
        key, v = todo.pop()
        if isinstance(v, dict):
            todo += [(f"{key}.{k}" if key else str(k), x) for k, x in v.items()]
            todo += [(f"{key}.{k}" if key else str(k), k) for k in v]
        elif isinstance(v, list):
            todo += [(f"{key}[{i}]", x) for i, x in enumerate(v)]
        elif isinstance(v, str) and any(_unprintable(c) for c in v):
            raise _fail(mpath, key, "holds a control character or a lone surrogate", "export the bundle again")


def _unprintable(c: str) -> bool:
    n = ord(c)
    return (n < 0x20 and c not in "\n\t") or 0x7F <= n <= 0x9F or 0xD800 <= n <= 0xDFFF


def check_shape(mpath: Path, data: Any) -> dict[str, Any]:
    """A manifest's format, schema and top-level keys and types (what export writes), or BundleError."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _fail(mpath, "format", f"not {FORMAT!r}", "this is not an sm120patch bundle manifest")
    if data.get("schema") != SCHEMA:
        raise _fail(
            mpath,
            "schema",
            f"{data.get('schema')!r}, this sm120patch reads {SCHEMA}",
            "export it again with this version",
        )
    return _table(mpath, "", data, _TOP)


def read(folder: Path) -> Bundle:
    """Load and check a bundle: manifest shape, series, every patch's sha256, the byte chain."""
    from sm120patch.arch import parse_arch
    from sm120patch.probes.rungs import LEVELS

    folder = folder.expanduser().absolute()  # commands printed for a node name it from anywhere
    mpath = folder / MANIFEST
    if not folder.is_dir():
        raise BundleError(f"{folder}: no such folder; give the folder `sm120patch export -o DIR` wrote")
    if not mpath.exists() and not mpath.is_symlink():
        raise BundleError(f"{mpath}: missing; {folder} is not a bundle (make one with `sm120patch export -o DIR`)")
    blob = read_plain(mpath, MAX_MANIFEST_BYTES, "export the bundle again")
    try:
        data = json.loads(blob)
    except (ValueError, RecursionError) as e:
        raise BundleError(f"{mpath}: unreadable ({e}); export the bundle again") from None
    check_shape(mpath, data)
    _no_control_characters(mpath, data)
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
    texts: dict[str, str] = {}
    recipes = [
        _read_recipe(folder, mpath, i, raw, {t.package for t in targets}, texts)
        for i, raw in enumerate(data["recipes"])
    ]
    bundle = Bundle(
        folder, data["tool_version"], list(data["arch"]), data["probe_level"], targets, data["flashinfer"], recipes,
        texts,
    )  # fmt: skip
    _check_series(folder, mpath, data, bundle)
    _check_chain(mpath, bundle)
    return bundle


def _read_recipe(
    folder: Path, mpath: Path, i: int, raw: Any, packages: set[str], texts: dict[str, str]
) -> BundleRecipe:
    from sm120patch.arch import parse_arch

    key = f"recipes[{i}]"
    r = _table(mpath, key, raw, _RECIPE)
    if not _ID.fullmatch(r["id"]):  # it names files (scratch diffs) and journal entries: never a path
        raise _fail(mpath, f"{key}.id", f"{r['id'][:80]!r} is not a recipe id", "export the bundle again")
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
        if not _PATCH_NAME.fullmatch(name) or not name.endswith(f"-{r['id']}.patch"):
            raise _fail(
                mpath, f"{key}.patch", f"{name[:80]!r} is not a patch file name of {r['id']}", "export the bundle again"
            )
        if name in texts:
            raise _fail(mpath, f"{key}.patch", f"{name} is the patch of two recipes", "export the bundle again")
        ppath = folder / name
        blob = read_plain(ppath, MAX_PATCH_BYTES, "copy the whole bundle folder, or export it again")
        if sha256(blob) != r["patch_sha256"]:
            raise BundleError(
                f"{ppath}: its sha256 is not the one manifest.json records (edited or damaged); export the bundle again"
            )
        if not files:
            raise _fail(mpath, f"{key}.files", "an exported recipe changes no file", "export the bundle again")
        texts[name] = _check_targets(ppath, blob, r["id"], [f.path for f in files])
    return BundleRecipe(
        r["id"], r["package"], r["title"], r["why"], r["status"], r["reason"], r["proof"], r["patch"],
        r["patch_sha256"], r["recipe_sha256"], r["versions"], list(r["arch"]), list(r["needs"]), files, r["evidence"],
    )  # fmt: skip


def _check_targets(ppath: Path, blob: bytes, rid: str, listed: list[str]) -> str:
    """The patch must touch exactly the files its manifest entry lists (each already a plain path
    under the package), so a patch edited to reach `../../victim.py`, `/etc/passwd` or a file the
    manifest does not name is refused before anything is written. Returns the patch's text."""
    from sm120patch.catalogue.datafile import one_line

    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        raise BundleError(f"{ppath}: not UTF-8 (export writes UTF-8); export the bundle again") from None
    try:
        touched = patch_targets(text)
    except PatchShapeError as e:
        raise BundleError(one_line(f"{ppath}: {e}; export the bundle again")) from None
    if sorted(touched) != sorted(listed):
        shown = ", ".join(repr(p[:80]) for p in touched) or "no file"
        raise BundleError(
            one_line(
                f"{ppath}: patches {shown}, but manifest.json lists {', '.join(sorted(listed))} for {rid} "
                "(the patch or the manifest was edited); export the bundle again"
            )
        )
    return text


def _check_series(folder: Path, mpath: Path, data: dict[str, Any], bundle: Bundle) -> None:
    spath = folder / SERIES
    blob = read_plain(spath, MAX_MANIFEST_BYTES, "copy the whole bundle folder, or export it again")
    listed = [line.strip() for line in blob.decode("utf-8", errors="replace").splitlines() if line.strip()]
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
