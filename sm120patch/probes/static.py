"""Static rung: read the arch gate a FlashInfer JIT generator passes, from its source.

The cheapest answer there is (milliseconds, no torch, no import): FlashInfer gates
each JIT module with `get_nvcc_flags_list(supported_major_versions=[...])`, and that
list is what raises "No supported CUDA architectures found for major versions [...]"
at run time. Parsed with `ast`, so the code is never executed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

GATE_KWARG = "supported_major_versions"


@dataclass(frozen=True)
class Gate:
    """What the generator passes: `majors` (None: it calls no gate), where it was read."""

    found: bool  # the generator function exists
    majors: tuple[int, ...] | None
    where: str  # "comm.py:61 in gen_trtllm_comm_module"
    dynamic: bool = False  # a gate is passed, but not as a list we can read


def _int_list(node: ast.AST, consts: dict[str, ast.AST]) -> tuple[int, ...] | None:
    if isinstance(node, ast.Name) and node.id in consts:
        node = consts[node.id]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        vals = [e.value for e in node.elts if isinstance(e, ast.Constant)]
        if len(vals) == len(node.elts) and all(isinstance(v, int) for v in vals):
            return tuple(vals)
    return None


def _module_constants(tree: ast.Module) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            out[node.target.id] = node.value
    return out


def _gate_in(
    fn: ast.FunctionDef, consts: dict[str, ast.AST], funcs: dict[str, ast.FunctionDef], depth: int
) -> tuple[tuple[int, ...] | None, int] | None:
    """First gate kwarg in `fn`, else in same-module functions it calls (one hop per depth)."""
    local = dict(consts)
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):  # `majors = [9, 10]` inside the function
            for t in node.targets:
                if isinstance(t, ast.Name):
                    local[t.id] = node.value
    callees: list[str] = []
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            if kw.arg == GATE_KWARG:
                return _int_list(kw.value, local), kw.value.lineno
        if isinstance(node.func, ast.Name) and node.func.id in funcs:
            callees.append(node.func.id)
    if depth > 0:
        for name in callees:
            if name != fn.name and (hit := _gate_in(funcs[name], consts, funcs, depth - 1)):
                return hit
    return None


def read_gate(path: Path, generator: str) -> Gate:
    """The `supported_major_versions` the generator in `path` passes (directly or one call down)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), str(path))
    except (OSError, SyntaxError, ValueError):
        return Gate(False, None, str(path))
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    fn = funcs.get(generator)
    if fn is None:
        return Gate(False, None, str(path))
    hit = _gate_in(fn, _module_constants(tree), funcs, depth=2)
    if hit is None:
        return Gate(True, None, f"{path.name}:{fn.lineno} in {generator}")
    return Gate(True, hit[0], f"{path.name}:{hit[1]} in {generator}", dynamic=hit[0] is None)
