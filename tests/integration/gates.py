"""The test oracle: evaluate a release's gates the way that release's own code would, on a fake GPU.

Nothing here asks sm120patch what an arch predicate means. For each release the oracle reads
SGLang's own definitions with `ast` (the `is_sm*`/`is_blackwell*`/`is_hopper*` predicates and
their `_check_cuda_device_version` helper in `srt/utils/common.py`, the exact-minor `is_sm120()` /
`is_sm121()` of 0.5.19+, and `get_platform()`'s fact -> probe table `_PLATFORM_PROBES` in
`srt/runtime_context.py`), executes exactly those definitions against a fake device (a stub
`torch` that reports the compute capability and CUDA version asked for), and evaluates the gate
expressions or whole functions of the patched module with them. Names a gate reads are resolved
like Python would: the module's own top-level bindings first (flags such as
`_is_sm100_supported = _is_cuda and is_sm100_supported()` are evaluated in turn), then what it
imports; what a test passes (a server-args view, the launch) fills the rest, and anything else is
an error rather than a guess.

Also here: the names an edit imports exist in the module they are imported from (in that
release), and an edit reads no name its module does not bind (`symtable`).
"""

from __future__ import annotations

import ast
import builtins
import functools
import symtable
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# Hardware-level questions a predicate asks: answered by the fake device, never read from a release.
HARDWARE_FALSE = ("is_hip", "is_npu", "is_xpu", "is_musa", "is_mps", "is_cpu", "cpu_has_amx_support")
HARDWARE_TRUE = ("is_cuda", "is_cuda_alike", "is_flashinfer_available")
# Definitions the oracle takes from a release: the predicates and the helpers they are built from.
PREDICATE_PREFIXES = ("is_sm", "is_blackwell", "is_hopper", "is_ampere", "_check")
_SAFE = (
    "all any bool dict frozenset getattr hasattr int isinstance len list max min range set sorted str tuple zip "
    "map filter next iter print ValueError KeyError TypeError RuntimeError AttributeError ImportError Exception "
    "NotImplementedError"
)
SAFE_BUILTINS = {n: getattr(builtins, n) for n in _SAFE.split()}


@dataclass(frozen=True)
class Device:
    """The GPU a gate is evaluated for, and the host around it."""

    major: int
    minor: int = 0
    cuda: str = "13.0"
    count: int = 8  # GPUs visible to the process
    p2p: bool = True  # every pair can access its peer
    nvlink: bool = False  # every pair is linked by NVLink

    @property
    def sm(self) -> int:
        return self.major * 10 + self.minor


class _Dtype(str):
    """torch dtypes as comparable tokens."""


def fake_torch(dev: Device) -> SimpleNamespace:
    cuda = SimpleNamespace(
        get_device_capability=lambda device=None: (dev.major, dev.minor),
        is_available=lambda: True,
        device_count=lambda: dev.count,
        can_device_access_peer=lambda a, b: dev.p2p,
        current_device=lambda: 0,
    )
    return SimpleNamespace(
        cuda=cuda,
        version=SimpleNamespace(cuda=dev.cuda, hip=None),
        float32=_Dtype("float32"),
        bfloat16=_Dtype("bfloat16"),
        float16=_Dtype("float16"),
        float8_e4m3fn=_Dtype("float8_e4m3fn"),
    )


def _identity_lru_cache(*args: Any, **kwargs: Any) -> Any:
    """`lru_cache` that caches nothing: the oracle asks one predicate for many devices."""
    if args and callable(args[0]) and not kwargs:
        return args[0]
    return lambda fn: fn


def _hardware(dev: Device) -> dict[str, Any]:
    ns: dict[str, Any] = {n: (lambda: False) for n in HARDWARE_FALSE}
    ns.update({n: (lambda: True) for n in HARDWARE_TRUE})
    ns.update(
        torch=fake_torch(dev),
        get_device_sm=lambda *a, **k: dev.sm,
        get_device_capability=lambda *a, **k: (dev.major, dev.minor),
        get_device_name=lambda *a, **k: "NVIDIA Fake GPU",
        lru_cache=_identity_lru_cache,
        cache=_identity_lru_cache,
        partial=functools.partial,
        functools=SimpleNamespace(lru_cache=_identity_lru_cache, cache=_identity_lru_cache, partial=functools.partial),
    )
    return ns


