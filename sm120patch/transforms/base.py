"""The contract every transform keeps, and the libcst helpers they share.

A transform is constructed per edit from the recipe's params, then called once
per candidate file with that file's current libcst module. It returns a
`FileOutcome`: the new module (or None), and how many sites it changed or found
already in the desired state. It never raises for "not found": zero sites is an
answer the engine turns into `not-applicable`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import libcst as cst

    Located = list[tuple[cst.FunctionDef, tuple[cst.CSTNode, ...]]]
    Region = tuple[list[cst.BaseStatement], list[cst.BaseStatement], tuple[str, ...]]
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


def dotted(node: cst.BaseExpression) -> str | None:
    """`a.b.c` for a Name/Attribute chain, `f` for a call `f()`; else None."""
    if isinstance(node, cst.Call) and not node.args:
        inner = dotted(node.func)
        return inner
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
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


def iter_functions(module: cst.Module, names: Sequence[str]) -> Iterator[cst.FunctionDef]:
    """Every def (module level or in classes, nested too) whose name is in `names`."""
    yield from (fn for fn, _ in find_functions(module, names))


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


def _blocks(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The statement-holding children of a compound statement or clause, in source order."""
    if isinstance(node, cst.IndentedBlock):
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
    clauses = _clauses()

    def walk(node: cst.CSTNode, path: tuple[cst.CSTNode, ...]) -> None:
        if isinstance(node, cst.FunctionDef) and node.name.value in wanted:
            found.append((node, path))
        inner = (*path, node)
        for child in _blocks(node):
            if isinstance(child, clauses):
                walk(child, inner)

    for stmt in module.body:
        if isinstance(stmt, clauses):
            walk(stmt, (module,))
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


_FIELDS: dict[type, tuple[str, ...]] = {}


def _child_nodes(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """A node's children, read off its dataclass fields: no copy, unlike libcst's own walks."""
    names = _FIELDS.get(type(node))
    if names is None:
        names = _FIELDS[type(node)] = tuple(f.name for f in fields(node))
    for name in names:
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, cst.CSTNode):
                    yield item


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
        for child in _child_nodes(node):
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

    With `located` (functions found in this very module and their paths, from
    `find_functions`), only the nodes on the way down to the keys are rebuilt; every
    other subtree is shared with `module`. Keys must then be those functions or lie
    inside them; if one is not reached, the whole module is walked instead, so the
    result never depends on the shortcut.
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
        splice = _splice_class()(mapping, path)
        new = module.visit(splice)
        if splice.hits == len(mapping) and isinstance(new, cst.Module):
            return new
    full = _splice_class()(mapping, None)
    new = module.visit(full)
    assert isinstance(new, cst.Module)
    return new


# --- regenerating only what changed ----------------------------------------------------------


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


def module_bindings(module: cst.Module) -> set[str]:
    """Names bound at module level by assignment, import, def or class."""
    names: set[str] = set()
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assign):
                    for t in small.targets:
                        if isinstance(t.target, cst.Name):
                            names.add(t.target.value)
                elif isinstance(small, (cst.AnnAssign, cst.AugAssign)) and isinstance(small.target, cst.Name):
                    names.add(small.target.value)
                elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                    for alias in small.names:
                        names.add(_alias_name(alias))
                elif isinstance(small, cst.Import):
                    for alias in small.names:
                        names.add(_alias_name(alias).split(".")[0])
        elif isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            names.add(stmt.name.value)
        elif isinstance(stmt, (cst.If, cst.Try)):
            # `try: from x import y` / `if TYPE_CHECKING:` blocks bind too
            for inner in _nested_simple(stmt):
                for small in inner.body:
                    if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                        names.update(_alias_name(a) for a in small.names)
                    elif isinstance(small, cst.Assign):
                        names.update(t.target.value for t in small.targets if isinstance(t.target, cst.Name))
    return names


def _nested_simple(stmt: cst.CSTNode) -> Iterator[cst.SimpleStatementLine]:
    for child in stmt.children:
        if isinstance(child, cst.SimpleStatementLine):
            yield child
        elif isinstance(child, (cst.IndentedBlock, cst.Else, cst.ExceptHandler, cst.Finally, cst.If)):
            yield from _nested_simple(child)


def _alias_name(alias: cst.ImportAlias) -> str:
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    return cst.Module([]).code_for_node(alias.name)


def rename_token(node: cst.CSTNode, old: str, new: str) -> cst.CSTNode:
    """Copy of `node` with `old` replaced by `new` inside every identifier."""

    class _R(cst.CSTTransformer):
        def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
            return updated.with_changes(value=updated.value.replace(old, new))

    return node.visit(_R())


