"""insert-rule: add an `if` rule at the top of a function, unless an equivalent rule is there."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any, ClassVar

from sm120patch.arch import PREDICATE_MAJORS, predicate_token
from sm120patch.transforms.base import (
    FileOutcome,
    Transform,
    leaf_identifier,
    need_str,
    need_str_list,
    string_value,
    unknown_keys,
)
from sm120patch.transforms.bindings import ensure_bound, is_docstring
from sm120patch.transforms.walk import Walker

if TYPE_CHECKING:
    import libcst as cst
else:  # loaded on first use: validating recipes needs no parser
    from sm120patch.transforms._cst import cst


class InsertRule(Transform):
    NAME: ClassVar[str] = "insert-rule"
    DESCRIPTION: ClassVar[str] = (
        "Insert `code` (one `if` statement, written in the recipe) as the first statement "
        "of the first named function found. Satisfied when any named function already holds "
        "an `if` whose test admits `arch` and whose body assigns `value` to `assigns` "
        '(upstream wrote the same rule). `imports` ("module:name") are added when unbound.'
    )
    PARAMS_HELP: ClassVar[str] = (
        'params = { code = "if ...:\\n    ...", assigns = "moe_runner_backend", '
        'value = "flashinfer_cutlass", arch = "sm120", imports = ["sglang.srt.utils:is_sm120_supported"] }'
    )
    ONE_SITE: ClassVar[bool] = True

    @classmethod
    def check_params(cls, params: dict[str, Any], functions: Any) -> str | None:
        problem = (
            unknown_keys(params, ("code", "assigns", "value", "arch", "imports"))
            or need_str(params, "code")
            or need_str(params, "assigns")
            or need_str(params, "value")
            or need_str(params, "arch")
            or need_str_list(params, "imports", required=False)
        )
        if problem:
            return problem
        if params["arch"] not in PREDICATE_MAJORS:
            return f"arch {params['arch']!r} is not an arch token; use one of {', '.join(PREDICATE_MAJORS)}"
        for imp in params.get("imports", []):
            if imp.count(":") != 1:
                return f"import {imp!r} must read 'module:name'"
        if not _plainly_one_if(params["code"]):  # else libcst says exactly what is wrong
            try:
                stmt = cst.parse_statement(params["code"])
            except cst.ParserSyntaxError as e:
                return f"code does not parse ({e.message})"
            if not isinstance(stmt, cst.If):
                return "code must be a single `if` statement"
        if not functions:
            return "'functions' must name where the rule goes"
        return None

    def __init__(self, params: dict[str, Any], functions: Any) -> None:
        super().__init__(params, functions)
        self.code: str = params["code"].strip("\n") + "\n"
        self.assigns: str = params["assigns"]
        self.value: str = params["value"]
        self.majors = PREDICATE_MAJORS[params["arch"]]
        self.imports = [tuple(i.split(":")) for i in params.get("imports", [])]

    def apply(self, module: cst.Module) -> FileOutcome:
        out = FileOutcome()
        functions = self.functions_in(module)
        if any(self._has_rule(fn) for fn in functions):
            out.satisfied = 1
            return out
        if not functions:
            return out
        fn = min(functions, key=lambda f: self.functions.index(f.name.value))
        body = fn.body
        if not isinstance(body, cst.IndentedBlock):
            out.notes.append(f"{fn.name.value}() is a one-line def; cannot insert")
            return out
        stmts = list(body.body)
        at = 1 if stmts and is_docstring(stmts[0]) else 0
        stmts.insert(at, cst.parse_statement(self.code))
        # keep the function's first line of code where it was: a blank line after the rule
        if at < len(stmts) - 1:
            nxt = stmts[at + 1]
            stmts[at + 1] = nxt.with_changes(leading_lines=[cst.EmptyLine(indent=False), *nxt.leading_lines])
        new = self.replace(module, {fn: fn.with_changes(body=body.with_changes(body=stmts))})
        for mod, name in self.imports:
            new, why = ensure_bound(new, name, import_from=mod)
            if why:
                out.notes.append(why)
        out.module = new
        out.changed = 1
        return out

    def _has_rule(self, fn: cst.FunctionDef) -> bool:
        """An `if` admitting the arch whose body sets `assigns` to `value`."""
        majors, assigns, value = self.majors, self.assigns, self.value
        found = False

        class _V(Walker):
            def visit_If(self, node: cst.If) -> None:
                nonlocal found
                admits = False

                class _T(Walker):
                    def on_visit(self, n: cst.CSTNode) -> bool:
                        nonlocal admits
                        if isinstance(n, (cst.Name, cst.Attribute, cst.Call)):
                            tok = predicate_token(leaf_identifier(n) or "")  # type: ignore[arg-type]
                            if tok and PREDICATE_MAJORS[tok] & majors:
                                admits = True
                        return True

                _T().walk(node.test)
                if admits and _assigns(node.body, assigns, value):
                    found = True

        _V().walk(fn.body)
        return found


def _plainly_one_if(code: str) -> bool:
    """True when `code` is one unindented `if` statement with nothing after it but blank
    lines: then libcst's `parse_statement` accepts it too, and loading a recipe does not
    have to import libcst (Python's own parser is already loaded)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.If):
        return False
    lines = code.splitlines()
    first = next((line for line in lines if line.strip()), "")
    end = tree.body[0].end_lineno or len(lines)
    return first.startswith("if") and all(not line.strip() for line in lines[end:])


def _assigns(block: cst.CSTNode, attr: str, value: str) -> bool:
    hit = False

    class _V(Walker):
        def visit_Assign(self, node: cst.Assign) -> None:
            nonlocal hit
            for t in node.targets:
                tgt = t.target
                name = tgt.attr.value if isinstance(tgt, cst.Attribute) else getattr(tgt, "value", None)
                if name == attr and string_value(node.value) == value:
                    hit = True

    _V().walk(block)
    return hit
