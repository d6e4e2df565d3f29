"""`transforms.walk.Walker` meets the nodes libcst's own visitor meets, in its order, without
rebuilding them. The oracle is libcst's `CSTVisitor` run over the same module: on code written
to hold every statement and expression kind, on sm120patch's own sources, and on real SGLang
modules the recipes search (the release cache, as the integration tests fetch it).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import libcst as cst
import pytest

import sm120patch
from sm120patch.transforms.walk import Walker, _order, _skipped

EVERY_KIND = '''\
"""doc"""
from __future__ import annotations
import os, sys as system
from a.b import (c, d as e)

@decorator(arg, key=value)
@other.attr
class K(Base, metaclass=Meta, **extra):
    x: int = 1
    def m(self, a, /, b: int = 2, *args, c, d=3, **kw) -> "K":
        return self

@wraps
async def g(p=lambda q, *r: q + r[0], *, s=[i for i in range(3) if i if not i]):
    global G
    nonlocal_free = {k: v for k, v in items() if k} | {1, 2} | {*a, *b}
    t = (yield) if p else (yield from gen())
    u = await coro() if (w := f(x=1, *y, **z)) else None
    del t[0], u.attr, nonlocal_free[1:2:3]
    assert p, f"{p!r:>{width}} and {q}"
    async with A() as a, B():
        async for i, (j, k) in pairs:
            while i < j <= k is not None:
                i += 1
                if i in ks or i not in js and not -i:
                    break
                elif i @ j:
                    continue
                else:
                    pass
            else:
                raise E("x") from err
    try:
        ok()
    except (ValueError, TypeError) as err:
        pass
    else:
        x = a if b else c if d else e
    finally:
        y = ~a ** -b // c % d << e >> f & g ^ h
    try:
        ok()
    except* OSError as group:
        pass
    match command:
        case Point(x=0, y=0) | [1, 2, *rest] | {"k": v, **kw} if v:
            z = 1
        case str() as s:
            z = 2
        case _:
            z = 3
    return t[a, b:c, ...], "a" "b" f"c{d}", b"x", 1.5j, 0x1F
'''


class _Seen(cst.CSTVisitor):
    """libcst's own order: every node its visitor is handed, but layout and tokens."""

    def __init__(self) -> None:
        self.nodes: list[int] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if not isinstance(node, _skipped()):
            self.nodes.append(id(node))
        return True


class _Walked(Walker):
    def __init__(self) -> None:
        self.nodes: list[int] = []
        self.left: list[int] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append(id(node))
        return True

    def on_leave(self, original: cst.CSTNode) -> None:
        self.left.append(id(original))


def _same_order(code: str) -> None:
    module = cst.parse_module(code)
    theirs, mine = _Seen(), _Walked()
    module.visit(theirs)
    mine.walk(module)
    assert mine.nodes == theirs.nodes
    assert sorted(mine.left) == sorted(mine.nodes)  # every node entered is left, once


def test_every_statement_and_expression_kind_in_libcsts_order() -> None:
    _same_order(EVERY_KIND)


@pytest.mark.parametrize(
    "rel",
    sorted(
        str(p.relative_to(Path(sm120patch.__file__).parent)) for p in Path(sm120patch.__file__).parent.rglob("*.py")
    )[::7],
)
def test_sm120patchs_own_modules_in_libcsts_order(rel: str) -> None:
    _same_order((Path(sm120patch.__file__).parent / rel).read_text(encoding="utf-8"))


@pytest.mark.releases
@pytest.mark.parametrize(
    ("version", "rel"),
    [
        ("0.5.9", "sglang/srt/server_args.py"),
        ("0.5.9", "sglang/srt/model_executor/model_runner.py"),
        ("0.5.23", "sglang/srt/arg_groups/overrides.py"),
        ("0.5.23", "sglang/srt/layers/quantization/modelopt_quant.py"),
    ],
)
def test_real_sglang_modules_in_libcsts_order(version: str, rel: str) -> None:
    from tests.conftest import pristine_or_skip

    tree = pristine_or_skip("sglang", version)
    _same_order((tree / rel).read_text(encoding="utf-8"))


def test_a_visit_method_that_returns_false_keeps_the_walker_out() -> None:
    """The `visit_<Node>` dispatch as libcst's: False stops the descent, None does not."""
    module = cst.parse_module("f(g(1), h.i)\n")
    names: list[str] = []

    class _V(Walker):
        def visit_Call(self, node: cst.Call) -> bool | None:
            return None if isinstance(node.func, cst.Name) and node.func.value == "f" else False

        def visit_Name(self, node: cst.Name) -> None:
            names.append(node.value)

    _V().walk(module)
    assert names == ["f", "h", "i"]  # g's call was not entered; f's and h.i's were


# the fields that only ever hold layout or tokens (the walker enters none of them)
LAYOUT = re.compile(
    r"^(whitespace.*|leading_lines|lines_after_decorators|header|footer|trailing_whitespace|leading_whitespace"
    r"|lpar|rpar|lbracket|rbracket|lbrace|rbrace|comma|dot|colon|semicolon|equal|first_colon|second_colon"
    r"|operator|asynchronous|relative|trailing_comma)$"
)


def _libcst_order(kind: type) -> list[str] | None:
    """The fields in the order libcst's own `_visit_and_replace_children` visits them, read from
    its source (each `visit_*(self, "field", ...)` names the field), layout left out."""
    try:
        src = inspect.getsource(kind._visit_and_replace_children)  # type: ignore[attr-defined]
    except (TypeError, OSError):
        return None
    names = [f.name for f in dataclasses.fields(kind)]
    seq: list[str] = []
    for m in re.finditer(r'"(\w+)"', src):
        if m.group(1) in names and m.group(1) not in seq and not LAYOUT.match(m.group(1)):
            seq.append(m.group(1))
    return seq


NODE_KINDS = sorted(
    name
    for name in dir(cst)
    if isinstance(getattr(cst, name), type)
    and issubclass(getattr(cst, name), cst.CSTNode)
    and dataclasses.is_dataclass(getattr(cst, name))
)


def test_every_node_kind_of_this_libcst_is_walked_in_its_visit_order() -> None:
    """All of libcst's node kinds, not just those the sample code holds: a libcst release that
    reorders a node's visit, or adds a kind whose fields are declared out of source order,
    fails here with the kind named."""
    checked, wrong = 0, []
    for name in NODE_KINDS:
        theirs = _libcst_order(getattr(cst, name))
        if theirs is None:
            continue
        checked += 1
        mine = [f for f in _order(getattr(cst, name)) if f in theirs]
        if mine != theirs:
            wrong.append(f"{name}: libcst {theirs}, walker {mine}")
    assert checked > 100, checked  # the source was readable: the check looked
    assert not wrong, "; ".join(wrong)
