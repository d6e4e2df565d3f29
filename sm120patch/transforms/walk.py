"""A read-only libcst visitor that does not rebuild the tree it reads.

`node.visit(CSTVisitor)` reconstructs every node it passes (libcst's `visit` always goes
through `_visit_and_replace_children`, visitors included), which made the transforms'
searches (the taken line's anchors, `or` chains, lists, rules) cost more than parsing the
function. `Walker` has the visitor's contract (`on_visit` returning whether to descend,
`on_leave`, and the `visit_<Node>` / `leave_<Node>` methods they dispatch to) and reads
each node's children off its dataclass fields, in the order libcst's own visit takes them
(`_FIRST` puts the few fields whose declaration order is not their source order first), so
a search finds the same nodes in the same order: tests/unit/test_walk.py holds it against
libcst's visitor on real SGLang modules. Layout and tokens (whitespace, comments,
punctuation, operators) are not entered: nothing searched for lives there.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import libcst as cst
else:  # loaded on first use: validating recipes needs no parser
    from sm120patch.transforms._cst import cst

# fields a node declares after one that comes before them in the source (libcst's visit order)
_FIRST: dict[str, tuple[str, ...]] = {
    "Arg": ("keyword", "value"),
    "ClassDef": ("decorators", "name", "type_parameters", "bases", "keywords", "body"),
    "FunctionDef": ("decorators", "name", "type_parameters", "params", "returns", "body"),
    "IfExp": ("body", "test", "orelse"),
    "For": ("target", "iter", "body", "orelse"),
    "While": ("test", "body", "orelse"),
    "With": ("items", "body"),
    "ExceptHandler": ("type", "name", "body"),
    "ExceptStarHandler": ("type", "name", "body"),
    "MatchCase": ("pattern", "guard", "body"),
    "Parameters": ("posonly_params", "posonly_ind", "params", "star_arg", "kwonly_params", "star_kwarg"),
    "TypeAlias": ("name", "type_parameters", "value"),
}

_ORDER: dict[type, tuple[str, ...]] = {}


@functools.cache
def _skipped() -> tuple[type, ...]:
    """Layout and tokens: whitespace, comments, punctuation, operators (a search reads an
    operator off its expression, `node.operator`, never by visiting it)."""
    return (
        cst.BaseParenthesizableWhitespace,
        cst.EmptyLine,
        cst.TrailingWhitespace,
        cst.Newline,
        cst.Comment,
        cst.Comma,
        cst.Dot,
        cst.Colon,
        cst.Semicolon,
        cst.AssignEqual,
        cst.ImportStar,
        cst.LeftParen,
        cst.RightParen,
        cst.LeftSquareBracket,
        cst.RightSquareBracket,
        cst.LeftCurlyBrace,
        cst.RightCurlyBrace,
        cst.Asynchronous,
        cst.BaseBinaryOp,
        cst.BaseBooleanOp,
        cst.BaseCompOp,
        cst.BaseUnaryOp,
        cst.BaseAugOp,
    )


def _order(kind: type) -> tuple[str, ...]:
    names = _ORDER.get(kind)
    if names is None:
        declared = [f.name for f in fields(kind)]
        first = [n for n in _FIRST.get(kind.__name__, ()) if n in declared]
        names = _ORDER[kind] = (*first, *(n for n in declared if n not in first))
    return names


_ENTER: dict[type, bool] = {}  # a value's type -> is it a node the walker enters (ABC checks are slow)


def _enters(kind: type) -> bool:
    enter = _ENTER.get(kind)
    if enter is None:
        enter = _ENTER[kind] = issubclass(kind, cst.CSTNode) and not issubclass(kind, _skipped())
    return enter


def children(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """A node's children in libcst's visit order, layout and tokens left out; no copy."""
    for name in _ORDER.get(type(node)) or _order(type(node)):
        value = getattr(node, name)
        for item in value if type(value) is list or type(value) is tuple else (value,):
            enter = _ENTER.get(type(item))
            if enter is None:
                enter = _enters(type(item))
            if enter:
                yield item


class Walker:
    """`cst.CSTVisitor`'s read-only half: subclass it as you would the visitor, and call
    `walk(node)` where you would call `node.visit(visitor)`."""

    def on_visit(self, node: cst.CSTNode) -> bool:
        visit = getattr(self, f"visit_{type(node).__name__}", None)
        return visit is None or visit(node) is not False

    def on_leave(self, original: cst.CSTNode) -> None:
        leave = getattr(self, f"leave_{type(original).__name__}", None)
        if leave is not None:
            leave(original)

    def walk(self, node: cst.CSTNode) -> None:
        if self.on_visit(node):
            for child in children(node):
                self.walk(child)
        self.on_leave(node)
