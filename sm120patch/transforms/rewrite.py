"""Fast rewrites for big modules: find named defs and swap nodes without walking the whole tree.

A libcst visitor rebuilds every node it passes, so walking SGLang's 5,000-line
server_args.py for each edit dominated `plan`. Defs are always statements, so
`find_functions` walks statements only and records the way down to each def;
`replace_nodes` rebuilds just the nodes on that way; `splice_code` regenerates only
the statements that changed when a second recipe edits a file. Each has a slow,
obvious twin it must agree with (tests/unit/test_plan_speed.py, SM120PATCH_CHECK_SPLICE).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING

from sm120patch.transforms.walk import children

if TYPE_CHECKING:
    import libcst as cst

    Located = list[tuple[cst.FunctionDef, tuple[cst.CSTNode, ...]]]
    Region = tuple[list[cst.BaseStatement], list[cst.BaseStatement], tuple[str, ...]]
else:  # loaded on first use: validating recipes needs no parser
    from sm120patch.transforms._cst import cst


# A def is always a statement: it sits in a block of the module, of a compound statement,
# or of one of these clauses. Walking only these finds every def without visiting the
# expressions (most of a module's nodes), and records the way down to each.
@functools.cache
def _clauses() -> tuple[type, ...]:
    return (
        cst.BaseCompoundStatement,
        cst.IndentedBlock,
        cst.Else,
        cst.ExceptHandler,
        cst.Finally,
        cst.MatchCase,
    ) + tuple(t for t in (getattr(cst, "ExceptStarHandler", None),) if t is not None)


@functools.cache
def _is_clause(kind: type) -> bool:
    """`isinstance(node, _clauses())` by the node's type, once per type (ABC checks are slow)."""
    return issubclass(kind, _clauses())


