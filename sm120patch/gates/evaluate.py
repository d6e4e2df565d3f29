"""Evaluate an architecture test over the GPUs we care about, from the release's own definitions.

A test is evaluated once per architecture with three kinds of non-answer: `WILD` (a part that does
not depend on the GPU: a CUDA version, a flag, a model name; it may be either) and `UNK` (a part that
does depend on the GPU but that we cannot read: a predicate we found no definition of). A test
admits an architecture when it can be true there; one `UNK` makes the whole answer unknown, so
nothing we could not read is ever reported as shut or open.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sm120patch.arch import Arch

ARCHS: tuple[Arch, ...] = tuple(
    Arch(major, minor) for major, minor in ((8, 0), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1))
)
SM12X: tuple[Arch, ...] = (Arch(12, 0), Arch(12, 1))

# what a name must look like to be an architecture predicate (SGLang's own naming); a name of this
# shape whose definition we never found is UNK, not WILD
PREDICATE_RX = re.compile(r"^_?(is|use)_(sm_?\d+\w*|blackwell\w*|hopper\w*|ampere\w*)$", re.I)
# calls that return the GPU's capability: (major, minor), or major * 10 + minor
CAPABILITY_CALLS = frozenset({"get_device_capability", "get_compute_capability"})
SM_CALLS = frozenset({"get_device_sm"})


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


WILD = _Marker("WILD")  # independent of the GPU: may be true or false
UNK = _Marker("UNK")  # depends on the GPU in a way we cannot read

Admits = frozenset[Arch] | None  # None: unknown


@dataclass
class Scope:
    """What names mean where a test is evaluated: predicates (name -> the archs it is true on),
    `get_platform().<attr>` attributes, and the function's own local bindings (name -> expression)."""

    predicates: Mapping[str, Admits]
    platform: Mapping[str, Admits] = field(default_factory=dict)
    platform_values: Mapping[str, str] = field(default_factory=dict)  # attr -> "capability" | "sm"
    local: dict[str, ast.expr] = field(default_factory=dict)
    params: dict[str, ast.expr] = field(default_factory=dict)  # a partial()'s keyword arguments

    def child(self, local: dict[str, ast.expr]) -> Scope:
        return Scope(self.predicates, self.platform, self.platform_values, local, self.params)


