"""Targets: find the SGLang/FlashInfer source tree inside a path and read its version.

The version always comes from the tree itself (version file, pyproject, dist-info,
`git describe`), never from a guess, and the report says where it came from.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sm120patch.errors import TargetError, UserError

# The folder at a tree's root where sm120patch keeps its state (the journal: `engine/journal.py`).
# Defined here, with the rest of what a tree's layout is, so planning never reads the engine.
DIRNAME = ".sm120patch"

# package -> a sub-folder that only that package's source tree has
_MARKERS = {"sglang": "srt", "flashinfer": "jit"}
# where a package sits relative to a git clone's root
_CLONE_LAYOUT = {"sglang": "python/sglang", "flashinfer": "flashinfer"}


@dataclass(frozen=True)
class Target:
    package: str
    package_dir: Path  # the folder holding __init__.py
    root: Path  # the tree we own edits in: the git root, or the folder the user named
    version: str | None
    version_source: str
    is_git: bool

    def rel(self, path: Path) -> str:
        """A path as shown in diffs and the journal: relative to root, POSIX."""
        return path.relative_to(self.root).as_posix()

    def to_dict(self) -> dict[str, object]:
        return {
            "package": self.package,
            "version": self.version,
            "version_source": self.version_source,
            "root": str(self.root),
            "package_dir": str(self.package_dir),
            "git": self.is_git,
        }


def _is_package(d: Path, package: str) -> bool:
    return d.name == package and (d / "__init__.py").is_file() and (d / _MARKERS[package]).is_dir()


def discover(path: Path, package: str | None = None) -> list[Target]:
    """Every known package tree in `path`: a clone, an unpacked wheel, site-packages or the package itself."""
    if not path.exists():
        raise TargetError(f"{path}: no such file or folder; give the path of an SGLang/FlashInfer clone or install")
    if not path.is_dir():
        raise TargetError(f"{path}: is a file; give the folder that holds the sglang/ or flashinfer/ package")
    path = path.resolve()
    packages = [package] if package else list(_MARKERS)
    found: list[Target] = []
    for pkg in packages:
        for candidate in (path / _CLONE_LAYOUT[pkg], path / pkg, path):
            if _is_package(candidate, pkg):
                found.append(_target(pkg, candidate, path))
                break
    if not found:
        wanted = package or "sglang or flashinfer"
        raise TargetError(
            f"{path}: holds no {wanted} package (looked for python/sglang/, sglang/, flashinfer/); "
            "point at a git clone, an unpacked wheel, site-packages, or use --installed"
        )
    return found


def installed(package: str) -> Target:
    """The copy the current interpreter would import, located without importing it."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise TargetError(
            f"{package}: not installed for {sys.executable}; pass --python EXE (the server's interpreter), "
            "give a PATH, or pip install it"
        )
    pkg_dir = Path(next(iter(spec.submodule_search_locations))).resolve()
    return _target(package, pkg_dir, pkg_dir.parent)


# the PyPI distributions a package comes from (their dist-info sits beside it in site-packages)
DISTS = {"sglang": ("sglang",), "flashinfer": ("flashinfer_python", "flashinfer-python")}


def targets_for(
    paths: Sequence[Path], installed_flag: bool, package: str | None, python: str | None = None
) -> list[Target]:
    """Every package tree the paths hold (an SGLang clone and a FlashInfer tree, or both in one
    site-packages), each once; or, with --installed, what this Python (or --python EXE) imports."""
    if installed_flag:
        if paths:
            raise UserError("give PATH or --installed, not both")
        found = []
        for pkg in [package] if package else ["sglang", "flashinfer"]:
            try:
                found.append(installed_for(python, pkg))
            except UserError:
                if package or pkg == "sglang":
                    raise
        return found
    if not paths:
        raise UserError("missing PATH: give the folder of an SGLang/FlashInfer clone or install, or --installed")
    out: dict[Path, Target] = {}
    for path in paths:
        for t in discover(path, package):
            out.setdefault(t.package_dir, t)
    return list(out.values())


def installed_for(python: str | None, package: str) -> Target:
    """The package `python` imports (this interpreter by default), located without importing it."""
    if python is None:
        return installed(package)
    import subprocess

    code = f"import importlib.util as u; s = u.find_spec({package!r}); print(list(s.submodule_search_locations)[0])"
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30)
    except OSError as e:
        raise UserError(f"--python {python}: cannot run it ({e.strerror}); give the server's interpreter") from None
    if r.returncode != 0:
        raise UserError(f"{python}: {package} is not installed there; give PATH or another --python")
    pkg = Path(r.stdout.strip().splitlines()[-1])
    return discover(pkg.parent, package)[0]


