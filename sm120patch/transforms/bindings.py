"""Names a rewrite introduces must be bound: flags copied beside their siblings, imports added.

`widen-arch-test` turns `_is_sm100_supported` into `_is_sm120_supported`; this makes
sure the module defines it the way it defines its sibling (a copied assignment with the
token renamed, or one more name in the same `from ... import`), never guessing otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from sm120patch.transforms.walk import Walker

if TYPE_CHECKING:
    import libcst as cst
else:  # loaded on first use: validating recipes needs no parser
    from sm120patch.transforms._cst import cst


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


def unbound_reads(source: str, functions: Sequence[str] = ()) -> set[str]:
    """Global names the named functions (all code, when none are named) read that the module
    never binds and builtins do not provide, by `symtable`: what a gate someone opened by hand
    would raise NameError on. A star import binds what it likes, so then nothing is claimed."""
    import builtins
    import symtable

    try:
        top = symtable.symtable(source, "<module>", "exec")
    except (SyntaxError, ValueError):
        return set()
    symbols = top.get_symbols()
    if "*" in {s.get_name() for s in symbols}:
        return set()
    bound = {s.get_name() for s in symbols if s.is_assigned() or s.is_imported() or s.is_namespace()}
    wanted = {f.rsplit(".", 1)[-1] for f in functions}
    read: set[str] = set()

    def walk(table: symtable.SymbolTable, inside: bool) -> None:
        inside = inside or not wanted or (table.get_type() == "function" and table.get_name() in wanted)
        if inside:
            for s in table.get_symbols():
                if s.is_referenced() and (s.is_global() or (table is top and not s.is_assigned())):
                    read.add(s.get_name())
        for child in table.get_children():
            walk(child, inside)

    walk(top, False)
    return {n for n in read - bound if not hasattr(builtins, n) and n not in ("__file__", "__name__", "__spec__")}


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

    class _V(Walker):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            self.walk(node.value)
            return False

        def visit_Name(self, node: cst.Name) -> None:
            found.add(node.value)

    _V().walk(node)
    return found


def ensure_bound(
    module: cst.Module, name: str, *, sibling: str | None = None, import_from: str | None = None
) -> tuple[cst.Module, str | None]:
    """Make `name` bound at module level, copying how `sibling` is bound.

    Wherever the module binds `sibling` (at top level or inside a module-level `if`/`try`,
    in every branch that does): a `from m import sibling` gets `name` added next to it, and a
    `sibling = <expr>` gets `name = <expr with the token renamed>` right after it; whatever
    that new expression needs is bound the same way. Failing that, `import_from` adds
    `from <import_from> import name`, but only for a public name: a private flag
    (`_is_sm120_supported`) exists in no module to import it from. Returns the new module
    and None, or the module unchanged and why it could not.
    """
    if name in module_bindings(module):
        return module, None
    if sibling:
        old_tok, new_tok = _differing_token(sibling, name)
        copier = _Copier(sibling, name, old_tok, new_tok)
        body = copier.block(list(module.body))
        if copier.found:
            module = module.with_changes(body=body)
            # the renamed expressions may need names of their own (is_sm120_supported)
            for needed in sorted(copier.needs):
                old_needed = needed.replace(new_tok, old_tok)
                module, why = ensure_bound(module, needed, sibling=old_needed, import_from=import_from)
                if why:
                    return module, why
            return module, None
    if import_from and not name.startswith("_"):
        return _add_import(module, import_from, name), None
    return module, f"cannot bind {name}: no module-level {sibling or name} to copy"


class _Copier:
    """Adds `name` beside every module-level binding of `sibling`, descending into `if`/`try`."""

    def __init__(self, sibling: str, name: str, old_tok: str, new_tok: str) -> None:
        self.sibling, self.name, self.old_tok, self.new_tok = sibling, name, old_tok, new_tok
        self.found = False
        self.needs: set[str] = set()

    def block(self, stmts: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for stmt in stmts:
            if isinstance(stmt, cst.SimpleStatementLine):
                new, extra = self._line(stmt)
                out.append(new)
                if extra is not None:
                    out.append(extra)
            elif isinstance(stmt, (cst.If, cst.Try)):
                out.append(self._compound(stmt))
            else:
                out.append(stmt)
        return out

    def _compound(self, node: cst.CSTNode) -> cst.CSTNode:
        changes: dict[str, object] = {}
        body = getattr(node, "body", None)
        if isinstance(body, cst.IndentedBlock):
            changes["body"] = body.with_changes(body=self.block(list(body.body)))
        for attr in ("orelse", "finalbody"):
            sub = getattr(node, attr, None)
            if sub is not None:
                changes[attr] = self._compound(sub)
        handlers = getattr(node, "handlers", None)
        if handlers:
            changes["handlers"] = [self._compound(h) for h in handlers]
        return node.with_changes(**changes) if changes else node

    def _line(self, stmt: cst.SimpleStatementLine) -> tuple[cst.SimpleStatementLine, cst.SimpleStatementLine | None]:
        if len(stmt.body) != 1:
            return stmt, None
        small = stmt.body[0]
        if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
            for j, alias in enumerate(small.names):
                if _alias_name(alias) == self.sibling and alias.asname is None:
                    self.found = True
                    return stmt.with_changes(body=[_insert_alias(small, j, self.name)]), None
        if (
            isinstance(small, cst.Assign)
            and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name)
            and small.targets[0].target.value == self.sibling
        ):
            self.found = True
            new_value = rename_token(small.value, self.old_tok, self.new_tok)
            self.needs |= names_in(new_value) - names_in(small.value)
            copy = stmt.with_changes(
                body=[
                    small.with_changes(
                        targets=[small.targets[0].with_changes(target=cst.Name(self.name))], value=new_value
                    )
                ],
                leading_lines=[],
            )
            return stmt, copy
        return stmt, None


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