def _name_of(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _is_platform(node: ast.expr) -> bool:
    """`get_platform()` (or `x.get_platform()`): SGLang 0.5.20+'s one place for machine facts."""
    return isinstance(node, ast.Call) and _name_of(node.func) == "get_platform"


class Evaluator:
    """Evaluates expressions for one architecture; `atoms` says whether an expression reads the GPU."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self._depth = 0
        self._reads: dict[int, bool] = {}  # id(expr) -> reads the GPU (local bindings are shared)
        self._names: dict[tuple[str, Arch], object] = {}  # a local name's value per arch
        self._busy: set[object] = set()  # names being evaluated: `x = x + 1` must not recurse

    # --- which expressions read the GPU -------------------------------------------------------
    def is_atom(self, node: ast.AST) -> bool:
        """A node that reads the GPU by itself: a predicate (call, name, attribute), a capability
        call, a platform attribute, or a local name bound to an expression that reads it."""
        s = self.scope
        if isinstance(node, ast.Call):
            name = _name_of(node.func)
            if name in CAPABILITY_CALLS or name in SM_CALLS:
                return True
            return name is not None and (name in s.predicates or bool(PREDICATE_RX.match(name)))
        if isinstance(node, ast.Attribute):
            if _is_platform(node.value):
                return node.attr in s.platform or node.attr in s.platform_values
            return node.attr in s.predicates and not isinstance(node.ctx, ast.Store)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in s.local:
                if node.id in self._busy:
                    return False
                self._busy.add(node.id)
                try:
                    return self.reads_gpu(s.local[node.id])
                finally:
                    self._busy.discard(node.id)
            return node.id in s.predicates or bool(PREDICATE_RX.match(node.id))
        return False

    def reads_gpu(self, node: ast.AST) -> bool:
        hit = self._reads.get(id(node))
        if hit is None:
            hit = any(self.is_atom(n) for n in ast.walk(node) if not isinstance(n, ast.Lambda))
            self._reads[id(node)] = hit
        return hit

    # --- values ----------------------------------------------------------------------------------
    def value(self, node: ast.AST, arch: Arch) -> object:
        self._depth += 1
        try:
            if self._depth > 40:
                return UNK
            return self._value(node, arch)
        finally:
            self._depth -= 1

    def _pred(self, admits: Admits, arch: Arch) -> object:
        return UNK if admits is None else arch in admits

    def _value(self, node: ast.AST, arch: Arch) -> object:
        s = self.scope
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            vals = [self.value(e, arch) for e in node.elts]
            if any(v is UNK for v in vals):
                return UNK
            if any(v is WILD for v in vals):
                return WILD
            return tuple(vals)
        if isinstance(node, ast.Name):
            if node.id in s.params:
                return self.value(s.params[node.id], arch)
            if node.id in s.local and not self.reads_gpu(s.local[node.id]):
                return WILD
            if node.id in s.local:
                key = (node.id, arch)
                if key not in self._names:
                    if key in self._busy:
                        return WILD
                    self._busy.add(key)
                    try:
                        self._names[key] = self.value(s.local[node.id], arch)
                    finally:
                        self._busy.discard(key)
                return self._names[key]
            if node.id in s.predicates:
                return self._pred(s.predicates[node.id], arch)
            return UNK if PREDICATE_RX.match(node.id) else WILD
        if isinstance(node, ast.Attribute):
            if _is_platform(node.value):
                if node.attr in s.platform:
                    return self._pred(s.platform[node.attr], arch)
                kind = s.platform_values.get(node.attr)
                if kind == "capability":
                    return (arch.major, arch.minor)
                if kind == "sm":
                    return arch.major * 10 + arch.minor
                return WILD
            if node.attr in s.predicates:
                return self._pred(s.predicates[node.attr], arch)
            return WILD
        if isinstance(node, ast.Call):
            name = _name_of(node.func)
            if name in CAPABILITY_CALLS:
                return (arch.major, arch.minor)
            if name in SM_CALLS:
                return arch.major * 10 + arch.minor
            if name is not None and name in s.predicates:
                return self._pred(s.predicates[name], arch)
            if name is not None and PREDICATE_RX.match(name):
                return UNK
            return WILD
        if isinstance(node, ast.Subscript):
            base = self.value(node.value, arch)
            idx = self.value(node.slice, arch)
            if base is UNK or idx is UNK:
                return UNK
            if isinstance(base, tuple) and isinstance(idx, int) and -len(base) <= idx < len(base):
                return base[idx]
            return WILD
        if isinstance(node, ast.BoolOp):
            vals = [self.value(v, arch) for v in node.values]
            if isinstance(node.op, ast.And):
                if any(v is not WILD and v is not UNK and not v for v in vals):
                    return False
                if any(v is UNK for v in vals):
                    return UNK
                return WILD if any(v is WILD for v in vals) else True
            if any(v is not WILD and v is not UNK and v for v in vals):
                return True
            if any(v is UNK for v in vals):
                return UNK
            return WILD if any(v is WILD for v in vals) else False
        if isinstance(node, ast.UnaryOp):
            v = self.value(node.operand, arch)
            if v is WILD or v is UNK:
                return v
            if isinstance(node.op, ast.Not):
                return not v
            if isinstance(node.op, ast.USub) and isinstance(v, int):
                return -v
            return WILD
        if isinstance(node, ast.BinOp):
            a, b = self.value(node.left, arch), self.value(node.right, arch)
            if a is UNK or b is UNK:
                return UNK
            if not (isinstance(a, int) and isinstance(b, int)) or isinstance(a, bool) or isinstance(b, bool):
                return WILD
            ops: dict[type, Callable[[int, int], int]] = {
                ast.Add: lambda x, y: x + y,
                ast.Sub: lambda x, y: x - y,
                ast.Mult: lambda x, y: x * y,
                ast.FloorDiv: lambda x, y: x // y if y else 0,
                ast.Mod: lambda x, y: x % y if y else 0,
            }
            op = ops.get(type(node.op))
            return op(a, b) if op else WILD
        if isinstance(node, ast.Compare):
            return self._compare(node, arch)
        if isinstance(node, ast.IfExp):
            t = self.value(node.test, arch)
            if t is UNK:
                return UNK
            if t is WILD:
                # `cap()[0] if is_cuda() else 0`: on the GPU, the branch that reads it
                reads_body, reads_else = self.reads_gpu(node.body), self.reads_gpu(node.orelse)
                if reads_body != reads_else:
                    return self.value(node.body if reads_body else node.orelse, arch)
                body, other = self.value(node.body, arch), self.value(node.orelse, arch)
                return body if body == other else (UNK if UNK in (body, other) else WILD)
            return self.value(node.body if t else node.orelse, arch)
        return WILD

    def _compare(self, node: ast.Compare, arch: Arch) -> object:
        left = self.value(node.left, arch)
        result: object = True
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = self.value(comp, arch)
            if left is UNK or right is UNK:
                return UNK
            if left is WILD or right is WILD:
                result = WILD if result is not False else False
                left = right
                continue
            try:
                ok = _COMPARE[type(op)](left, right)
            except (TypeError, KeyError):
                return WILD
            if not ok:
                return False
            left = right
        return result

    def admits(self, node: ast.AST) -> Admits:
        """The archs on which `node` can be true; None when a GPU-dependent part is unreadable."""
        out = set()
        for arch in ARCHS:
            v = self.value(node, arch)
            if v is UNK:
                return None
            if v is WILD or v:
                out.add(arch)
        return frozenset(out)

    def can_be_false(self, node: ast.AST) -> Admits:
        """The archs on which `node` can be false (the fall-through of a guard clause)."""
        out = set()
        for arch in ARCHS:
            v = self.value(node, arch)
            if v is UNK:
                return None
            if v is WILD or not v:
                out.add(arch)
        return frozenset(out)

    def is_test(self, node: ast.AST) -> bool:
        """True when `node` is a yes/no question about the GPU (not a capability handed on)."""
        vals = [self.value(node, a) for a in ARCHS]
        if any(v is UNK for v in vals):
            return True
        bools = [v for v in vals if v is not WILD]
        return bool(bools) and all(isinstance(v, bool) for v in bools) and len(set(bools)) > 0


_COMPARE: dict[type, Callable[[object, object], bool]] = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,  # type: ignore[operator]
    ast.LtE: lambda a, b: a <= b,  # type: ignore[operator]
    ast.Gt: lambda a, b: a > b,  # type: ignore[operator]
    ast.GtE: lambda a, b: a >= b,  # type: ignore[operator]
    ast.In: lambda a, b: a in b,  # type: ignore[operator]
    ast.NotIn: lambda a, b: a not in b,  # type: ignore[operator]
    ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b,
}


def function_admits(fn: ast.FunctionDef | ast.AsyncFunctionDef, scope: Scope) -> Admits:
    """What a predicate function admits: the union over its `return`s, its local bindings (a
    `major, minor = get_device_capability()`) read first. Archs where no return can be true are out."""
    local = bind_locals(fn.body)
    ev = Evaluator(scope.child(local))
    out: set[Arch] = set()
    returns = [n for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None]
    if not returns or not any(ev.reads_gpu(r.value) for r in returns if r.value is not None):
        return None  # named like a predicate, but how it reads the GPU is not something we can evaluate
    for r in returns:
        assert r.value is not None
        a = ev.admits(r.value)
        if a is None:
            return None
        out |= a
    return frozenset(out)


def bind_locals(body: list[ast.stmt]) -> dict[str, ast.expr]:
    """Names a block binds by plain assignment (`x = ...`, `a, b = ...`), the last one winning;
    a tuple target binds each name to `value[i]`, which is how `major, minor = cap()` reads."""
    local: dict[str, ast.expr] = {}
    again: set[str] = set()
    for node in _walk_no_nested(body):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                _bind(local, t, node.value, again)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            _bind(local, node.target, node.value, again)
        elif isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
            targets = (
                [node.target]
                if isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor))
                else [i.optional_vars for i in node.items if i.optional_vars is not None]
            )
            for t in targets:
                again.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    # a name bound more than once has no one value without flow analysis: it may be either
    for name in again:
        local[name] = ast.Name(id="<rebound>", ctx=ast.Load(), lineno=0, col_offset=0)
    return local


def _bind(local: dict[str, ast.expr], target: ast.expr, value: ast.expr, again: set[str]) -> None:
    if isinstance(target, ast.Name):
        if target.id in local:
            again.add(target.id)
        local[target.id] = value
    elif isinstance(target, (ast.Tuple, ast.List)):
        for i, elt in enumerate(target.elts):
            if isinstance(elt, ast.Name):
                if elt.id in local:
                    again.add(elt.id)
                local[elt.id] = ast.Subscript(value=value, slice=ast.Constant(i), ctx=ast.Load())


_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _walk_no_nested(body: list[ast.stmt]) -> list[ast.AST]:
    """Every statement of a block (the bodies of its if/for/with/try too), not descending into
    expressions or nested functions and classes: where plain assignments are."""
    out: list[ast.AST] = []
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        out.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for name in _BLOCKS:
            block = getattr(node, name, None)
            if block:
                stack.extend(reversed(block))
    return out


def names(admits: Admits) -> list[str] | None:
    return None if admits is None else [a.name for a in ARCHS if a in admits]