def dist_info(package: str, folder: Path) -> Path | None:
    """The `<dist>-<version>.dist-info` pip made for `package` in `folder`, if any."""
    for dist in DISTS[package]:
        hits = sorted(folder.glob(f"{dist}-*.dist-info"))
        if hits:
            return hits[-1]
    return None


def dist_version(package: str, root: Path) -> str | None:
    """The installed distribution's version, read from its dist-info METADATA (None: no dist-info).
    pip rewrites it on every install, so it tells a reinstall or another release apart."""
    meta = dist_info(package, root)
    if meta is None or not (meta / "METADATA").is_file():
        return None
    m = re.search(r"^Version:\s*(\S+)", (meta / "METADATA").read_text(errors="replace"), re.M)
    return m.group(1) if m else None


def install_root(package: str, pkg_dir: Path, root: Path) -> Path:
    """One tree root per install, whatever folder the user named: a package folder inside
    site-packages (it has a dist-info beside it) belongs to site-packages, so `apply SITE/sglang`
    and `apply SITE` share one journal. A journal an older sm120patch kept in the package folder
    itself stays where it is (its paths are relative to that folder)."""
    legacy = (pkg_dir / DIRNAME / "journal.json").is_file()
    if root == pkg_dir and dist_info(package, pkg_dir.parent) is not None and not legacy:
        return pkg_dir.parent
    return root


def _target(package: str, pkg_dir: Path, root: Path) -> Target:
    git_root = _git_root(package, pkg_dir, root)
    root = git_root if git_root is not None else install_root(package, pkg_dir, root)
    version, source = read_version(package, pkg_dir, root if git_root else None)
    return Target(package, pkg_dir, root, version, source, git_root is not None)


def _git_root(package: str, pkg_dir: Path, root: Path) -> Path | None:
    """The clone's root when the tree is a clone: `.git` in the folder the user named,
    or the named package folder sits at the clone layout (python/sglang) under one.
    Never further up: a venv inside some repo is not a clone of SGLang."""
    if (root / ".git").exists():
        return root
    depth = len(Path(_CLONE_LAYOUT[package]).parts)
    up = pkg_dir.parents[depth - 1] if len(pkg_dir.parents) >= depth else None
    if up is not None and (up / ".git").exists() and (up / _CLONE_LAYOUT[package]) == pkg_dir:
        return up
    return None


def read_version(package: str, pkg_dir: Path, git_root: Path | None) -> tuple[str | None, str]:
    """(version, where it came from). Each source is read as text; nothing is imported."""
    for name in ("version.py", "_version.py", "_build_meta.py", "__init__.py"):
        f = pkg_dir / name
        v = _assigned_version(f)
        if v:
            return v, str(f)
    for f in (pkg_dir / "version.txt", pkg_dir.parent / "version.txt"):
        if f.is_file():
            v = f.read_text(errors="replace").strip().splitlines()[0:1]
            if v and re.fullmatch(r"\d[\w.+-]*", v[0]):
                return v[0], str(f)
    for meta in sorted(pkg_dir.parent.glob(f"{package}*.dist-info/METADATA")) + sorted(
        pkg_dir.parent.glob(f"{package}-python*.dist-info/METADATA")
    ):
        m = re.search(r"^Version:\s*(\S+)", meta.read_text(errors="replace"), re.M)
        if m:
            return m.group(1), str(meta)
    pyproject = pkg_dir.parent / "pyproject.toml"
    if pyproject.is_file():
        m = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(errors="replace"), re.M)
        if m:
            return m.group(1), str(pyproject)
    if git_root is not None:
        from sm120patch.gitops import describe

        m = re.search(r"v?(\d+\.\d+\.\d+(?:\.post\d+|rc\d+)?)", describe(git_root) or "")
        if m:
            return m.group(1), "git describe"
    return None, "not found"


def _assigned_version(f: Path) -> str | None:
    """`__version__ = "x"` (or `version = "x"`) at module level, read by AST."""
    if not f.is_file():
        return None
    import ast

    try:
        tree = ast.parse(f.read_bytes())
    except (SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id in ("__version__", "version"):
                    return node.value.value
    return None
