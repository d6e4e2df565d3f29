"""widen-major-list: add a GPU major version to an int list passed by keyword, e.g. FlashInfer's
`get_nvcc_flags_list(supported_major_versions=[9, 10])` -> `[9, 10, 12]`.

FlashInfer's JIT generators name the majors a module builds for in exactly this shape; a
generator whose list leaves 12 out raises "No supported CUDA architectures found" on SM12x.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from sm120patch.transforms.base import FileOutcome, Transform, need_str, unknown_keys
from sm120patch.transforms.walk import Walker

if TYPE_CHECKING:
    import libcst as cst
else:  # loaded on first use: validating recipes needs no parser
    from sm120patch.transforms._cst import cst


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class WidenMajorList(Transform):
    NAME: ClassVar[str] = "widen-major-list"
    DESCRIPTION: ClassVar[str] = (
        "In the named functions, every list of int literals passed as keyword `keyword` that holds "
        "all of `has` gets `add` appended in the list's own layout. A list that already holds `add` "
        "is satisfied."
    )
    PARAMS_HELP: ClassVar[str] = 'params = { keyword = "supported_major_versions", has = [9, 10], add = 12 }'

    @classmethod
    def check_params(cls, params: dict[str, Any], functions: Any) -> str | None:
        problem = unknown_keys(params, ("keyword", "has", "add")) or need_str(params, "keyword")
        if problem:
            return problem
        if "add" not in params:
            return "'add' is missing"
        if not _is_int(params["add"]):
            return "'add' must be an integer (a GPU major version, e.g. 12)"
        has = params.get("has", [])
        if not isinstance(has, list) or not all(_is_int(h) for h in has):
            return "'has' must be a list of integers"
        if not functions:
            return "'functions' must name the functions that pass the list"
        return None

    def __init__(self, params: dict[str, Any], functions: Any) -> None:
        super().__init__(params, functions)
        self.keyword: str = params["keyword"]
        self.has: list[int] = list(params.get("has", []))
        self.add: int = params["add"]

    def shape(self) -> str:
        held = f" holding {', '.join(map(str, self.has))}" if self.has else ""
        return f"{self.keyword}=[...] list of integers{held}"

    def apply(self, module: cst.Module) -> FileOutcome:
        out = FileOutcome()
        swaps: dict[cst.CSTNode, cst.CSTNode] = {}
        for fn in self.functions_in(module):
            for lst in _keyword_lists(fn, self.keyword):
                values = _int_values(lst)
                if values is None or not all(h in values for h in self.has):
                    continue
                if self.add in values:
                    out.satisfied += 1
                    continue
                swaps[lst] = _append(lst, cst.Integer(str(self.add)))
                out.changed += 1
        if swaps:
            out.module = self.replace(module, swaps)
        return out


def _keyword_lists(fn: cst.FunctionDef, keyword: str) -> list[cst.List]:
    """List literals passed as `keyword=[...]` in any call inside `fn`."""
    found: list[cst.List] = []

    class _V(Walker):
        def visit_Arg(self, node: cst.Arg) -> None:
            if node.keyword is not None and node.keyword.value == keyword and isinstance(node.value, cst.List):
                found.append(node.value)

    _V().walk(fn.body)
    return found


def _int_values(lst: cst.List) -> list[int] | None:
    """The ints of a list made only of int literals (`[9, 10]`), else None."""
    values = []
    for el in lst.elements:
        if not isinstance(el, cst.Element) or not isinstance(el.value, cst.Integer):
            return None
        values.append(int(el.value.evaluated_value))
    return values


def _append(lst: cst.List, node: cst.BaseExpression) -> cst.List:
    """`lst` with `node` last, in its layout: `[9, 10]` -> `[9, 10, 12]`; one per line stays one per line."""
    elements = list(lst.elements)
    if not elements:
        return lst.with_changes(elements=[cst.Element(node)])
    last = elements[-1]
    rb = lst.rbracket.whitespace_before
    if isinstance(rb, cst.ParenthesizedWhitespace):  # `[\n    9,\n    10,\n]`
        lb = lst.lbracket.whitespace_after
        indent = lb.last_line if isinstance(lb, cst.ParenthesizedWhitespace) else cst.SimpleWhitespace("    ")
        sep = cst.ParenthesizedWhitespace(first_line=rb.first_line, empty_lines=[], indent=True, last_line=indent)
        elements[-1] = last.with_changes(comma=cst.Comma(whitespace_after=sep))
        trailing = cst.Comma() if isinstance(last.comma, cst.Comma) else cst.MaybeSentinel.DEFAULT
        elements.append(cst.Element(node, comma=trailing))
        rbracket = lst.rbracket.with_changes(whitespace_before=rb.with_changes(first_line=cst.TrailingWhitespace()))
        return lst.with_changes(elements=elements, rbracket=rbracket)
    elements[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    elements.append(cst.Element(node, comma=last.comma))
    return lst.with_changes(elements=elements)
