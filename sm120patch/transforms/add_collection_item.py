"""add-collection-item: one more entry in a tuple, list, set or frozenset literal.

SGLang keeps many allow-lists as literals: `_GLM_DSA_MODEL_ARCHS = ("GlmMoeDsaForCausalLM", ...)`
at module level, `sm_major not in (9, 10)` inside a function. Either is found by structure:
a module-level name (`target`) bound to the literal, or the literals inside the named
functions that hold every `anchors` value. Items are strings or integers, appended in the
literal's own layout (one per line stays one per line).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from sm120patch.transforms.base import FileOutcome, Transform, need_str, unknown_keys
from sm120patch.transforms.walk import Walker

if TYPE_CHECKING:
    import libcst as cst
else:  # loaded on first use: validating recipes needs no parser
    from sm120patch.transforms._cst import cst

Value = str | int


class AddCollectionItem(Transform):
    NAME: ClassVar[str] = "add-collection-item"
    DESCRIPTION: ClassVar[str] = (
        "Every tuple/list/set/frozenset literal that is the value of the module-level name "
        "`target`, or that sits in the named functions and holds all `anchors`, gets each of "
        "`items` it lacks, appended in its own layout. One that holds them all is satisfied."
    )
    PARAMS_HELP: ClassVar[str] = (
        'params = { target = "_GLM_DSA_MODEL_ARCHS", items = ["DeepseekV32ForCausalLM"] } or '
        "{ anchors = [9, 10], items = [12] } with functions = [...]"
    )

    @classmethod
    def check_params(cls, params: dict[str, Any], functions: Any) -> str | None:
        problem = unknown_keys(params, ("target", "anchors", "items")) or need_str(params, "target", required=False)
        if problem:
            return problem
        for key in ("items", "anchors"):
            value = params.get(key)
            if value is None:
                continue
            if not isinstance(value, list) or not value or not all(_is_value(v) for v in value):
                return f"'{key}' must be a non-empty list of strings or integers"
        if "items" not in params:
            return "'items' is missing"
        if ("target" in params) == ("anchors" in params):
            return "give exactly one of 'target' (a module-level name) or 'anchors' (values the literal holds)"
        if "anchors" in params and not functions:
            return "'functions' must name the functions that hold the literal"
        return None

    def __init__(self, params: dict[str, Any], functions: Any) -> None:
        super().__init__(params, functions)
        self.target: str | None = params.get("target")
        self.anchors: list[Value] = params.get("anchors", [])
        self.items: list[Value] = params["items"]

    def needles(self) -> list[str]:
        return [f"{self.target} =", f"{self.target}="] if self.target else super().needles()

    def describe_missing(self) -> str:
        if self.target:
            return f"no module-level {self.target} literal in this release"
        return super().describe_missing()

    def shape(self) -> str:
        return f"literal holding {', '.join(repr(a) for a in self.anchors)}"

    def apply(self, module: cst.Module) -> FileOutcome:
        out = FileOutcome()
        swaps: dict[cst.CSTNode, cst.CSTNode] = {}
        for lit in self._literals(module):
            values = [_value(e.value) for e in lit.elements]
            missing = [i for i in self.items if i not in values]
            if not missing:
                out.satisfied += 1
                continue
            new = lit
            for item in missing:
                new = _append(new, item)
            swaps[lit] = new
            out.changed += 1
        if swaps:
            out.module = self.replace(module, swaps) if not self.target else _replace_all(module, swaps)
        return out

    def _literals(self, module: cst.Module) -> list[cst.List | cst.Tuple | cst.Set]:
        if self.target:
            found = []
            for stmt in module.body:
                if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
                    small = stmt.body[0]
                    if isinstance(small, (cst.Assign, cst.AnnAssign)) and self.target in _targets(small):
                        lit = _literal(small.value) if small.value is not None else None
                        if lit is not None:
                            found.append(lit)
            return found
        out: list[cst.List | cst.Tuple | cst.Set] = []
        anchors = self.anchors

        class _V(Walker):
            def on_visit(self, node: cst.CSTNode) -> bool:
                if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
                    values = [_value(e.value) for e in node.elements]
                    if all(a in values for a in anchors):
                        out.append(node)
                return True

        for fn in self.functions_in(module):
            _V().walk(fn.body)
        return out


def _is_value(v: Any) -> bool:
    return (isinstance(v, str) and bool(v)) or (isinstance(v, int) and not isinstance(v, bool))


def _targets(small: cst.Assign | cst.AnnAssign) -> list[str]:
    if isinstance(small, cst.AnnAssign):
        return [small.target.value] if isinstance(small.target, cst.Name) else []
    return [t.target.value for t in small.targets if isinstance(t.target, cst.Name)]


def _literal(node: cst.BaseExpression) -> cst.List | cst.Tuple | cst.Set | None:
    """The literal itself, or the one inside `frozenset(...)`/`set(...)`/`tuple(...)`."""
    if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
        return node
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Name)
        and node.func.value in ("frozenset", "set", "tuple", "list")
        and len(node.args) == 1
        and node.args[0].keyword is None
        and isinstance(node.args[0].value, (cst.List, cst.Tuple, cst.Set))
    ):
        return node.args[0].value
    return None


def _value(node: cst.BaseExpression) -> Value | None:
    if isinstance(node, cst.SimpleString):
        v = node.evaluated_value
        return v if isinstance(v, str) else None
    if isinstance(node, cst.Integer):
        return int(node.value, 0)
    return None


def _element(lit: cst.List | cst.Tuple | cst.Set, item: Value) -> cst.Element:
    if isinstance(item, int):
        return cst.Element(cst.Integer(str(item)))
    quote = next((e.value.quote for e in lit.elements if isinstance(e.value, cst.SimpleString)), '"')
    return cst.Element(cst.SimpleString(f"{quote}{item}{quote}"))


def _brackets(lit: cst.List | cst.Tuple | cst.Set) -> tuple[Any, Any, str]:
    """(opening token, closing token, attribute of the literal holding the closing one)."""
    if isinstance(lit, cst.List):
        return lit.lbracket, lit.rbracket, "rbracket"
    if isinstance(lit, cst.Set):
        return lit.lbrace, lit.rbrace, "rbrace"
    return (lit.lpar[0] if lit.lpar else None), (lit.rpar[-1] if lit.rpar else None), "rpar"


def _append(lit: cst.List | cst.Tuple | cst.Set, item: Value) -> cst.List | cst.Tuple | cst.Set:
    elements = list(lit.elements)
    new_el = _element(lit, item)
    if not elements:
        only = new_el.with_changes(comma=cst.Comma()) if isinstance(lit, cst.Tuple) else new_el  # `(x,)`
        return lit.with_changes(elements=[only])
    opening, closing, attr = _brackets(lit)
    last = elements[-1]
    ws_close = getattr(closing, "whitespace_before", None)
    if isinstance(ws_close, cst.ParenthesizedWhitespace):
        # one element per line: the new one goes on its own line, indented like the first
        ws_open = getattr(opening, "whitespace_after", None)
        indent = ws_open.last_line if isinstance(ws_open, cst.ParenthesizedWhitespace) else cst.SimpleWhitespace("    ")
        sep = cst.ParenthesizedWhitespace(first_line=ws_close.first_line, empty_lines=[], indent=True, last_line=indent)
        elements[-1] = last.with_changes(comma=cst.Comma(whitespace_after=sep))
        elements.append(new_el.with_changes(comma=cst.Comma()) if isinstance(last.comma, cst.Comma) else new_el)
        new_closing = closing.with_changes(whitespace_before=ws_close.with_changes(first_line=cst.TrailingWhitespace()))
        if attr == "rpar":
            return lit.with_changes(elements=elements, rpar=[*lit.rpar[:-1], new_closing])
        return lit.with_changes(elements=elements, **{attr: new_closing})
    trailing = last.comma
    elements[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    if isinstance(lit, cst.Tuple) and len(elements) == 1 and not isinstance(trailing, cst.Comma):
        trailing = cst.MaybeSentinel.DEFAULT
    elements.append(new_el.with_changes(comma=trailing))
    return lit.with_changes(elements=elements)


def _replace_all(module: cst.Module, swaps: dict[cst.CSTNode, cst.CSTNode]) -> cst.Module:
    """Swap module-level literals (a `target`'s value sits in a top-level statement)."""
    from sm120patch.transforms.rewrite import replace_nodes

    return replace_nodes(module, swaps, None)
