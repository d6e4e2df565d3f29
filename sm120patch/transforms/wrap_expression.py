"""wrap-expression: an expression inside named functions becomes a recipe-written one around it.

The general shape behind "add a condition beside an existing one": the `anchor`
(`get_platform().is_sm100`, `sm_major not in (9, 10)`, the `backend` passed to
`flashinfer_fp4_gemm`) is replaced by `template`, in which `__anchor__` stands for the
original expression, so upstream's own test keeps deciding every other GPU:

    anchor   = "get_platform().is_sm100"
    template = "__anchor__ or (get_platform().is_sm120 and cfg.kv_cache_dtype != 'fp8_e4m3')"

Anchors are matched by their syntax tree (layout and parentheses do not matter), in
expression positions only (never a keyword name or an assignment target). An anchor already
inside its wrapped form is satisfied, so the transform is idempotent.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar

from sm120patch.transforms.base import (
    FileOutcome,
    Transform,
    arm_code,
    need_expr,
    need_imports,
    need_str,
    norm_expr,
    parenthesized,
    unknown_keys,
)
from sm120patch.transforms.bindings import ensure_bound
from sm120patch.transforms.walk import Walker

if TYPE_CHECKING:
    import libcst as cst
else:  # loaded on first use: validating recipes needs no parser
    from sm120patch.transforms._cst import cst

PLACEHOLDER = "__anchor__"


class WrapExpression(Transform):
    NAME: ClassVar[str] = "wrap-expression"
    DESCRIPTION: ClassVar[str] = (
        "In the named functions, every occurrence of the `anchor` expression (optionally only "
        "inside calls to `in_call`, only in statements whose own arm mentions `near`) becomes "
        "`template`, where `__anchor__` stands for the original expression. `imports` "
        '("module:name") are bound when the module lacks them. An anchor already wrapped is satisfied.'
    )
    PARAMS_HELP: ClassVar[str] = (
        'params = { anchor = "get_platform().is_sm100", template = "__anchor__ or get_platform().is_sm120", '
        'near = "trtllm_mha" (optional), in_call = "flashinfer_fp4_gemm" (optional), '
        'imports = ["sglang.srt.utils:is_sm120_supported"] (optional) }'
    )

    @classmethod
    def check_params(cls, params: dict[str, Any], functions: Any) -> str | None:
        problem = (
            unknown_keys(params, ("anchor", "template", "near", "in_call", "imports"))
            or need_expr(params, "anchor")
            or need_expr(params, "template")
            or need_str(params, "near", required=False)
            or need_str(params, "in_call", required=False)
            or need_imports(params)
        )
        if problem:
            return problem
        if PLACEHOLDER not in params["template"] or norm_expr(params["template"]) == norm_expr(PLACEHOLDER):
            return f"'template' must use {PLACEHOLDER} inside a larger expression"
        if norm_expr(params["template"].replace(PLACEHOLDER, "(" + params["anchor"] + ")")) is None:
            return "'template' does not parse with the anchor in place of __anchor__"
        if not functions:
            return "'functions' must name the functions that hold the expression"
        return None

    def __init__(self, params: dict[str, Any], functions: Any) -> None:
        super().__init__(params, functions)
        self.anchor: str = params["anchor"]
        self.template: str = params["template"]
        self.near: str | None = params.get("near")
        self.in_call: str | None = params.get("in_call")
        self.imports = [tuple(i.split(":")) for i in params.get("imports", [])]
        self._anchor_norm = norm_expr(self.anchor)
        self._wrapped_norm = norm_expr(self.template.replace(PLACEHOLDER, "(" + self.anchor + ")"))
        # the anchor goes in bare when parentheses would not change what the template means
        self._bare_ok = norm_expr(self.template.replace(PLACEHOLDER, self.anchor)) == self._wrapped_norm
        idents = re.findall(r"[A-Za-z_]\w*", self.anchor)
        self._key = max(idents, key=len) if idents else ""

    def shape(self) -> str:
        where = f" in {self.in_call}() calls" if self.in_call else ""
        return f"`{self.anchor}`{where}" + (f" near {self.near!r}" if self.near else "")

    def apply(self, module: cst.Module) -> FileOutcome:
        out = FileOutcome()
        swaps: dict[cst.CSTNode, cst.CSTNode] = {}
        for fn in self.functions_in(module):
            for node, stmt, wrapped, standalone in _occurrences(module, fn, self):
                if self.near and self.near not in arm_code(module, stmt):
                    continue
                if wrapped:
                    out.satisfied += 1
                    continue
                swaps[node] = self._wrap(node, standalone, _continuation_indent(module, stmt, node))
                out.changed += 1
        if not swaps:
            return out
        new = self.replace(module, swaps)
        for mod, name in self.imports:
            new, why = ensure_bound(new, name, import_from=mod)
            if why:
                out.notes.append(why)
        out.module = new
        return out

    def _wrap(self, node: cst.BaseExpression, standalone: bool, indent: str) -> cst.BaseExpression:
        """The template around `node`; parenthesised unless it stands alone (a whole `if` test,
        an assigned or passed value), where no operator around it could bind differently. The
        template's own line breaks are indented from the line the anchor sits on."""
        bare = node.with_changes(lpar=[], rpar=[])
        inner = bare if self._bare_ok else parenthesized(bare)  # type: ignore[arg-type]
        template = _parse_template(self.template)
        if indent:

            class _Indent(cst.CSTTransformer):
                def leave_ParenthesizedWhitespace(
                    self, original: cst.ParenthesizedWhitespace, updated: cst.ParenthesizedWhitespace
                ) -> cst.ParenthesizedWhitespace:
                    last = cst.SimpleWhitespace(indent + updated.last_line.value)
                    return updated.with_changes(last_line=last)

            template = template.visit(_Indent())  # type: ignore[assignment]

        class _Fill(cst.CSTTransformer):
            def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:  # type: ignore[override]
                # a fresh copy per use: a node appears once in a tree (later edits find nodes by identity)
                return inner.deep_clone() if updated.value == PLACEHOLDER else updated

        filled = template.visit(_Fill())
        assert isinstance(filled, cst.BaseExpression)
        if node.lpar:  # keep the anchor's own parentheses (and the layout inside them)
            return filled.with_changes(lpar=node.lpar, rpar=node.rpar)
        return filled if standalone else parenthesized(filled)


