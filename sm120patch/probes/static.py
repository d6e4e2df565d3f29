"""Static rung: read the arch gate a FlashInfer JIT generator passes, and host-code facts, from source.

The cheapest answer there is (milliseconds, no torch, no import): FlashInfer gates
each JIT module with `get_nvcc_flags_list(supported_major_versions=[...])`, and that
list is what raises "No supported CUDA architectures found for major versions [...]"
at run time. Parsed with `ast`, so the code is never executed.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sm120patch.probes.rungs import Step

if TYPE_CHECKING:
    from sm120patch.arch import Arch
    from sm120patch.catalogue.kernels import Kernel
    from sm120patch.probes.environment.flashinfer import FlashInferEnv

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


def _gate_step(kernel: Kernel, arch: Arch, fi: FlashInferEnv) -> Step:
    """What the generator's arch gate says (kernels.toml `gate`: majors, none or symbol)."""
    assert fi.package_dir is not None
    path = fi.package_dir / kernel.file
    gate = read_gate(path, kernel.generator)
    where = f"FlashInfer {fi.version}"
    if not gate.found:
        return Step("unknown", f"static: {kernel.generator} not found in {path} ({where})")
    if kernel.gate == "symbol":
        return Step("pass", f"static: {gate.where} exists ({where}); kernels.toml asks no more of the source")
    if gate.dynamic:
        return Step("unknown", f"static: {gate.where} computes its arch gate; cannot read it")
    if gate.majors is None:
        if kernel.gate == "none":
            return Step(
                "pass", f"static: {gate.where} passes no arch gate: FlashInfer builds it for every arch ({where})"
            )
        return Step(
            "unknown",
            f"static: {gate.where} passes no supported_major_versions; the source does not say "
            f"which archs it builds for ({where})",
        )
    majors = list(gate.majors)
    ok = arch.major in majors
    reason = (
        f"static: {gate.where} passes supported_major_versions={majors}, which "
        f"{'includes' if ok else 'excludes'} major {arch.major} ({arch.name}); {where}"
    )
    return Step("pass" if ok else "fail", reason, final=True)


def _source_steps(kernel: Kernel, arch: Arch, fi: FlashInferEnv) -> list[Step]:
    """Host-code facts no cubin shows (kernels.toml `source_checks`), for this arch."""
    assert fi.package_dir is not None
    out = []
    for check in kernel.source_checks:
        if arch not in check.archs:
            continue
        path = fi.package_dir / check.file
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            out.append(Step("unknown", f"static: {check.file} not found; cannot check: {check.finding}", final=False))
            continue
        if re.search(check.requires, text, re.M) and not (check.forbids and re.search(check.forbids, text, re.M)):
            out.append(Step("pass", f"static: {check.file} has the fix ({check.fix})", final=False))
        else:
            out.append(
                Step("fail", f"static: {check.file}: {check.finding}; fixed upstream by {check.fix}", final=False)
            )
    return out


def check_static(kernel: Kernel, arch: Arch, fi: FlashInferEnv) -> Step:
    """The static rung: the arch gate, then the source checks (only if the gate lets the arch in)."""
    gate = _gate_step(kernel, arch, fi)
    if gate.result == "fail":
        return gate
    checks = _source_steps(kernel, arch, fi)
    failed = [c for c in checks if c.result == "fail"]
    if failed:
        return Step("fail", "; ".join(c.reason for c in failed), final=False)
    unknown = [c for c in checks if c.result == "unknown"]
    if gate.result == "pass" and not unknown:
        return Step("pass", gate.reason + (f"; {len(checks)} source check(s) hold" if checks else ""))
    return Step("unknown", "; ".join(s.reason for s in (gate, *unknown) if s.result == "unknown"))
