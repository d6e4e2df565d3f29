"""Every gate of one tree: the files worth parsing, the release's predicates, the sites.

Two passes over the files a byte search keeps: the first reads each file's own predicate-shaped
flags (`_is_sm100 = _is_cuda and is_sm100_supported()`), so a second file that imports one by name
is evaluated with its definition; the second finds the sites.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sm120patch.gates import cuda_arch
from sm120patch.gates.evaluate import PREDICATE_RX, Admits, Evaluator, Scope, bind_locals, function_admits
from sm120patch.gates.find import CC_DECORATOR, JIT_KWARG, FileScan, prefilter
from sm120patch.gates.predicates import ReleasePredicates, read_release
from sm120patch.gates.site import Predicate, Site

if TYPE_CHECKING:
    from sm120patch.planning.targets import Target

SKIP_DIRS = {"__pycache__", ".git", ".sm120patch", "tests", "test", "node_modules"}
# FlashInfer's own CUDA sources (data/cutlass, data/spdlog... are third-party headers)
CUDA_DIRS = ("data/include", "data/csrc", "include", "csrc")


@dataclass
class TreeScan:
    package: str
    version: str | None
    sites: list[Site] = field(default_factory=list)
    predicates: list[Predicate] = field(default_factory=list)
    files: int = 0
    parsed: int = 0


def py_files(package_dir: Path) -> list[Path]:
    """Every regular .py file of a package, outside tests and caches, not through symlinks."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not os.path.islink(os.path.join(dirpath, d)))
        out.extend(Path(dirpath, f) for f in sorted(filenames) if f.endswith(".py"))
    return out


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _module_flags(tree: ast.Module, release: ReleasePredicates) -> dict[str, Admits]:
    """Predicate-shaped names a module binds at its top level, with what they admit."""
    scope = Scope(dict(release.predicates), release.platform, release.platform_values)
    out: dict[str, Admits] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and PREDICATE_RX.match(node.name):
            out[node.name] = function_admits(node, scope)
    local = bind_locals(tree.body)
    ev = Evaluator(scope.child(local))
    for name, value in local.items():
        if PREDICATE_RX.match(name) and ev.reads_gpu(value):
            out[name] = ev.admits(value)
    return out


def scan_sglang(target: Target) -> TreeScan:
    base = target.package_dir.parent
    release = read_release(target.package_dir, base)
    out = TreeScan("sglang", target.version, predicates=list(release.found))
    rx = prefilter(release.words())
    files = py_files(target.package_dir)
    out.files = len(files)
    parsed: list[tuple[Path, str, str, ast.Module]] = []
    for path in files:
        data = _read(path)
        if data is None or not rx.search(data):
            continue
        try:
            text = data.decode("utf-8")
            tree = ast.parse(text, str(path))
        except (SyntaxError, ValueError, UnicodeDecodeError):
            continue
        parsed.append((path, path.relative_to(base).as_posix(), text, tree))
    out.parsed = len(parsed)
    # module flags any file may import by name: one definition, or the same answer everywhere
    shared: dict[str, Admits] = {}
    conflicting: set[str] = set()
    for _, _, _, tree in parsed:
        for name, admits in _module_flags(tree, release).items():
            if name in release.predicates:
                continue
            if name in shared and shared[name] != admits:
                conflicting.add(name)
            shared[name] = admits
    for name in conflicting:
        shared[name] = None
    combined = ReleasePredicates({**shared, **release.predicates}, release.platform, release.platform_values)
    for _, rel, text, tree in parsed:
        fs = FileScan("sglang", rel, text, tree, combined).run()
        out.sites.extend(fs.sites)
        out.predicates.extend(fs.flags)
    return out


def scan_flashinfer(target: Target) -> TreeScan:
    base = target.package_dir.parent
    out = TreeScan("flashinfer", target.version)
    rx = prefilter([JIT_KWARG, CC_DECORATOR])
    release = ReleasePredicates()
    files = py_files(target.package_dir)
    cuda: list[Path] = []
    for sub in CUDA_DIRS:
        d = target.package_dir / sub
        if d.is_dir():
            for dirpath, dirnames, filenames in os.walk(d):
                dirnames.sort()
                cuda.extend(Path(dirpath, f) for f in sorted(filenames) if f.endswith(cuda_arch.SUFFIXES))
    out.files = len(files) + len(cuda)
    for path in files:
        data = _read(path)
        if data is None or (JIT_KWARG.encode() not in data and CC_DECORATOR.encode() not in data):
            continue
        if not rx.search(data):
            continue
        try:
            text = data.decode("utf-8")
            tree = ast.parse(text, str(path))
        except (SyntaxError, ValueError, UnicodeDecodeError):
            continue
        out.parsed += 1
        out.sites.extend(FileScan("flashinfer", path.relative_to(base).as_posix(), text, tree, release).run().sites)
    for path in cuda:
        data = _read(path)
        if data is None or b"__CUDA_ARCH__" not in data:
            continue
        out.parsed += 1
        text = data.decode("utf-8", errors="replace")
        out.sites.extend(cuda_arch.scan_text("flashinfer", path.relative_to(base).as_posix(), text))
    return out


def scan_target(target: Target) -> TreeScan:
    return scan_sglang(target) if target.package == "sglang" else scan_flashinfer(target)