# --- one release's predicate definitions ----------------------------------------------------------------


def package_root(path: Path) -> Path:
    """The `sglang/` package a file of a release (wheel or clone layout) belongs to."""
    for parent in path.resolve().parents:
        if parent.name == "sglang" and (parent / "srt").is_dir():
            return parent
    raise AssertionError(f"{path} is not inside an sglang package")


@functools.cache
def _release_nodes(root: Path) -> tuple[list[ast.stmt], dict[str, str]]:
    """The predicate definitions of the release at `root` (`sglang/`), and get_platform's facts."""
    common = root / "srt" / "utils" / "common.py"
    if not common.is_file():
        common = root / "srt" / "utils.py"
    tree = ast.parse(common.read_bytes())
    nodes: list[ast.stmt] = []
    for stmt in tree.body:
        names = [stmt.name] if isinstance(stmt, ast.FunctionDef) else []
        if isinstance(stmt, ast.Assign):
            names = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
        if any(n.startswith(PREDICATE_PREFIXES) for n in names):
            nodes.append(stmt)
    probes: dict[str, str] = {}
    rc = root / "srt" / "runtime_context.py"
    if rc.is_file():
        for stmt in ast.parse(rc.read_bytes()).body:
            target = stmt.target if isinstance(stmt, ast.AnnAssign) else None
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
            if isinstance(target, ast.Name) and target.id == "_PLATFORM_PROBES" and stmt.value is not None:
                probes = ast.literal_eval(stmt.value)
    return nodes, probes


def release_predicates(root: Path, dev: Device) -> dict[str, Any]:
    """The release's own predicates, evaluated on `dev`: name -> callable (or value)."""
    nodes, _ = _release_nodes(root)
    ns: dict[str, Any] = {"__builtins__": SAFE_BUILTINS, **_hardware(dev)}
    for node in nodes:
        code = compile(ast.Module(body=[node], type_ignores=[]), str(root), "exec")
        try:
            exec(code, ns)  # noqa: S102 - a release's own predicate definitions, run against a stub torch
        except NameError:
            continue  # built from a helper the oracle does not model; never one a gate below needs
    return {k: v for k, v in ns.items() if k.startswith(PREDICATE_PREFIXES) and not k.startswith("_check")}


def predicate_names(root: Path) -> set[str]:
    nodes, _ = _release_nodes(root)
    names: set[str] = set()
    for n in nodes:
        if isinstance(n, ast.FunctionDef):
            names.add(n.name)
        else:
            names.update(t.id for t in n.targets if isinstance(t, ast.Name))  # type: ignore[union-attr]
    return {n for n in names if not n.startswith("_check")}


def platform(root: Path, dev: Device) -> SimpleNamespace:
    """`get_platform()` of the release on `dev`: each fact answered by the probe it names."""
    _, probes = _release_nodes(root)
    preds = release_predicates(root, dev)
    hw = _hardware(dev)
    facts: dict[str, Any] = {}
    for fact, probe in probes.items():
        fn = preds.get(probe) or hw.get(probe)
        if fn is not None:
            facts[fact] = fn()
    facts.update(device_sm=dev.sm, device_capability=(dev.major, dev.minor))
    return SimpleNamespace(**facts)


def platform_facts(root: Path) -> dict[str, str]:
    return dict(_release_nodes(root)[1])


# --- evaluating a patched module's code -------------------------------------------------------------------


class FakeModule:
    """What `from <module> import <name>` gives inside evaluated code: resolved by the scope."""

    def __init__(self, name: str, scope: Scope) -> None:
        self._name, self._scope = name, scope

    def __getattr__(self, attr: str) -> Any:
        return self._scope.resolve_import(self._name, attr)


