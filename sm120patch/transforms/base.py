"""The contract every transform keeps, its param checks, and the small CST readers they share.

A transform is constructed per edit from the recipe's params, then called once
per candidate file with that file's current libcst module. It returns a
`FileOutcome`: the new module (or None), and how many sites it changed or found
already in the desired state. It never raises for "not found": zero sites is an
answer the engine turns into `not-applicable`.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from sm120patch.arch import predicate_token
from sm120patch.transforms.rewrite import find_functions, replace_nodes
from sm120patch.transforms.walk import Walker

if TYPE_CHECKING:
    import libcst as cst

    from sm120patch.transforms.rewrite import Located
else:  # loaded on first use: validating recipes needs no parser
    from sm120patch.transforms._cst import cst


@dataclass
class FileOutcome:
    module: cst.Module | None = None  # the rewritten module, None when unchanged
    changed: int = 0
    satisfied: int = 0
    notes: list[str] = field(default_factory=list)


class Transform:
    NAME: ClassVar[str]
    DESCRIPTION: ClassVar[str]
    PARAMS_HELP: ClassVar[str]
    # One-site transforms (insert a rule) are satisfied if any site anywhere is,
    # and change only the first file; the others widen every matching site.
    ONE_SITE: ClassVar[bool] = False

    def __init__(self, params: dict[str, Any], functions: Sequence[str]) -> None:
        self.params = params
        self.functions = tuple(functions)
        self.seen: set[str] = set()  # named functions met so far, for a precise "missing" reason
        self._located: tuple[cst.Module | None, Located] = (None, [])  # the last functions_in

    @classmethod
    def check_params(cls, params: dict[str, Any], functions: Sequence[str]) -> str | None:
        """None when the params are usable, else what is wrong (one line)."""
        raise NotImplementedError

    def needles(self) -> list[str]:
        """Text a file must contain to be worth parsing (cheap pre-filter)."""
        return [f"def {f}(" for f in self.functions]

    def apply(self, module: cst.Module) -> FileOutcome:
        raise NotImplementedError

    def describe_missing(self) -> str:
        """Why no site was found, for the `not-applicable` reason."""
        if not self.seen:
            return f"no {_names(self.functions)} in this release"
        return f"{_names(sorted(self.seen))} has no {self.shape()}: the gate takes another form here"

    def shape(self) -> str:
        """What the transform looks for inside the functions, in words."""
        return "matching code"

    def functions_in(self, module: cst.Module) -> list[cst.FunctionDef]:
        """The named functions of `module`, remembering where each sits for `replace`."""
        located = find_functions(module, self.functions)
        self._located = (module, located)
        found = [fn for fn, _ in located]
        self.seen.update(f.name.value for f in found)
        return found

    def replace(self, module: cst.Module, mapping: dict[cst.CSTNode, cst.CSTNode]) -> cst.Module:
        """`module` with each key of `mapping` (a node inside, or one of, the functions
        `functions_in` just found in it) swapped for its value, by identity."""
        where, located = self._located
        return replace_nodes(module, mapping, located if where is module else None)


def _names(functions: Sequence[str]) -> str:
    return " / ".join(f"{f}()" for f in functions) or "the module"


# --- shared helpers -----------------------------------------------------------


def need_str_list(params: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    value = params.get(key)
    if value is None:
        return f"'{key}' is missing" if required else None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        return f"'{key}' must be a non-empty list of strings"
    return None


def need_str(params: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    value = params.get(key)
    if value is None:
        return f"'{key}' is missing" if required else None
    if not isinstance(value, str) or not value:
        return f"'{key}' must be a non-empty string"
    return None


def unknown_keys(params: dict[str, Any], allowed: Sequence[str]) -> str | None:
    extra = sorted(set(params) - set(allowed))
    return f"unknown param(s) {', '.join(extra)}" if extra else None


def string_value(node: cst.BaseExpression) -> str | None:
    """The value of a plain string literal, else None."""
    if isinstance(node, cst.SimpleString):
        v = node.evaluated_value
        return v if isinstance(v, str) else None
    return None


def leaf_identifier(node: cst.BaseExpression) -> str | None:
    """The identifier that names a predicate: `_is_sm100_supported`, `is_sm100_supported()`
    -> `is_sm100_supported`, `get_platform().is_sm100` -> `is_sm100`."""
    if isinstance(node, cst.Call) and not node.args:
        return leaf_identifier(node.func)
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return None


def flatten_or(node: cst.BooleanOperation) -> list[cst.BaseExpression]:
    """`a or b or c` (left-nested in libcst) as [a, b, c]; parenthesised sub-chains stay whole."""
    out: list[cst.BaseExpression] = []

    def walk(n: cst.BaseExpression, top: bool) -> None:
        if isinstance(n, cst.BooleanOperation) and isinstance(n.operator, cst.Or) and (top or not n.lpar):
            walk(n.left, False)
            walk(n.right, False)
        else:
            out.append(n)

    walk(node, True)
    return out


def arm_code(module: cst.Module, stmt: cst.CSTNode) -> str:
    """The code a statement owns for `near`: an `if`/`elif`/`while`/`for`/`with`/`try` arm is its
    header and its own body, never its `elif`/`else`/`except` branches (a word in a later
    branch must not pull an unrelated test in); any other statement is all of itself."""
    if isinstance(stmt, (cst.If, cst.While)):
        return module.code_for_node(stmt.test) + "\n" + module.code_for_node(stmt.body)
    if isinstance(stmt, cst.For):
        parts: list[cst.CSTNode] = [stmt.target, stmt.iter, stmt.body]
        return "\n".join(module.code_for_node(p) for p in parts)
    if isinstance(stmt, cst.With):
        return "\n".join(module.code_for_node(p) for p in (*stmt.items, stmt.body))
    if isinstance(stmt, cst.Try):
        return module.code_for_node(stmt.body)
    return module.code_for_node(stmt)


# --- expressions a recipe writes (wrap-expression, add-condition) ------------------------------------------


def norm_expr(code: str) -> str | None:
    """A comparable form of an expression: its AST without positions, parentheses or layout
    (`(a  or\n b)` and `a or b` are one expression). None when `code` is not an expression."""
    try:
        return ast.dump(ast.parse("(\n" + code + "\n)", mode="eval").body)
    except (SyntaxError, ValueError):
        return None


def need_expr(params: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    problem = need_str(params, key, required=required)
    if problem or key not in params:
        return problem
    if norm_expr(params[key]) is None:
        return f"'{key}' is not a Python expression: {params[key]!r}"
    return None


def need_imports(params: dict[str, Any]) -> str | None:
    """`imports`: names the written code uses, as "module:name"."""
    problem = need_str_list(params, "imports", required=False)
    if problem:
        return problem
    for imp in params.get("imports", []):
        mod, _, name = imp.partition(":")
        if imp.count(":") != 1 or not name.isidentifier() or not all(p.isidentifier() for p in mod.split(".")):
            return f"import {imp!r} must read 'module:name'"
    return None


_ATOMIC: tuple[str, ...] = (
    "Name",
    "Attribute",
    "Call",
    "Subscript",
    "SimpleString",
    "ConcatenatedString",
    "FormattedString",
    "Integer",
    "Float",
    "Imaginary",
    "Tuple",
    "List",
    "Set",
    "Dict",
    "Ellipsis",
)


def parenthesized(node: cst.BaseExpression, *, unless_atomic: bool = True) -> cst.BaseExpression:
    """`node` with one pair of parentheses, unless it has some or binds tighter than any operator."""
    if node.lpar or (unless_atomic and type(node).__name__ in _ATOMIC):
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])  # type: ignore[return-value]


def arch_predicates(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    """Arch predicates in a test: flags, zero-argument calls and platform attributes."""
    found: list[cst.BaseExpression] = []

    class _V(Walker):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, (cst.Call, cst.Name, cst.Attribute)) and predicate_token(
                leaf_identifier(node) or ""  # type: ignore[arg-type]
            ):
                if isinstance(node, cst.Call) and node.args:
                    return True
                found.append(node)  # type: ignore[arg-type]
                return False
            return True

    _V().walk(test)
    return found
