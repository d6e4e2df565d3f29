"""add-list-item: put a string into a list literal, uncommenting it where upstream commented it out."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar

from sm120patch.transforms.base import (
    FileOutcome,
    Transform,
    need_str,
    need_str_list,
    string_value,
    unknown_keys,
)
from sm120patch.transforms.walk import Walker

if TYPE_CHECKING:
    import libcst as cst
else:  # loaded on first use: validating recipes needs no parser
    from sm120patch.transforms._cst import cst


class AddListItem(Transform):
    NAME: ClassVar[str] = "add-list-item"
    DESCRIPTION: ClassVar[str] = (
        "In the named functions, every list literal holding all `anchors` strings gets "
        '`item`. Where the list carries the item as a comment (`# "item",`), that line is '
        "uncommented in place so the diff is one line; otherwise the item is appended in the "
        "list's own layout. A list that already holds the item is satisfied."
    )
    PARAMS_HELP: ClassVar[str] = 'params = { anchors = ["flashinfer_mxfp4"], item = "flashinfer_cutlass" }'

    @classmethod
    def check_params(cls, params: dict[str, Any], functions: Any) -> str | None:
        problem = (
            unknown_keys(params, ("anchors", "item")) or need_str_list(params, "anchors") or need_str(params, "item")
        )
        if problem:
            return problem
        if not functions:
            return "'functions' must name the functions that hold the list"
        return None

    def __init__(self, params: dict[str, Any], functions: Any) -> None:
        super().__init__(params, functions)
        self.anchors: list[str] = params["anchors"]
        self.item: str = params["item"]
        self.commented = re.compile(r"#\s*(['\"])" + re.escape(self.item) + r"\1\s*,?\s*$")

    def shape(self) -> str:
        return f"list holding {', '.join(repr(a) for a in self.anchors)}"

    def apply(self, module: cst.Module) -> FileOutcome:
        out = FileOutcome()
        swaps: dict[cst.List, cst.List] = {}
        for fn in self.functions_in(module):
            for lst in _lists(fn):
                values = [string_value(e.value) for e in lst.elements]
                if not all(a in values for a in self.anchors):
                    continue
                if self.item in values:
                    out.satisfied += 1
                    continue
                swaps[lst] = self._uncomment(lst) or _append(lst, self.item)
                out.changed += 1
        if swaps:
            out.module = self.replace(module, dict(swaps))
        return out

    def _uncomment(self, lst: cst.List) -> cst.List | None:
        """Turn `# "item",` inside the list into a real element at the same place."""
        new_el = cst.Element(cst.SimpleString(f'"{self.item}"'))
        elements = list(lst.elements)
        # comments after element i live in its comma; after the last one, in the rbracket
        for i, el in enumerate(elements):
            comma = el.comma
            if isinstance(comma, cst.Comma) and isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace):
                pw = comma.whitespace_after
                k = self._find(pw)
                if k is not None:
                    before, after = _split(pw, k)
                    elements[i] = el.with_changes(comma=comma.with_changes(whitespace_after=before))
                    elements.insert(i + 1, new_el.with_changes(comma=cst.Comma(whitespace_after=after)))
                    return lst.with_changes(elements=elements)
        rb = lst.rbracket.whitespace_before
        if elements and isinstance(rb, cst.ParenthesizedWhitespace):
            k = self._find(rb)
            last = elements[-1]
            if k is not None and isinstance(last.comma, cst.Comma):
                before, after = _split(rb, k)
                elements[-1] = last.with_changes(comma=last.comma.with_changes(whitespace_after=before))
                elements.append(new_el.with_changes(comma=cst.Comma()))
                return lst.with_changes(elements=elements, rbracket=lst.rbracket.with_changes(whitespace_before=after))
        return None

    def _find(self, pw: cst.ParenthesizedWhitespace) -> int | None:
        for k, line in enumerate(pw.empty_lines):
            if line.comment is not None and self.commented.match(line.comment.value):
                return k
        return None


def _split(pw: cst.ParenthesizedWhitespace, k: int) -> tuple[cst.ParenthesizedWhitespace, cst.ParenthesizedWhitespace]:
    """Whitespace before and after the commented line k, which becomes an element."""
    line = pw.empty_lines[k]
    before = pw.with_changes(empty_lines=pw.empty_lines[:k], indent=line.indent, last_line=line.whitespace)
    after = cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(),
        empty_lines=pw.empty_lines[k + 1 :],
        indent=pw.indent,
        last_line=pw.last_line,
    )
    return before, after


def _append(lst: cst.List, item: str) -> cst.List:
    elements = list(lst.elements)
    new_el = cst.Element(cst.SimpleString(f'"{item}"'))
    if not elements:
        return lst.with_changes(elements=[new_el])
    last = elements[-1]
    rb = lst.rbracket.whitespace_before
    multiline = isinstance(rb, cst.ParenthesizedWhitespace)
    if multiline:
        # one element per line: reuse the indentation of the first element's line
        lb = lst.lbracket.whitespace_after
        indent = lb.last_line if isinstance(lb, cst.ParenthesizedWhitespace) else cst.SimpleWhitespace("    ")
        assert isinstance(rb, cst.ParenthesizedWhitespace)
        # the last element's trailing comment (`"x",  # note`) stays on its line
        sep = cst.ParenthesizedWhitespace(first_line=rb.first_line, empty_lines=[], indent=True, last_line=indent)
        elements[-1] = last.with_changes(comma=cst.Comma(whitespace_after=sep))
        elements.append(new_el.with_changes(comma=cst.Comma()) if isinstance(last.comma, cst.Comma) else new_el)
        rbracket = lst.rbracket.with_changes(whitespace_before=rb.with_changes(first_line=cst.TrailingWhitespace()))
        return lst.with_changes(elements=elements, rbracket=rbracket)
    else:
        trailing = last.comma
        elements[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        elements.append(new_el.with_changes(comma=trailing))
    return lst.with_changes(elements=elements)


def _lists(fn: cst.FunctionDef) -> list[cst.List]:
    found: list[cst.List] = []

    class _V(Walker):
        def visit_List(self, node: cst.List) -> None:
            found.append(node)

    _V().walk(fn.body)
    return found
