"""add-function: a recipe-written module-level helper, placed right above the function that uses it.

Some run-time facts take more than an expression to ask (is every GPU pair reachable over
PCIe P2P?). A helper keeps the condition a `wrap-expression` writes readable, and the code a
reviewer reads in one place: the recipe. The helper is satisfied when the module already
defines a function of that name.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any, ClassVar

from sm120patch.transforms.base import FileOutcome, Transform, need_imports, need_str, unknown_keys
from sm120patch.transforms.bindings import ensure_bound

if TYPE_CHECKING:
    import libcst as cst
else:  # loaded on first use: validating recipes needs no parser
    from sm120patch.transforms._cst import cst


class AddFunction(Transform):
    NAME: ClassVar[str] = "add-function"
    DESCRIPTION: ClassVar[str] = (
        "Insert `code` (one module-level `def`, written in the recipe) right above the first "
        "named function found at module level. Satisfied when the module already defines a "
        'function of that name. `imports` ("module:name") are bound when unbound.'
    )
    PARAMS_HELP: ClassVar[str] = (
        'params = { code = "def _helper(...) -> bool:\\n    ...", imports = ["sglang.srt.utils:is_sm120_supported"] }'
    )
    ONE_SITE: ClassVar[bool] = True

    @classmethod
    def check_params(cls, params: dict[str, Any], functions: Any) -> str | None:
        problem = unknown_keys(params, ("code", "imports")) or need_str(params, "code") or need_imports(params)
        if problem:
            return problem
        if _def_name(params["code"]) is None:
            return "code must be exactly one unindented `def` statement"
        if not functions:
            return "'functions' must name the module-level function the helper goes above"
        return None

    def __init__(self, params: dict[str, Any], functions: Any) -> None:
        super().__init__(params, functions)
        self.code: str = params["code"].strip("\n") + "\n"
        self.name = _def_name(self.code) or ""
        self.imports = [tuple(i.split(":")) for i in params.get("imports", [])]

    def shape(self) -> str:
        return f"module-level def of {' / '.join(self.functions)}"

    def apply(self, module: cst.Module) -> FileOutcome:
        out = FileOutcome()
        body = list(module.body)
        tops = {s.name.value: i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef)}
        here = [tops[f] for f in self.functions if f in tops]
        self.seen.update(f for f in self.functions if f in tops)
        if not here:
            return out
        if self.name in tops:
            out.satisfied = 1
            return out
        at = here[0]
        new_def = cst.parse_statement(self.code)
        anchor = body[at]
        # the helper takes the anchor's leading blank lines; the anchor gets two of its own
        blank = [cst.EmptyLine(indent=False)] * 2
        body[at] = anchor.with_changes(leading_lines=[*blank, *_comments(anchor)])
        body.insert(at, new_def.with_changes(leading_lines=[ln for ln in anchor.leading_lines if ln.comment is None]))
        new = module.with_changes(body=body)
        for mod, name in self.imports:
            new, why = ensure_bound(new, name, import_from=mod)
            if why:
                out.notes.append(why)
        out.module = new
        out.changed = 1
        return out


def _comments(stmt: cst.FunctionDef) -> list[cst.EmptyLine]:
    """Comment lines right above a def belong to it, not to what is inserted before it."""
    lines = list(stmt.leading_lines)
    first = next((i for i, ln in enumerate(lines) if ln.comment is not None), len(lines))
    return lines[first:]


def _def_name(code: str) -> str | None:
    """The name of the one unindented `def` in `code` (parsed by Python, not libcst, so loading
    a recipe needs no parser)."""
    try:
        tree = ast.parse(code.strip("\n"))
    except (SyntaxError, ValueError):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        return None
    return tree.body[0].name