def _blocks(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The statement-holding children of a compound statement or clause, in source order."""
    if type(node) is cst.IndentedBlock:
        yield from node.body
        return
    body = getattr(node, "body", None)
    if isinstance(body, cst.CSTNode):
        yield body
    yield from getattr(node, "handlers", ())
    yield from getattr(node, "cases", ())
    for attr in ("orelse", "finalbody"):
        sub = getattr(node, attr, None)
        if sub is not None:
            yield sub


def find_functions(module: cst.Module, names: Sequence[str]) -> Located:
    """Like `iter_functions`, in the same (source) order, each def with the chain of nodes
    from the module down to it (the module first, the def itself not included)."""
    wanted = set(names)
    found: Located = []
    function = cst.FunctionDef

    def walk(node: cst.CSTNode, path: tuple[cst.CSTNode, ...]) -> None:
        if type(node) is function and node.name.value in wanted:  # type: ignore[attr-defined]
            found.append((node, path))  # type: ignore[arg-type]
        inner = (*path, node)
        for child in _blocks(node):
            if _is_clause(type(child)):
                walk(child, inner)

    for stmt in module.body:
        if _is_clause(type(stmt)):
            walk(stmt, (module,))
    return found


def find_ifs(fn: cst.FunctionDef) -> list[cst.If]:
    """Every `if` statement (an `elif` too) in a def's body, in source order: what a libcst
    visitor's `visit_If` sees, found like `find_functions` by walking statements only (an `if`
    is always a statement), so no expression node is visited or rebuilt."""
    found: list[cst.If] = []
    if_ = cst.If

    def walk(node: cst.CSTNode) -> None:
        if type(node) is if_:
            found.append(node)  # type: ignore[arg-type]
        for child in _blocks(node):
            if _is_clause(type(child)):
                walk(child)

    if isinstance(fn.body, cst.IndentedBlock):
        walk(fn.body)
    return found


@functools.cache
def _splice_class() -> type:
    """The transformer `replace_nodes` runs, defined on first use (libcst loads lazily)."""

    class _Splice(cst.CSTTransformer):
        """Swaps nodes by identity, descending only into the nodes in `path` (None: everywhere)."""

        def __init__(self, mapping: dict[cst.CSTNode, cst.CSTNode], path: set[int] | None) -> None:
            self.mapping = mapping
            self.path = path
            self.hits = 0

        def on_visit(self, node: cst.CSTNode) -> bool:
            return self.path is None or id(node) in self.path

        def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
            new = self.mapping.get(original)
            if new is None:
                return updated
            self.hits += 1
            return new

    return _Splice


def _paths_to(roots: Sequence[cst.CSTNode], targets: set[int]) -> set[int]:
    """Ids of the nodes strictly between a root (included) and each target inside it."""
    path: set[int] = set()
    left = set(targets)
    chain: list[cst.CSTNode] = []

    def walk(node: cst.CSTNode) -> None:
        if id(node) in left:
            left.discard(id(node))
            path.update(map(id, chain))
        chain.append(node)  # a target may hold another: keep walking inside it
        for child in children(node):  # no key is layout or a token; if one were, replace_nodes walks it all
            if not left:
                break
            walk(child)
        chain.pop()

    for root in roots:
        if not left:
            break
        walk(root)
    return path


def replace_nodes(
    module: cst.Module, mapping: dict[cst.CSTNode, cst.CSTNode], located: Located | None = None
) -> cst.Module:
    """`module` with each key of `mapping` swapped for its value (by identity), as one
    transformer over the whole module would do it (an outer swap wins over an inner one).

    Only the nodes on the way down to the keys are rebuilt; every other subtree is shared
    with `module`. The way is read off the functions in `located` (found in this very module
    with their paths, by `find_functions`; keys must then be those functions or lie inside
    them), else off the module's fields. If a key is not reached, the whole module is
    walked instead, so the result never depends on the shortcut.
    """
    if not mapping:
        return module
    if located:
        fns = {id(fn) for fn, _ in located}
        inner = [fn for fn, _ in located if fn not in mapping]
        path = _paths_to(inner, {id(k) for k in mapping} - fns)
        for fn, chain in located:
            if fn in mapping or id(fn) in path:
                path.update(map(id, chain))
    else:  # the way down from the module, found by reading fields (no rebuild) and stopping at the last key
        path = _paths_to([module], {id(k) for k in mapping})
    if path:
        splice = _splice_class()(mapping, path)
        new = module.visit(splice)
        if splice.hits == len(mapping) and isinstance(new, cst.Module):
            return new
    full = _splice_class()(mapping, None)
    new = module.visit(full)
    assert isinstance(new, cst.Module)
    return new


def _same_except(a: cst.CSTNode, b: cst.CSTNode, skip: str) -> bool:
    """Every field but `skip` holds the same nodes (by identity) or equal plain values."""
    for f in fields(a):
        if f.name == skip:
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if x is y:
            continue
        if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            if len(x) != len(y) or any(
                i is not j and (isinstance(i, cst.CSTNode) or i != j) for i, j in zip(x, y, strict=True)
            ):
                return False
        elif isinstance(x, cst.CSTNode) or x != y:
            return False
    return True


def _diff_block(
    old: Sequence[cst.BaseStatement],
    new: Sequence[cst.BaseStatement],
    indent: tuple[str, ...],
    default_indent: str,
    regions: list[Region],
) -> bool:
    """The runs of statements that differ between two versions of one block (module or
    indented), descending into a compound statement whose only change is inside its body."""
    p = 0
    while p < len(old) and p < len(new) and old[p] is new[p]:
        p += 1
    s = 0
    while s < len(old) - p and s < len(new) - p and old[len(old) - 1 - s] is new[len(new) - 1 - s]:
        s += 1
    om, nm = list(old[p : len(old) - s]), list(new[p : len(new) - s])
    if not om and not nm:
        return True
    if len(om) == 1 and len(nm) == 1 and type(om[0]) is type(nm[0]):
        a, b = om[0], nm[0]
        ab, bb = getattr(a, "body", None), getattr(b, "body", None)
        if (
            isinstance(ab, cst.IndentedBlock)
            and isinstance(bb, cst.IndentedBlock)
            and _same_except(a, b, "body")
            and _same_except(ab, bb, "body")
        ):
            step = default_indent if ab.indent is None else ab.indent
            return _diff_block(ab.body, bb.body, (*indent, step), default_indent, regions)
    if not om:  # an insertion: take in a one-line neighbour, so the region has text to find
        if p > 0 and isinstance(old[p - 1], cst.SimpleStatementLine):
            om, nm = [old[p - 1]], [old[p - 1], *nm]
        elif s > 0 and isinstance(old[len(old) - s], cst.SimpleStatementLine):
            om, nm = [old[len(old) - s]], [*nm, old[len(old) - s]]
        else:
            return False
    regions.append((om, nm, indent))
    return True


def splice_code(old: cst.Module, old_text: str, new: cst.Module) -> str | None:
    """`new.code`, made from `old_text` (which must be exactly `old.code`) by regenerating
    only the statements that differ between `old` and `new`; None when it cannot tell
    (then generate the whole module). `new` must come from `old` by swapping nodes, as the
    transforms do: untouched statements are the same objects in both.

    A statement's code depends only on the statement and the indentation it sits at, and
    a block's code is its statements' code back to back, so each run of changed
    statements is regenerated at its indentation and put where its old code was: found
    by its text, which must occur exactly once in `old_text`.
    """
    try:
        from libcst._nodes.internal import CodegenState
    except ImportError:  # pragma: no cover - a libcst that moved it: generate everything
        return None
    if (old.encoding, old.default_indent, old.default_newline, old.has_trailing_newline) != (
        new.encoding,
        new.default_indent,
        new.default_newline,
        new.has_trailing_newline,
    ) or not (_same_except(old, new, "body")):
        return None
    regions: list[Region] = []
    if not _diff_block(old.body, new.body, (), old.default_indent, regions):
        return None

    def gen(nodes: Sequence[cst.CSTNode], indent: tuple[str, ...]) -> str:
        state = CodegenState(
            default_indent=new.default_indent, default_newline=new.default_newline, indent_tokens=list(indent)
        )
        for n in nodes:
            n._codegen(state)
        return "".join(state.tokens)

    edits = []
    for om, nm, indent in regions:
        before = gen(om, indent)
        at = old_text.find(before)
        if not before or at < 0 or old_text.find(before, at + 1) >= 0:
            return None
        edits.append((at, at + len(before), gen(nm, indent)))
    edits.sort()
    out, pos = [], 0
    for start, end, text in edits:
        if start < pos:
            return None
        out += [old_text[pos:start], text]
        pos = end
    out.append(old_text[pos:])
    return "".join(out)
