"""Evaluate patched gates on the AST, the way Python would, for a given GPU major.

Arch predicates are bound by their names' meaning (`_is_sm120_supported` is True
for major 12, `is_blackwell_supported()` for 10 and 12); everything else in the
expression is given the values a test passes. No string matching on code.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sm120patch.arch import admits, predicate_token


class _Pred:
    """Stands for a flag or a zero-arg predicate function alike."""

    def __init__(self, value: bool) -> None:
        self.value = value

    def __bool__(self) -> bool:
        return self.value

    def __call__(self, *a: Any, **k: Any) -> bool:
        return self.value


class _Platform:
    def __init__(self, major: int) -> None:
        self.major = major

    def __getattr__(self, name: str) -> bool:
        if predicate_token(name) is None:
            return False  # is_cuda, is_hip...: irrelevant to the arch part of the test
        return admits(name, self.major)


class _Names(dict):
    def __init__(self, major: int, extra: dict[str, Any]) -> None:
        super().__init__(extra)
        self.major = major

    def __missing__(self, name: str) -> Any:
        if name == "get_platform":
            return lambda: _Platform(self.major)
        if predicate_token(name):
            return _Pred(admits(name, self.major))
        raise KeyError(name)


def functions(tree: ast.AST, names: set[str]) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in names]


def arch_chains(fn: ast.FunctionDef) -> list[ast.BoolOp]:
    """`or` chains in a function made of two or more arch predicates."""
    out = []
    for n in ast.walk(fn):
        if isinstance(n, ast.BoolOp) and isinstance(n.op, ast.Or):
            preds = [v for v in n.values if predicate_token(ast.unparse(v).replace("()", "").split(".")[-1])]
            if len(preds) >= 2:
                out.append(n)
    return out


def eval_expr(node: ast.expr, major: int, **values: Any) -> Any:
    code = compile(ast.Expression(body=node), "<gate>", "eval")
    return eval(code, {"__builtins__": {}}, _Names(major, values))  # noqa: S307 - our own AST, no builtins


def chains_admit(path: Path, names: set[str], major: int) -> list[bool]:
    """For each arch `or` chain in the named functions: does it hold for this major?"""
    tree = ast.parse(path.read_bytes())
    return [bool(eval_expr(c, major)) for fn in functions(tree, names) for c in arch_chains(fn)]


def module_binds(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_bytes())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            return True
    return False


def moe_rule_picks(path: Path, names: set[str], major: int, quantization: str, backend: str = "auto") -> str:
    """Run every top-level `if` of the named functions that tests an arch predicate against a
    fake server-args object (`self` in ServerArgs methods, `view` and a local
    `moe_runner_backend` in the 0.5.15+ post-process passes); return the backend it leaves."""
    tree = ast.parse(path.read_bytes())
    args = SimpleNamespace(moe_runner_backend=backend, quantization=quantization)
    for fn in functions(tree, names):
        local = {"self": args, "view": args, "moe_runner_backend": args.moe_runner_backend}
        for stmt in fn.body:
            if not isinstance(stmt, ast.If) or not any(
                predicate_token(ast.unparse(n)) for n in ast.walk(stmt.test) if isinstance(n, (ast.Name, ast.Attribute))
            ):
                continue
            try:
                taken = eval_expr(stmt.test, major, **local)
            except NameError:
                continue  # a rule about something else (mxfp8, nvfp4_online...)
            if not taken:
                continue
            for inner in stmt.body:
                if isinstance(inner, ast.Assign):
                    value = eval_expr(inner.value, major, **local)
                    for t in inner.targets:
                        if (
                            isinstance(t, ast.Attribute)
                            and t.attr == "moe_runner_backend"
                            or (isinstance(t, ast.Name) and t.id == "moe_runner_backend")
                        ):
                            args.moe_runner_backend = local["moe_runner_backend"] = value
    return args.moe_runner_backend


def list_holds(path: Path, names: set[str], anchors: set[str], item: str) -> bool:
    """Does the backend list (the one holding `anchors`) in the named functions hold `item`?"""
    tree = ast.parse(path.read_bytes())
    for fn in functions(tree, names):
        for n in ast.walk(fn):
            if isinstance(n, ast.List) and all(isinstance(e, ast.Constant) for e in n.elts):
                values = {e.value for e in n.elts}  # type: ignore[attr-defined]
                if anchors <= values:
                    return item in values
    raise AssertionError(f"no list holding {anchors} in {names} of {path}")


def if_tests_admit(path: Path, names: set[str], near: str, major: int, **values: Any) -> list[bool]:
    """Each `if`/`elif` test in the named functions that mentions `near` and an arch predicate,
    evaluated for this major (other names from `values`)."""
    tree = ast.parse(path.read_bytes())
    out = []
    for fn in functions(tree, names):
        for n in ast.walk(fn):
            if isinstance(n, ast.If) and near in ast.unparse(n.test):
                has_pred = any(
                    predicate_token(ast.unparse(x).replace("()", "").split(".")[-1])
                    for x in ast.walk(n.test)
                    if isinstance(x, (ast.Name, ast.Attribute, ast.Call))
                )
                if has_pred:
                    out.append(bool(eval_expr(n.test, major, **values)))
    return out