def _occurrences(
    module: cst.Module, fn: cst.FunctionDef, t: WrapExpression
) -> list[tuple[cst.BaseExpression, cst.CSTNode, bool, bool]]:
    """(anchor node, its innermost statement, already wrapped?, stands alone?) for every
    occurrence in an expression position of `fn`."""
    found: list[tuple[cst.BaseExpression, cst.CSTNode, bool, bool]] = []
    anchor = cst.parse_expression(t.anchor)
    wrapped = _parse_template(t.template)
    anchor_type, wrapped_type = type(anchor), type(wrapped)
    heads = {True: _head(wrapped), False: _head(anchor)}
    key = t._key

    def same(node: cst.CSTNode, norm: str | None, is_wrapped: bool) -> bool:
        # equal syntax trees have equal heads: most candidates are told apart without codegen
        head = heads[is_wrapped]
        if head is not None and _head(node) != head:  # type: ignore[arg-type]
            return False
        code = module.code_for_node(node)
        return key in code and norm_expr(code) == norm

    class _V(Walker):
        def __init__(self) -> None:
            self.stmt: list[cst.CSTNode] = []
            self.calls = 0  # depth inside the arguments of an `in_call` call
            self.alone: set[int] = set()  # ids of whole `if` tests, assigned and passed values

        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, (cst.BaseCompoundStatement, cst.SimpleStatementLine)):
                self.stmt.append(node)
            if isinstance(node, (cst.If, cst.While)):
                self.alone.add(id(node.test))
            elif isinstance(node, (cst.Assign, cst.Return)) and node.value is not None:
                self.alone.add(id(node.value))
            stmt = self.stmt[-1] if self.stmt else fn
            for norm, typ, wrapped in ((t._wrapped_norm, wrapped_type, True), (t._anchor_norm, anchor_type, False)):
                if isinstance(node, typ) and same(node, norm, wrapped):
                    if not t.in_call or self.calls:
                        found.append((node, stmt, wrapped, id(node) in self.alone))  # type: ignore[arg-type]
                    return False
            if isinstance(node, cst.Call) and t.in_call and _callee(node) == t.in_call:
                self.walk(node.func)
                self.calls += 1
                for arg in node.args:
                    self.alone.add(id(arg.value))
                    self.walk(arg.value)  # the value only: a keyword name is not an expression
                self.calls -= 1
                return False
            if isinstance(node, cst.Arg):
                self.alone.add(id(node.value))
                self.walk(node.value)
                return False
            if isinstance(node, cst.Attribute):
                self.walk(node.value)  # `.attr` is a name, not an expression
                return False
            if isinstance(node, (cst.AssignTarget, cst.Param)):
                return False
            if isinstance(node, (cst.AugAssign, cst.AnnAssign)):
                for part in (getattr(node, "annotation", None), node.value):
                    if part is not None:
                        self.walk(part)
                return False
            return True

        def on_leave(self, original: cst.CSTNode) -> None:
            if self.stmt and self.stmt[-1] is original:
                self.stmt.pop()

    _V().walk(fn.body)
    return found


def _continuation_indent(module: cst.Module, stmt: cst.CSTNode, node: cst.CSTNode) -> str:
    """How far the anchor's line is indented past its statement's block: "" when the anchor
    sits on the statement's first line, else the leading whitespace of its continuation line."""
    code, anchor = module.code_for_node(stmt), module.code_for_node(node)
    at = code.find(anchor)
    prefix = code[:at] if at >= 0 else ""
    if "\n" not in prefix:
        return ""
    line = prefix.rsplit("\n", 1)[1]
    return line[: len(line) - len(line.lstrip(" \t"))]


def _parse_template(template: str) -> cst.BaseExpression:
    """The template as an expression; one that spans lines outside any bracket keeps a pair of
    parentheses around it, which is what makes those line breaks legal."""
    try:
        return cst.parse_expression(template)
    except cst.ParserSyntaxError:
        return cst.parse_expression("(" + template + ")")


def _head(node: cst.BaseExpression) -> str | None:
    """The name an expression leads with where its kind has one: a name's own, an attribute's
    tail, a call's callee (None for other kinds)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(node, cst.Call):
        return _callee(node) or ""
    return None


def _callee(call: cst.Call) -> str | None:
    f = call.func
    if isinstance(f, cst.Name):
        return f.value
    if isinstance(f, cst.Attribute):
        return f.attr.value
    return None