def names_in(node: cst.CSTNode) -> set[str]:
    """Bare names referenced in an expression (not attribute tails)."""
    found: set[str] = set()

    class _V(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)
            return False

        def visit_Name(self, node: cst.Name) -> None:
            found.add(node.value)

    node.visit(_V())
    return found


def ensure_bound(
    module: cst.Module, name: str, *, sibling: str | None = None, import_from: str | None = None
) -> tuple[cst.Module, str | None]:
    """Make `name` bound at module level, copying how `sibling` is bound.

    A sibling bound by `from m import sibling` gets `name` added next to it; one
    bound by `sibling = <expr>` gets `name = <expr with the token renamed>` right
    after it, and whatever that new expression needs is bound the same way.
    Failing that, `import_from` adds `from <import_from> import name`. Returns the
    new module and None, or the module unchanged and why it could not.
    """
    if name in module_bindings(module):
        return module, None
    if sibling:
        old_tok, new_tok = _differing_token(sibling, name)
        body = list(module.body)
        for i, stmt in enumerate(body):
            if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
                continue
            small = stmt.body[0]
            if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                names = list(small.names)
                for j, alias in enumerate(names):
                    if _alias_name(alias) == sibling and alias.asname is None:
                        body[i] = stmt.with_changes(body=[_insert_alias(small, j, name)])
                        return module.with_changes(body=body), None
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)
                and small.targets[0].target.value == sibling
            ):
                new_value = rename_token(small.value, old_tok, new_tok)
                new_stmt = stmt.with_changes(
                    body=[
                        small.with_changes(
                            targets=[small.targets[0].with_changes(target=cst.Name(name))], value=new_value
                        )
                    ],
                    leading_lines=[],
                )
                body.insert(i + 1, new_stmt)
                module = module.with_changes(body=body)
                # the renamed expression may need names of its own (is_sm120_supported)
                for needed in sorted(names_in(new_value) - names_in(small.value)):
                    old_needed = needed.replace(new_tok, old_tok)
                    module, why = ensure_bound(module, needed, sibling=old_needed, import_from=import_from)
                    if why:
                        return module, why
                return module, None
    if import_from:
        return _add_import(module, import_from, name), None
    return module, f"cannot bind {name}: no module-level {sibling or name} to copy"


def _differing_token(a: str, b: str) -> tuple[str, str]:
    """The part that differs: (`_is_sm100_supported`, `_is_sm120_supported`) -> (`sm100`, `sm120`)."""
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    j = 0
    while j < min(len(a), len(b)) - i and a[-1 - j] == b[-1 - j]:
        j += 1
    # widen to whole alphanumeric runs so `sm100` -> `sm120`, not `0` -> `2`
    while i > 0 and a[i - 1].isalnum():
        i -= 1
    while j > 0 and a[len(a) - j].isalnum():
        j -= 1
    return a[i : len(a) - j], b[i : len(b) - j]


def _insert_alias(imp: cst.ImportFrom, after: int, name: str) -> cst.ImportFrom:
    names = list(imp.names)
    prev = names[after]
    if after + 1 < len(names):
        new = cst.ImportAlias(name=cst.Name(name), comma=prev.comma)
        names.insert(after + 1, new)
    else:  # sibling is last: give it a comma like the one before it
        template = names[after - 1].comma if after > 0 else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        trailing = prev.comma
        names[after] = prev.with_changes(comma=template)
        names.append(cst.ImportAlias(name=cst.Name(name), comma=trailing))
    return imp.with_changes(names=names)


def _add_import(module: cst.Module, from_module: str, name: str) -> cst.Module:
    """Add `name` to an existing `from from_module import ...`, else a new line after the imports."""
    body = list(module.body)
    last_import = -1
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
            small = stmt.body[0]
            if isinstance(small, (cst.Import, cst.ImportFrom)):
                last_import = i
            if (
                isinstance(small, cst.ImportFrom)
                and small.module is not None
                and cst.Module([]).code_for_node(small.module) == from_module
                and not small.relative
                and not isinstance(small.names, cst.ImportStar)
            ):
                body[i] = stmt.with_changes(body=[_insert_alias(small, len(small.names) - 1, name)])
                return module.with_changes(body=body)
    new = cst.parse_statement(f"from {from_module} import {name}\n")
    if last_import == -1 and body and is_docstring(body[0]):
        last_import = 0  # never above the module docstring: it would stop being one
    body.insert(last_import + 1, new)
    return module.with_changes(body=body)


def is_docstring(stmt: cst.BaseStatement) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def replace_node(module: cst.Module, old: cst.CSTNode, new: cst.CSTNode) -> cst.Module:
    """Swap one node (by identity) for another."""
    return module.deep_replace(old, new)  # type: ignore[return-value]