class Scope(dict):
    """Globals for evaluating code of one module of a release on one fake device.

    Lookup order for a name: the values a test passes, the module's own top-level bindings
    (assignments evaluated, defs executed, imports resolved), then builtins. Imports resolve to
    the release's predicates, `get_platform`, the fake hardware, or `imports` given by the test.
    """

    def __init__(
        self,
        path: Path,
        dev: Device,
        values: dict[str, Any] | None = None,
        imports: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.path, self.dev, self.root = path, dev, package_root(path)
        self.tree = ast.parse(path.read_bytes())
        self.preds = release_predicates(self.root, dev)
        self.platform = platform(self.root, dev)
        self.imports = imports or {}
        self.top = _top_bindings(self.tree)
        self["__builtins__"] = {**SAFE_BUILTINS, "__import__": self._import}
        self["__name__"] = ".".join(("sglang", *path.resolve().relative_to(self.root).with_suffix("").parts))
        self.update(values or {})

    def __missing__(self, name: str) -> Any:
        node = self.top.get(name)
        if node is None:
            raise KeyError(name)
        if isinstance(node, ast.ImportFrom):
            value = self.resolve_import("." * node.level + (node.module or ""), _imported_name(node, name))
        elif isinstance(node, ast.Import):
            value = self._import(_imported_name(node, name))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            exec(compile(ast.Module(body=[node], type_ignores=[]), str(self.path), "exec"), self)  # noqa: S102
            return dict.__getitem__(self, name)
        else:
            assert isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
            value = eval(compile(ast.Expression(node.value), str(self.path), "eval"), self)  # noqa: S307
        self[name] = value
        return value

    def resolve_import(self, module: str, name: str) -> Any:
        if (module, name) in self.imports:
            return self.imports[(module, name)]
        if name in self.imports:
            return self.imports[name]
        if name == "get_platform":
            return lambda: self.platform
        if name in self.preds:
            return self.preds[name]
        hw = _hardware(self.dev)
        if name in hw:
            return hw[name]
        raise KeyError(f"{module}.{name}: not modelled by the oracle; pass it in imports=")

    def _import(self, name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if name in ("os", "functools", "logging", "math"):
            return __import__(name)
        if name == "torch":
            return _hardware(self.dev)["torch"]
        return FakeModule(name, self)

    def eval(self, node: ast.expr) -> Any:
        return eval(compile(ast.Expression(node), str(self.path), "eval"), self)  # noqa: S307

    def function(self, name: str) -> Callable[..., Any]:
        fn = functions(self.tree, {name})
        assert fn, f"no {name}() in {self.path}"
        exec(compile(ast.Module(body=[fn[0]], type_ignores=[]), str(self.path), "exec"), self)  # noqa: S102
        return dict.__getitem__(self, name)


def _imported_name(node: ast.Import | ast.ImportFrom, bound: str) -> str:
    for a in node.names:
        if (a.asname or a.name.split(".")[0]) == bound:
            return a.name
    raise AssertionError(bound)


def _top_bindings(tree: ast.Module) -> dict[str, ast.stmt]:
    """Module-level bindings by name (the last one wins), descending into `if`/`try` blocks."""
    out: dict[str, ast.stmt] = {}

    def walk(stmts: Iterable[ast.stmt]) -> None:
        for s in stmts:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out[s.name] = s
            elif isinstance(s, ast.Assign):
                for t in s.targets:
                    if isinstance(t, ast.Name):
                        out[t.id] = s
            elif isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value is not None:
                out[s.target.id] = s
            elif isinstance(s, (ast.Import, ast.ImportFrom)):
                for a in s.names:
                    if a.name != "*":
                        out[a.asname or a.name.split(".")[0]] = s
            elif isinstance(s, ast.If):
                walk(s.body)
                walk(s.orelse)
            elif isinstance(s, ast.Try):
                walk(s.body)
                for h in s.handlers:
                    walk(h.body)
                walk(s.orelse)
                walk(s.finalbody)

    walk(tree.body)
    return out


def functions(tree: ast.AST, names: set[str]) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in names]


# --- arch predicates, as the release defines them ---------------------------------------------------------


def is_arch_predicate(node: ast.expr, root: Path, module_tree: ast.Module) -> bool:
    """A flag, zero-argument call or platform fact that is one of the release's arch predicates
    (or a module flag built from one)."""
    if isinstance(node, ast.Call) and not node.args and not node.keywords:
        node = node.func
    names = predicate_names(root)
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "get_platform":
            return platform_facts(root).get(node.attr) in names
        return False
    if isinstance(node, ast.Name):
        if node.id in names:
            return True
        bound = _top_bindings(module_tree).get(node.id)
        if isinstance(bound, ast.Assign):  # a flag built from a predicate or a platform fact (0.5.2x)
            return any(
                (isinstance(n, ast.Name) and n.id in names)
                or (isinstance(n, ast.Attribute) and is_arch_predicate(n, root, module_tree))
                for n in ast.walk(bound.value)
            )
    return False


def arch_chains(fn: ast.FunctionDef, root: Path, tree: ast.Module) -> list[ast.BoolOp]:
    """`or` chains in a function made of two or more of the release's arch predicates."""
    out = []
    for n in ast.walk(fn):
        if (
            isinstance(n, ast.BoolOp)
            and isinstance(n.op, ast.Or)
            and sum(is_arch_predicate(v, root, tree) for v in n.values) >= 2
        ):
            out.append(n)
    return out


def eval_expr(path: Path, node: ast.expr, major: int, **values: Any) -> Any:
    return Scope(path, Device(major), values).eval(node)


def chains_admit(path: Path, names: set[str], major: int) -> list[bool]:
    """For each arch `or` chain in the named functions: does it hold for this major?"""
    tree = ast.parse(path.read_bytes())
    root = package_root(path)
    scope = Scope(path, Device(major))
    return [bool(scope.eval(c)) for fn in functions(tree, names) for c in arch_chains(fn, root, tree)]


def module_binds(path: Path, name: str) -> bool:
    return name in _top_bindings(ast.parse(path.read_bytes()))


def moe_rule_picks(path: Path, names: set[str], major: int, quantization: str, backend: str = "auto") -> str:
    """Run every top-level `if` of the named functions that tests an arch predicate against a
    fake server-args object (`self` in ServerArgs methods, `view` and a local
    `moe_runner_backend` in the 0.5.15+ post-process passes); return the backend it leaves."""
    tree = ast.parse(path.read_bytes())
    root = package_root(path)
    args = SimpleNamespace(moe_runner_backend=backend, quantization=quantization)
    for fn in functions(tree, names):
        scope = Scope(path, Device(major), {"self": args, "view": args, "moe_runner_backend": args.moe_runner_backend})
        for stmt in fn.body:
            if not isinstance(stmt, ast.If) or not any(
                is_arch_predicate(n, root, tree)
                for n in ast.walk(stmt.test)
                if isinstance(n, (ast.Name, ast.Attribute, ast.Call))
            ):
                continue
            try:
                taken = scope.eval(stmt.test)
            except (NameError, AttributeError, KeyError):
                continue  # a rule about something else (mxfp8, nvfp4_online...)
            if not taken:
                continue
            for inner in stmt.body:
                if isinstance(inner, ast.Assign):
                    value = scope.eval(inner.value)
                    for t in inner.targets:
                        if (isinstance(t, ast.Attribute) and t.attr == "moe_runner_backend") or (
                            isinstance(t, ast.Name) and t.id == "moe_runner_backend"
                        ):
                            args.moe_runner_backend = scope["moe_runner_backend"] = value
    return args.moe_runner_backend


def list_holds(path: Path, names: set[str], anchors: set[str], item: str) -> bool:
    """Does the backend list (the one holding `anchors`) in the named functions hold `item`?"""
    tree = ast.parse(path.read_bytes())
    for fn in functions(tree, names):
        for n in ast.walk(fn):
            if isinstance(n, ast.List) and all(isinstance(e, ast.Constant) for e in n.elts):
                values = {e.value for e in n.elts}  # type: ignore[attr-defined]
                if anchors <= values:
                    return item in values
    raise AssertionError(f"no list holding {anchors} in {names} of {path}")


def if_tests_admit(path: Path, names: set[str], near: str, major: int, **values: Any) -> list[bool]:
    """Each `if`/`elif` test in the named functions that mentions `near` and an arch predicate,
    evaluated for this major (other names from `values`)."""
    tree = ast.parse(path.read_bytes())
    root = package_root(path)
    scope = Scope(path, Device(major), values)
    out = []
    for fn in functions(tree, names):
        for n in ast.walk(fn):
            if (
                isinstance(n, ast.If)
                and near in ast.unparse(n.test)
                and any(is_arch_predicate(x, root, tree) for x in ast.walk(n.test) if isinstance(x, ast.expr))
            ):
                out.append(bool(scope.eval(n.test)))
    return out


# --- bindings an edit relies on ---------------------------------------------------------------------------


def unbound_names(source: bytes | str, path: str = "<module>") -> set[str]:
    """Global names the code reads that its module never binds (nor builtins provide), by `symtable`."""
    top = symtable.symtable(source if isinstance(source, str) else source.decode("utf-8"), path, "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    star = "*" in {s.get_name() for s in top.get_symbols()}
    read: set[str] = set()

    def walk(table: symtable.SymbolTable) -> None:
        for s in table.get_symbols():
            if s.is_referenced() and (s.is_global() or (table is top and not s.is_assigned())):
                read.add(s.get_name())
        for child in table.get_children():
            walk(child)

    walk(top)
    if star:
        return set()  # `from x import *` binds what it likes: nothing can be said
    return {n for n in read - bound if not hasattr(builtins, n) and n not in ("__file__", "__name__", "__spec__")}


def new_imports(before: str, after: str) -> set[tuple[str, str]]:
    """(module, name) pairs `after` imports with `from ... import` that `before` did not, anywhere."""

    def pairs(src: str) -> set[tuple[str, str]]:
        out = set()
        for n in ast.walk(ast.parse(src)):
            if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                out.update((n.module, a.name) for a in n.names)
        return out

    return pairs(after) - pairs(before)


def module_file(root: Path, dotted: str) -> Path | None:
    """The file of `sglang.x.y` inside the release at `root` (the `sglang/` package)."""
    parts = dotted.split(".")
    if parts[0] != root.name:
        return None
    base = root.joinpath(*parts[1:])
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def module_defines(root: Path, dotted: str, name: str, _seen: frozenset[str] = frozenset()) -> bool:
    """Does `from <dotted> import <name>` work in this release: bound at module level (also inside
    if/try), or re-exported by a star import of a module that defines it publicly."""
    path = module_file(root, dotted)
    if path is None or dotted in _seen:
        return False
    tree = ast.parse(path.read_bytes())
    if name in _top_bindings(tree):
        return True
    exported = _all_names(tree)
    for stmt in ast.walk(tree):
        if isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names):
            src = _absolute(dotted, path, stmt)
            public = not name.startswith("_") or (exported is not None and name in exported)
            if src and public and module_defines(root, src, name, _seen | {dotted}):
                return True
    return False


def _all_names(tree: ast.Module) -> set[str] | None:
    for s in tree.body:
        if isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in s.targets):
            try:
                return set(ast.literal_eval(s.value))
            except ValueError:
                return None
    return None


