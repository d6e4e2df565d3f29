"""Find every architecture-gated site in Python source by its syntax tree.

A file is parsed only when a fast byte search finds a word that can start a gate in it (a
predicate's name, a capability call, `supported_major_versions`); most of SGLang's ~4,700 files
never are. Parsing is Python's `ast` (we read, never write). A site is the largest expression
around a GPU-reading atom that is still a test (`_is_sm90_supported or _is_sm100_supported`, not
the two halves), placed in the statement that uses it. A name bound to such a test (a module flag
`_is_sm100 = _is_cuda and is_sm100_supported()`, a local `major, _ = get_device_capability()`) is
a definition, not a site: where it is used is.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

from sm120patch.arch import Arch
from sm120patch.gates.evaluate import (
    ARCHS,
    CAPABILITY_CALLS,
    PREDICATE_RX,
    SM_CALLS,
    UNK,
    Evaluator,
    Scope,
    bind_locals,
    function_admits,
    names,
)
from sm120patch.gates.predicates import ReleasePredicates
from sm120patch.gates.site import Predicate, Site

# parents through which a site's test grows: `not X`, `X or Y`, `cap >= (9, 0)`, `cap[0]`, `sm // 10`
_GROW = (ast.BoolOp, ast.UnaryOp, ast.Compare, ast.BinOp)
JIT_KWARG = "supported_major_versions"
CC_DECORATOR = "supported_compute_capability"


def prefilter(words: Iterable[str]) -> re.Pattern[bytes]:
    """One regex over the bytes of a file for every word that can start a gate."""
    alt = b"|".join(re.escape(w.encode()) for w in sorted(set(words), key=len, reverse=True))
    return re.compile(rb"is_sm\d|is_blackwell|is_hopper|" + alt)


class _Lines:
    """A file's lines, for source segments without re-splitting the text per site."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines(keepends=True)

    def segment(self, node: ast.AST) -> str:
        l1, l2 = node.lineno - 1, (node.end_lineno or node.lineno) - 1  # type: ignore[attr-defined]
        c1, c2 = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
        if l1 == l2:
            return _cols(self.lines[l1], c1, c2)
        first = _cols(self.lines[l1], c1, None)
        last = _cols(self.lines[l2], 0, c2)
        return first + "".join(self.lines[l1 + 1 : l2]) + last

    def text(self, first: int, last: int) -> str:
        return "".join(self.lines[first - 1 : last])


def _cols(line: str, c1: int, c2: int | None) -> str:
    raw = line.encode("utf-8")
    return raw[c1:c2].decode("utf-8", errors="replace")


def _digest(node: ast.AST) -> str:
    return hashlib.sha1(ast.dump(node).encode()).hexdigest()[:16]


