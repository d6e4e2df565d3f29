"""The release's own architecture predicates, read from its source: what each name admits.

SGLang defines them in `srt/utils.py` (older) or `srt/utils/common.py`: functions such as
`is_sm120()` and names bound to `partial(_check_cuda_device_version, device_capability_majors=[12])`.
From 0.5.20 `get_platform().is_sm100` maps attributes to those names through a dict in the module
that defines `get_platform` (`runtime_context.py`). Nothing here is a list of ours: a release that
adds `is_sm130_supported` is read like any other.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from sm120patch.gates.evaluate import (
    CAPABILITY_CALLS,
    PREDICATE_RX,
    SM_CALLS,
    Admits,
    Evaluator,
    Scope,
    function_admits,
    names,
)
from sm120patch.gates.site import Predicate


@dataclass
class ReleasePredicates:
    predicates: dict[str, Admits] = field(default_factory=dict)
    platform: dict[str, Admits] = field(default_factory=dict)
    platform_values: dict[str, str] = field(default_factory=dict)
    found: list[Predicate] = field(default_factory=list)

    def scope(self) -> Scope:
        return Scope(dict(self.predicates), self.platform, self.platform_values)

    def words(self) -> list[str]:
        """Text whose presence makes a file worth parsing (the prefilter)."""
        return sorted({*self.predicates, *self.platform, *self.platform_values, *CAPABILITY_CALLS, *SM_CALLS})


def utility_files(package_dir: Path) -> list[Path]:
    srt = package_dir / "srt"
    found = [*srt.glob("utils*.py"), srt / "utils" / "common.py"]
    return [p for p in found if p.is_file()]


def _partial_call(value: ast.expr) -> ast.Call | None:
    for node in ast.walk(value):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name == "partial" and node.args and isinstance(node.args[0], ast.Name):
                return node
    return None


def read_module(tree: ast.Module, scope: Scope, rel: str, out: ReleasePredicates, kind: str) -> None:
    """Every predicate-shaped name a module defines at its top level, evaluated in `scope`
    (which grows as they are read; two passes so a definition may use a later one)."""
    funcs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for _ in range(2):
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and PREDICATE_RX.match(node.name):
                _record(out, scope, node.name, function_admits(node, scope), rel, node.lineno, kind)
            elif isinstance(node, ast.Assign):
                targets = [t.id for t in node.targets if isinstance(t, ast.Name) and PREDICATE_RX.match(t.id)]
                if not targets:
                    continue
                admits = _assigned(node.value, scope, funcs)
                for t in targets:
                    _record(out, scope, t, admits, rel, node.lineno, kind)


def _assigned(value: ast.expr, scope: Scope, funcs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]) -> Admits:
    call = _partial_call(value)
    if call is not None:
        assert isinstance(call.args[0], ast.Name)
        fn = funcs.get(call.args[0].id)
        if fn is None:
            return None
        params: dict[str, ast.expr] = {kw.arg: kw.value for kw in call.keywords if kw.arg}
        for arg, given in zip(fn.args.args, call.args[1:], strict=False):
            params[arg.arg] = given
        sub = Scope(scope.predicates, scope.platform, scope.platform_values, {}, params)
        return function_admits(fn, sub)
    ev = Evaluator(scope)
    return ev.admits(value) if ev.reads_gpu(value) else None


def _record(out: ReleasePredicates, scope: Scope, name: str, admits: Admits, rel: str, line: int, kind: str) -> None:
    if name not in out.predicates:
        out.found.append(Predicate(name, rel, line, names(admits), kind))
    else:
        out.found = [p if p.name != name else Predicate(name, rel, line, names(admits), kind) for p in out.found]
    out.predicates[name] = admits
    assert isinstance(scope.predicates, dict)
    scope.predicates[name] = admits


def read_platform(tree: ast.Module, out: ReleasePredicates) -> None:
    """`get_platform()` attributes: the module-level dicts of attribute -> predicate name."""
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if not isinstance(value, ast.Dict):
            continue
        for k, v in zip(value.keys, value.values, strict=True):
            if not (isinstance(k, ast.Constant) and isinstance(v, ast.Constant)):
                continue
            key, target = k.value, v.value
            if not (isinstance(key, str) and isinstance(target, str)):
                continue
            if target in out.predicates:
                out.platform[key] = out.predicates[target]
            elif target in CAPABILITY_CALLS:
                out.platform_values[key] = "capability"
            elif target in SM_CALLS:
                out.platform_values[key] = "sm"


def read_release(package_dir: Path, root: Path) -> ReleasePredicates:
    """The predicates of one SGLang tree (`package_dir` is its sglang/ folder)."""
    out = ReleasePredicates()
    scope = Scope(out.predicates)
    for path in utility_files(package_dir):
        tree = _parse(path)
        if tree is not None:
            read_module(tree, scope, path.relative_to(root).as_posix(), out, "release")
    for path in _platform_files(package_dir):
        tree = _parse(path)
        if tree is not None:
            read_platform(tree, out)
    return out


def _platform_files(package_dir: Path) -> list[Path]:
    """The module that defines `get_platform` (srt/runtime_context.py in 0.5.20+)."""
    found = []
    for path in (package_dir / "srt").glob("*.py"):
        try:
            if b"def get_platform" in path.read_bytes():
                found.append(path)
        except OSError:
            continue
    return found


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return None
