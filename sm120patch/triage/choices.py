"""The values an SGLang release itself accepts for a launch flag, read from its own source with ast.

When a crash shows the flag whose value picked the failing path (`--attention-backend fa3`), the advice lists
the other values that release takes, from `parser.add_argument("--attention-backend", choices=...)` and the
module-level lists it names (ATTENTION_BACKEND_CHOICES): never a list typed here, so the advice follows the
release the user runs (given with --target; without it, the SGLang installed with the Python that runs diagnose, when
the log is SGLang's: diagnose usually runs on the server's machine, in its environment). The file is parsed, never
imported.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from sm120patch.triage.diagnose import Diagnosis

_PLACES = ("sglang/srt/server_args.py", "python/sglang/srt/server_args.py", "srt/server_args.py")


def server_args_file(target: Path) -> Path | None:
    """server_args.py of the SGLang under TARGET (a site-packages, a clone, or the sglang package itself)."""
    if target.is_file() and target.name == "server_args.py":
        return target
    return next((target / p for p in _PLACES if (target / p).is_file()), None)


def _strings(node: ast.AST, names: dict[str, list[str]]) -> list[str] | None:
    """The strings of a list/tuple/set literal (with *NAME of another known list), or of a known NAME."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if not isinstance(node, ast.List | ast.Tuple | ast.Set):
        return None
    out: list[str] = []
    for elt in node.elts:
        if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
            out.append(elt.value)
        elif isinstance(elt, ast.Starred) and isinstance(elt.value, ast.Name) and elt.value.id in names:
            out.extend(names[elt.value.id])
        else:
            return None  # a computed element: the list is not known from the source alone
    return out


def _module_lists(tree: ast.Module, names: dict[str, list[str]]) -> None:
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            got = _strings(stmt.value, names)
            if got is not None:
                names[stmt.targets[0].id] = got


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None


def _choices_of(call: ast.Call, names: dict[str, list[str]]) -> list[str] | None:
    kw = next((k for k in call.keywords if k.arg == "choices"), None)
    got = _strings(kw.value, names) if kw is not None else None
    return list(dict.fromkeys(got)) if got else None


def flag_choices(path: Path) -> dict[str, list[str]]:
    """Each `--flag` of the release whose choices are a literal or a module-level list of strings: from
    server_args.py's `parser.add_argument("--flag", choices=...)` and, in releases that declare their flags as
    fields (sglang/srt/arg_groups/fields/*.py: `attention_backend: A[..., Arg(choices=...)]`), from those."""
    tree = _parse(path)
    if tree is None:
        return {}
    groups = path.parent / "arg_groups"
    names: dict[str, list[str]] = {}
    shared = _parse(groups / "choices.py") if (groups / "choices.py").is_file() else None
    if shared is not None:
        _module_lists(shared, names)
    _module_lists(tree, names)
    flags: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "add_argument" or not node.args:
            continue
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.startswith("--"):
            got = _choices_of(node, names)
            if got:
                flags.setdefault(first.value, got)
    for fields in sorted((groups / "fields").glob("*.py")) if (groups / "fields").is_dir() else []:
        mod = _parse(fields)
        if mod is None:
            continue
        local = dict(names)
        _module_lists(mod, local)
        for node in ast.walk(mod):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            for call in ast.walk(node.annotation):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "Arg":
                    got = _choices_of(call, local)
                    cli = next((k.value for k in call.keywords if k.arg == "cli_name"), None)
                    name = cli.value if isinstance(cli, ast.Constant) and isinstance(cli.value, str) else None
                    if got:
                        flags.setdefault(name or "--" + node.target.id.replace("_", "-"), got)
    return flags


def installed_sglang() -> tuple[Path, str] | None:
    """The sglang package importable by this Python and its version (from the dist-info beside it; "" for a source
    checkout without one), found without importing it (importlib's finder only locates the package)."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith("__init__.py"):
        return None
    package = Path(spec.origin).parent
    infos = list(package.parent.glob("sglang-*.dist-info"))  # pip keeps one; two (a broken uninstall): unknown
    version = infos[0].name[len("sglang-") : -len(".dist-info")] if len(infos) == 1 else ""
    return package, version


def add_alternatives(result: Diagnosis, target: Path | None) -> None:
    """A note on each fatal finding whose flag the release knows: the other values it takes for that flag. Without
    a target, an SGLang log is read against the SGLang installed here (said so in the note)."""
    shown = [f for f in result.causes if f.details.get("flag", "").startswith("--")]
    if not shown:  # nothing to look up: no release is read
        return
    where = ""
    if target is None:
        found = installed_sglang() if result.framework == "sglang" else None
        if found is None:
            return
        target, version = found
        where = f"the SGLang installed with this Python{f' ({version})' if version else ''}; the server may run another"
    path = server_args_file(target)
    if path is None:
        return
    known = flag_choices(path)
    for f in shown:
        flag, _, value = f.details["flag"].partition(" ")
        choices = known.get(flag)
        if not choices:
            continue
        others = [c for c in choices if c != value.strip("'\"")]
        f.details["alternatives"] = ", ".join(others)
        f.notes.append(
            f"this SGLang's {flag} takes: {', '.join(others)} (besides {value}; from {path}"
            f"{'; ' + where if where else ''}); pick one whose kernels were built for this GPU's arch"
        )
