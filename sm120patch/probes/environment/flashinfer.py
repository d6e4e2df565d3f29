"""Which FlashInfer will run, where it lives, and which prebuilt kernels sit beside it.

Probes must look at the FlashInfer the *server's* interpreter imports, not ours, and
must never import it (importing flashinfer imports torch and may touch CUDA). So an
installed copy is located in a subprocess of that interpreter with
`importlib.util.find_spec` and `importlib.metadata`, and a source tree (git clone,
unpacked wheel) is read from disk. The version always comes from the tree itself:
`flashinfer/_build_meta.py` (what wheels ship), `version.txt` (git clones), or the
dist-info METADATA beside the package.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sm120patch.errors import TargetError

TIMEOUT_S = 30.0
DISTS = ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")


@dataclass
class FlashInferEnv:
    """One FlashInfer: its package folder, version, and the AOT kernels that go with it.

    `python` is the interpreter that would run it (None for a bare tree); `sys_path`
    is the folder holding `flashinfer/`, put on PYTHONPATH when a probe runs a tree.
    """

    package_dir: Path | None
    version: str | None
    python: str | None = None
    source: str = "installed"  # "installed" or "tree"
    sys_path: Path | None = None
    dist_versions: dict[str, str] = field(default_factory=dict)
    cubin_dir: Path | None = None
    jit_cache_dir: Path | None = None
    user_cache_dirs: list[Path] = field(default_factory=list)
    error: str = ""
    stands_for: Path | None = None  # an overlay: the package folder whose patched state it is

    @property
    def identity(self) -> str:
        """The FlashInfer a proof made here is about: an overlay stands for the real package folder
        it will become once written, so its proofs hold there (evidence records this, not the
        overlay's path); `location` stays the folder read."""
        return str(self.stands_for) if self.stands_for else self.location

    @property
    def found(self) -> bool:
        return self.package_dir is not None

    @property
    def location(self) -> str:
        return str(self.package_dir) if self.package_dir else ""

    def to_dict(self) -> dict[str, object]:
        return {
            "package_dir": self.location or None,
            "version": self.version,
            "python": self.python,
            "source": self.source,
            "sys_path": str(self.sys_path) if self.sys_path else None,
            "dist_versions": self.dist_versions,
            "cubin": {"present": self.cubin_dir is not None, "dir": str(self.cubin_dir) if self.cubin_dir else None},
            "jit_cache": {
                "present": self.jit_cache_dir is not None,
                "dir": str(self.jit_cache_dir) if self.jit_cache_dir else None,
            },
            "user_cache_dirs": [str(p) for p in self.user_cache_dirs],
            "error": self.error,
        }


def _literal_assign(path: Path, name: str) -> str | None:
    """`name = "..."` at module level, read with ast (the file is never executed)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else ([node.target] if isinstance(node, ast.AnnAssign) else [])
        )
        for t in targets:
            if (
                isinstance(t, ast.Name)
                and t.id == name
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                return node.value.value
    return None


def _metadata_version(folder: Path, dist: str) -> str | None:
    """Version from `<dist>-<ver>.dist-info/METADATA` in `folder` (wheel or site-packages)."""
    norm = dist.replace("-", "_")
    for info in sorted(folder.glob(f"{norm}-*.dist-info")):
        meta = info / "METADATA"
        try:
            text = meta.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        m = re.search(r"^Version:\s*(\S+)", text, re.M)
        if m:
            return m.group(1)
    return None


def tree_version(package_dir: Path) -> str | None:
    """FlashInfer's version from its own files, without importing it."""
    meta = package_dir / "_build_meta.py"
    if meta.is_file() and (v := _literal_assign(meta, "__version__")):
        return v
    for vt in (package_dir.parent / "version.txt", package_dir / "version.txt"):
        if vt.is_file():
            text = vt.read_text(encoding="utf-8", errors="replace").strip()
            if text:
                return text.splitlines()[0].strip()
    return _metadata_version(package_dir.parent, "flashinfer-python")


def user_cache_dirs(version: str | None) -> list[Path]:
    """FlashInfer's JIT output dirs: <base>/.cache/flashinfer/<ver>/<archs>/cached_ops."""
    base = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE") or Path.home())
    root = base / ".cache" / "flashinfer"
    if not version or not (root / version).is_dir():
        return []
    return sorted(p for p in (root / version).glob("*/cached_ops") if p.is_dir())


def _sibling_package(sys_path: Path, name: str) -> Path | None:
    p = sys_path / name
    return p if (p / "__init__.py").is_file() else None


def from_tree(path: str | os.PathLike[str], python: str | None = None) -> FlashInferEnv:
    """A FlashInfer source tree: repo root, unpacked wheel, site-packages, or `flashinfer/` itself.

    `python` is the interpreter (with torch) that the spec/build rungs run the tree under.
    """
    p = Path(path).expanduser().resolve()
    if (p / "flashinfer" / "__init__.py").is_file():
        pkg = p / "flashinfer"
    elif p.name == "flashinfer" and (p / "__init__.py").is_file():
        pkg = p
    else:
        raise TargetError(
            f"{p}: no flashinfer/__init__.py here; give a FlashInfer clone, an "
            "unpacked wheel, or the flashinfer package folder"
        )
    sys_path = pkg.parent
    version = tree_version(pkg)
    env = FlashInferEnv(pkg, version, python, "tree", sys_path)
    for dist in DISTS:
        if v := _metadata_version(sys_path, dist):
            env.dist_versions[dist] = v
    if (cub := _sibling_package(sys_path, "flashinfer_cubin")) and (cub / "cubins").is_dir():
        env.cubin_dir = cub / "cubins"
    if jc := _sibling_package(sys_path, "flashinfer_jit_cache"):
        env.jit_cache_dir = _jit_cache_dir(jc)
    env.user_cache_dirs = user_cache_dirs(version)
    return env


def _jit_cache_dir(pkg: Path) -> Path:
    for name in ("jit_cache", "cached_ops"):
        if (pkg / name).is_dir():
            return pkg / name
    return pkg


_LOCATE_SCRIPT = r"""
import importlib.util, importlib.metadata, json, sys
out = {"executable": sys.executable, "dists": {}}
for mod in ("flashinfer", "flashinfer_cubin", "flashinfer_jit_cache"):
    try:
        spec = importlib.util.find_spec(mod)
    except Exception as e:
        spec, out[mod + "_error"] = None, repr(e)
    if spec is not None and spec.submodule_search_locations:
        out[mod] = list(spec.submodule_search_locations)[0]
for dist in ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"):
    try:
        out["dists"][dist] = importlib.metadata.version(dist)
    except Exception:
        pass
print(json.dumps(out))
"""


def from_python(python: str | None = None, timeout: float = TIMEOUT_S, extra_path: str | None = None) -> FlashInferEnv:
    """The FlashInfer that `python` would import (located in a subprocess, never imported)."""
    python = python or sys.executable
    env_vars = dict(os.environ)
    if extra_path:
        env_vars["PYTHONPATH"] = os.pathsep.join(filter(None, [extra_path, env_vars.get("PYTHONPATH")]))
    try:
        p = subprocess.run(
            [python, "-c", _LOCATE_SCRIPT],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env_vars,
            stdin=subprocess.DEVNULL,
        )
        out = json.loads(p.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        return FlashInferEnv(None, None, python, error=f"{python}: cannot inspect ({e})")
    if "flashinfer" not in out:
        return FlashInferEnv(
            None, None, python, error=f"{python}: flashinfer is not importable", dist_versions=out.get("dists", {})
        )
    env = from_tree(out["flashinfer"])
    env.python, env.source = python, "installed"
    env.dist_versions = {**env.dist_versions, **out.get("dists", {})}
    env.version = env.version or env.dist_versions.get("flashinfer-python")
    if out.get("flashinfer_cubin") and Path(out["flashinfer_cubin"], "cubins").is_dir():
        env.cubin_dir = Path(out["flashinfer_cubin"], "cubins")
    if out.get("flashinfer_jit_cache"):
        env.jit_cache_dir = _jit_cache_dir(Path(out["flashinfer_jit_cache"]))
    return env