def _absolute(dotted: str, path: Path, node: ast.ImportFrom) -> str | None:
    if node.level == 0:
        return node.module
    pkg = dotted.split(".") if path.name == "__init__.py" else dotted.split(".")[:-1]
    base = pkg[: len(pkg) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def check_edit_bindings(root: Path, rel_before_after: Iterable[tuple[str, bytes, bytes]]) -> list[str]:
    """Problems with what the edits rely on: a module that does not compile, a name read and not
    bound that was bound before, an import of a name its module does not define."""
    problems = []
    for rel, before, after in rel_before_after:
        try:
            compile(after, rel, "exec")
        except SyntaxError as e:
            problems.append(f"{rel}: does not compile ({e})")
            continue
        added = unbound_names(after, rel) - unbound_names(before, rel)
        if added:
            problems.append(f"{rel}: reads {sorted(added)}, bound nowhere in the module")
        for mod, name in new_imports(before.decode("utf-8"), after.decode("utf-8")):
            if mod.split(".")[0] == root.name and not module_defines(root, mod, name):
                problems.append(f"{rel}: imports {name} from {mod}, which does not define it in this release")
    return problems


def env_stub(**values: Any) -> SimpleNamespace:
    """`envs` of sglang.srt.environ: each variable with `.get()` and `.is_set()`."""

    def var(v: Any) -> SimpleNamespace:
        return SimpleNamespace(get=lambda: v, is_set=lambda: v is not None)

    return SimpleNamespace(**{k: var(v) for k, v in values.items()})