def _ident(node: ast.AST) -> str | None:
    """The name a node could be a predicate by: `x`, `a.x`, `x(...)`, `a.x(...)`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


class FileScan:
    """The sites and module flags of one parsed file.

    One walk of the tree records each node's parent and the nodes whose name could read the GPU
    (a predicate, a capability call, a platform attribute, a name bound to one of those); only
    those are evaluated, each in the scope of the function around it (its local bindings over
    the module's)."""

    def __init__(self, package: str, rel: str, text: str, tree: ast.Module, release: ReleasePredicates) -> None:
        self.package, self.rel, self.tree = package, rel, tree
        self.lines = _Lines(text)
        self.sites: list[Site] = []
        self.flags: list[Predicate] = []
        preds = dict(release.predicates)
        base = Scope(preds, release.platform, release.platform_values)
        # this file's own predicate functions (`def _is_sm10x(): ...`) join its scope
        self._own: list[Predicate] = []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and PREDICATE_RX.match(node.name):
                preds[node.name] = function_admits(node, base)
                self._own.append(Predicate(node.name, rel, node.lineno, names(preds[node.name]), "module"))
        self.words = {*preds, *release.platform, *release.platform_values, *CAPABILITY_CALLS, *SM_CALLS}
        if package == "flashinfer":
            self.words = {CC_DECORATOR}
        self.module_local = bind_locals(tree.body)
        self.scope = base.child(dict(self.module_local))
        self._parents: dict[int, ast.AST] = {}
        self._candidates: list[ast.AST] = []
        self._names: dict[str, list[ast.Name]] = {}
        self._keywords: list[ast.keyword] = []
        stack: list[ast.AST] = [tree]
        while stack:
            parent = stack.pop()
            for child in ast.iter_child_nodes(parent):
                self._parents[id(child)] = parent
                stack.append(child)
                if isinstance(child, ast.Name):
                    self._names.setdefault(child.id, []).append(child)
                    if child.id in self.words or PREDICATE_RX.match(child.id):
                        self._candidates.append(child)
                elif isinstance(child, ast.Attribute):
                    if child.attr in self.words or PREDICATE_RX.match(child.attr):
                        self._candidates.append(child)
                elif isinstance(child, ast.keyword) and child.arg == JIT_KWARG:
                    self._keywords.append(child)
        self._seen: set[int] = set()
        self._fn_scope: dict[int, tuple[list[str], Evaluator, bool]] = {}
        self._module_ev = Evaluator(self.scope)

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self._parents.get(id(node))

    def _flagged_names(self) -> None:
        """Names bound (anywhere in the file) to an expression around a candidate are candidates
        too, to a fixpoint: `use_x = _is_sm100 and y` makes `use_x` one."""
        bound: set[str] = set()
        frontier = list(self._candidates)
        while frontier:
            new: list[ast.AST] = []
            for node in frontier:
                cur: ast.AST | None = node
                while cur is not None and not isinstance(cur, ast.stmt):
                    cur = self.parent(cur)
                if isinstance(cur, (ast.Assign, ast.AnnAssign)):
                    targets = cur.targets if isinstance(cur, ast.Assign) else [cur.target]
                    for t in targets:
                        for n in ast.walk(t):
                            if isinstance(n, ast.Name) and n.id not in bound:
                                bound.add(n.id)
                                new.extend(x for x in self._names.get(n.id, ()) if isinstance(x.ctx, ast.Load))
            self._candidates.extend(new)
            frontier = new

    def _scope_of(self, node: ast.AST) -> tuple[list[str], Evaluator, bool]:
        """(qualified name, evaluator with the enclosing functions' locals, inside a predicate)."""
        chain: list[ast.AST] = []
        cur = self.parent(node)
        while cur is not None:
            if isinstance(cur, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                chain.append(cur)
            cur = self.parent(cur)
        chain.reverse()
        key = id(chain[-1]) if chain else 0
        hit = self._fn_scope.get(key)
        if hit is None:
            local = dict(self.module_local)
            for fn in chain:
                if isinstance(fn, ast.ClassDef):
                    continue
                for arg in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs:
                    local.pop(arg.arg, None)  # a parameter shadows a module flag
                local.update(bind_locals(fn.body))
            ev = Evaluator(self.scope.child(local)) if chain else self._module_ev
            fns = [f for f in chain if not isinstance(f, ast.ClassDef)]
            in_pred = bool(fns) and bool(PREDICATE_RX.match(fns[-1].name))  # type: ignore[attr-defined]
            hit = ([c.name for c in chain], ev, in_pred)  # type: ignore[attr-defined]
            self._fn_scope[key] = hit
        return hit

    def run(self) -> FileScan:
        ev = self._module_ev
        if self.package == "sglang":
            self.flags.extend(self._own)
            for name, value in self.module_local.items():
                if ev.reads_gpu(value) and ev.is_test(value):
                    self.flags.append(Predicate(name, self.rel, value.lineno, names(ev.admits(value)), "module"))
            self._flagged_names()
            for node in sorted(self._candidates, key=lambda n: (n.lineno, n.col_offset)):  # type: ignore[attr-defined]
                qual, fev, in_pred = self._scope_of(node)
                if fev.is_atom(node):
                    self._site(node, qual, fev, in_pred)
                elif isinstance(self.parent(node), ast.Call) and fev.is_atom(self.parent(node)):  # type: ignore[arg-type]
                    self._site(self.parent(node), qual, fev, in_pred)  # type: ignore[arg-type]
        else:
            for kw in self._keywords:
                call = self.parent(kw)
                if isinstance(call, ast.Call):
                    qual, fev, _ = self._scope_of(call)
                    self._flashinfer_call(call, qual, fev)
            for node in self._candidates:
                call = self.parent(node)
                if isinstance(call, ast.Call) and call.func is node:
                    qual, fev, _ = self._scope_of(call)
                    self._flashinfer_call(call, qual, fev, decorator_only=True)
        return self

    def _root(self, node: ast.AST) -> ast.AST:
        while True:
            parent = self.parent(node)
            grows = isinstance(parent, _GROW) or (
                isinstance(parent, ast.Call) and parent.func is node
            )  # `x(...)`: the call, not the name
            grows = grows or (isinstance(parent, (ast.Subscript, ast.Attribute)) and parent.value is node)
            if grows:
                node = parent
            else:
                return node

    def _site(self, atom: ast.AST, qual: list[str], ev: Evaluator, predicate_fn: bool) -> None:
        root = self._root(atom)
        if id(root) in self._seen:
            return
        self._seen.add(id(root))
        if not ev.is_test(root):
            return
        parent = self.parent(root)
        kind, guard, body = _context(root, parent, self.parent)
        if kind in ("definition", "return") and predicate_fn:
            return  # a predicate's own definition, or a flag: its uses are the sites
        if kind == "definition":
            return
        admits = ev.admits(root)
        path = ev.can_be_false(root) if guard else admits
        if not self._direct(root, ev):
            values = [ev.value(root, a) for a in ARCHS]
            if len({repr(v) for v in values}) == 1 and values[0] is not UNK:
                return  # reads the GPU only through a local value that is the same on every arch we know

        stmt = body if body is not None else root
        ctx_node = _context_span(root, parent, self.parent)
        self.sites.append(
            Site(
                package=self.package,
                file=self.rel,
                function=".".join(qual) or "<module>",
                line=root.lineno,  # type: ignore[attr-defined]
                end_line=root.end_lineno or root.lineno,  # type: ignore[attr-defined]
                test=self.lines.segment(root),
                kind=kind,
                admits=names(admits),
                path=names(path),
                guard=guard,
                norm_test=ast.unparse(root),
                norm_body=_digest(stmt),
                context=_context_text(self.lines, ctx_node, qual),
                defined_at=self._definitions(root, ev),
            )
        )

    @staticmethod
    def _direct(root: ast.AST, ev: Evaluator) -> bool:
        """The test names a predicate or a capability itself, not only a local bound to one."""
        return any(ev.is_atom(n) and not (isinstance(n, ast.Name) and n.id in ev.scope.local) for n in ast.walk(root))

    def _definitions(self, root: ast.AST, ev: Evaluator) -> list[tuple[int, int]]:
        """Where the flags a test reads are bound (`is_x = major == 12 and ...`; `if is_x:`): an
        edit there changes the gate too."""
        out = []
        for n in ast.walk(root):
            if isinstance(n, ast.Name) and n.id in ev.scope.local:
                value = ev.scope.local[n.id]
                while isinstance(value, ast.Subscript) and not hasattr(value, "lineno"):
                    value = value.value
                if hasattr(value, "lineno") and value.lineno and ev.reads_gpu(value):
                    stmt: ast.AST | None = value
                    while stmt is not None and not isinstance(stmt, ast.stmt):
                        stmt = self.parent(stmt)
                    span = stmt or value
                    out.append((span.lineno, span.end_lineno or span.lineno))  # type: ignore[attr-defined]
        return sorted(set(out))

    def _flashinfer_call(self, call: ast.Call, qual: list[str], ev: Evaluator, decorator_only: bool = False) -> None:
        """`get_nvcc_flags_list(supported_major_versions=[9, 10])` and
        `@supported_compute_capability([100, 103])`: FlashInfer's own architecture lists."""
        name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)
        hits: list[tuple[ast.AST, str, str]] = []
        for kw in () if decorator_only else call.keywords:
            if kw.arg == JIT_KWARG:
                hits.append((kw.value, "jit-majors", f"{JIT_KWARG}={self.lines.segment(kw.value)}"))
        if name == CC_DECORATOR and call.args:
            hits.append((call.args[0], "compute-capability", self.lines.segment(call)))
        for value, kind, test in hits:
            nums = _int_list(value, ev, ARCHS[0])
            if nums is None:
                admits: frozenset[Arch] | None = None
            elif kind == "jit-majors":
                admits = frozenset(a for a in ARCHS if a.major in nums)
            else:
                admits = frozenset(a for a in ARCHS if a.major * 10 + a.minor in nums)
            self.sites.append(
                Site(
                    package=self.package,
                    file=self.rel,
                    function=".".join(qual) or "<module>",
                    line=value.lineno,  # type: ignore[attr-defined]
                    end_line=value.end_lineno or value.lineno,  # type: ignore[attr-defined]
                    test=test,
                    kind=kind,
                    admits=names(admits),
                    path=names(admits),
                    norm_test=f"{kind}:{ast.unparse(value)}",
                    norm_body=_digest(call),
                    context=".".join(qual),
                )
            )


def _exits(body: list[ast.stmt]) -> bool:
    """A guard clause's body: it raises, or leaves with nothing (`return`, `return None`, `return
    False`, `continue`); `if cond: return config` is a choice, not a guard."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Raise, ast.Continue, ast.Break)):
        return True
    if isinstance(last, ast.Return):
        return last.value is None or (isinstance(last.value, ast.Constant) and last.value.value in (None, False))
    return False


def _negated_exit(test: ast.AST, body: list[ast.stmt]) -> bool:
    """`if not is_sm100_or_sm110: return MHA_CHUNKED_KV`: a negated test that leaves with a value
    sends the other GPUs to a fallback; the fast path is the code after it."""
    return (
        isinstance(test, ast.UnaryOp)
        and isinstance(test.op, ast.Not)
        and bool(body)
        and isinstance(body[-1], (ast.Return, ast.Raise))
    )


def _int_list(node: ast.AST, ev: Evaluator, arch: Arch) -> tuple[int, ...] | None:
    """A literal list of ints, or a name bound to one (`majors = [10]`)."""
    for _ in range(3):
        if isinstance(node, ast.Name) and node.id in ev.scope.local:
            node = ev.scope.local[node.id]
    v = ev.value(node, arch)
    if isinstance(v, tuple) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return v
    return None


def _context(root: ast.AST, parent: ast.AST | None, parent_of: object) -> tuple[str, bool, ast.AST | None]:
    """What uses the test: (kind, is it a guard clause, the statement whose body it guards)."""
    if isinstance(parent, ast.If) and parent.test is root:
        get = parent_of  # type: ignore[assignment]
        grand = get(parent)  # type: ignore[operator]
        kind = "elif" if isinstance(grand, ast.If) and grand.orelse == [parent] else "if"
        guard = not parent.orelse and (_exits(parent.body) or _negated_exit(root, parent.body))
        return kind, guard, ast.Module(body=parent.body, type_ignores=[])
    if isinstance(parent, ast.IfExp) and parent.test is root:
        return "ifexp", False, parent
    if isinstance(parent, ast.While) and parent.test is root:
        return "while", False, parent
    if isinstance(parent, ast.Assert):
        return "assert", False, parent
    if isinstance(parent, ast.Return):
        return "return", False, parent
    if isinstance(parent, (ast.Assign, ast.AnnAssign, ast.NamedExpr)):
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        if all(isinstance(t, ast.Name) for t in targets):
            return "definition", False, None
        if all(isinstance(t, ast.Attribute) and PREDICATE_RX.match(t.attr) for t in targets):
            return "definition", False, None
        return "assign", False, parent
    if isinstance(parent, ast.keyword):
        return "arg", False, parent
    if isinstance(parent, ast.Call):
        return "arg", False, parent
    if isinstance(parent, ast.comprehension):
        return "filter", False, parent
    return "expr", False, parent


def _context_span(root: ast.AST, parent: ast.AST | None, parent_of: object) -> ast.AST:
    """The code a site guards, for reading which kernels are behind it."""
    if isinstance(parent, ast.If) and parent.test is root:
        return ast.Module(body=parent.body, type_ignores=[])
    if isinstance(parent, ast.IfExp):
        return parent
    get = parent_of
    node: ast.AST = root
    while node is not None and not isinstance(node, ast.stmt):
        node = get(node)  # type: ignore[operator]
    return node if node is not None else root


def _context_text(lines: _Lines, node: ast.AST, qual: list[str]) -> str:
    if isinstance(node, ast.Module):
        if not node.body:
            return ".".join(qual)
        first, last = node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno
    else:
        first, last = node.lineno, node.end_lineno or node.lineno  # type: ignore[attr-defined]
    return ".".join(qual) + "\n" + lines.text(first, min(last, first + 60))


def scan_file(package: str, path: Path, rel: str, release: ReleasePredicates, data: bytes) -> FileScan | None:
    try:
        text = data.decode("utf-8")
        tree = ast.parse(text, str(path))
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return None
    return FileScan(package, rel, text, tree, release).run()
