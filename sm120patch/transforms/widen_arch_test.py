"""widen-arch-test: `sm90 or sm100` becomes `sm90 or sm100 or sm120`, flag and import included."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from sm120patch.arch import PREDICATE_MAJORS, predicate_token
from sm120patch.transforms.base import (
    FileOutcome,
    Transform,
    arm_code,
    flatten_or,
    leaf_identifier,
    need_str,
    need_str_list,
    unknown_keys,
)
from sm120patch.transforms.bindings import ensure_bound, rename_token
from sm120patch.transforms.walk import Walker

if TYPE_CHECKING:
    import libcst as cst
else:  # loaded on first use: validating recipes needs no parser
    from sm120patch.transforms._cst import cst


class WidenArchTest(Transform):
    NAME: ClassVar[str] = "widen-arch-test"
    DESCRIPTION: ClassVar[str] = (
        "In the named functions, every `or` of arch predicates that holds all of `has` "
        "gets one more operand for `add`, shaped like the `has` operand it copies "
        "(`_is_sm100_supported` -> `_is_sm120_supported`, `is_sm100_supported()` -> "
        "`is_sm120_supported()`, `get_platform().is_sm100` -> `get_platform().is_sm120`). "
        "A module-level flag or import the new operand needs is added beside its sibling. "
        "A test that already admits `add`'s architecture (`is_blackwell_supported()`) is satisfied."
    )
    PARAMS_HELP: ClassVar[str] = (
        'params = { has = ["sm90", "sm100"], add = "sm120", import_from = "sglang.srt.utils" '
        '(optional), near = "allreduce_fusion" (optional: the enclosing statement\'s own arm must mention it) }'
    )

    @classmethod
    def check_params(cls, params: dict[str, Any], functions: Any) -> str | None:
        problem = (
            unknown_keys(params, ("has", "add", "import_from", "near"))
            or need_str_list(params, "has")
            or need_str(params, "add")
            or need_str(params, "import_from", required=False)
            or need_str(params, "near", required=False)
        )
        if problem:
            return problem
        for tok in [*params["has"], params["add"]]:
            if tok not in PREDICATE_MAJORS:
                return f"{tok!r} is not an arch token; use one of {', '.join(PREDICATE_MAJORS)}"
        if not functions:
            return "'functions' must name the functions that hold the test"
        return None

    def __init__(self, params: dict[str, Any], functions: Any) -> None:
        super().__init__(params, functions)
        self.has: list[str] = params["has"]
        self.add: str = params["add"]
        self.majors = PREDICATE_MAJORS[self.add]
        self.near: str | None = params.get("near")
        self.import_from: str | None = params.get("import_from")

    def shape(self) -> str:
        return f"`{' or '.join(self.has)}` test" + (f" near {self.near!r}" if self.near else "")

    def apply(self, module: cst.Module) -> FileOutcome:
        out = FileOutcome()
        replacements: dict[cst.BooleanOperation, cst.BooleanOperation] = {}
        needed: list[tuple[str, str]] = []  # (new bare name, sibling) to bind at module level
        for fn in self.functions_in(module):
            for chain, context in _or_chains(fn):
                if self.near and self.near not in arm_code(module, context):
                    continue
                verdict = self._widen(chain)
                if verdict is None:
                    continue
                if verdict is True:
                    out.satisfied += 1
                    continue
                new_chain, bare, sibling = verdict
                replacements[chain] = new_chain
                out.changed += 1
                if bare:
                    needed.append((bare, sibling))
        if not replacements:
            return out
        new = self.replace(module, dict(replacements))
        for bare, sibling in needed:
            new, why = ensure_bound(new, bare, sibling=sibling, import_from=self.import_from)
            if why:
                out.notes.append(why)
        out.module = new
        return out

    def _widen(self, chain: cst.BooleanOperation) -> bool | tuple[cst.BooleanOperation, str | None, str] | None:
        """True if already admitting, a widened chain if all `has` are there, None if not ours."""
        operands = flatten_or(chain)
        tokens = [predicate_token(leaf_identifier(o) or "") for o in operands]
        arch_ops = [(o, t) for o, t in zip(operands, tokens, strict=True) if t]
        if len(arch_ops) < 2 or not any(t in self.has for _, t in arch_ops):
            return None
        if any(PREDICATE_MAJORS[t] & self.majors for _, t in arch_ops):
            return True
        present = {t for _, t in arch_ops}
        if not set(self.has) <= present:
            return None
        template = next(o for o, t in arch_ops if t == self.has[-1])
        ident = leaf_identifier(template) or ""
        new_ident = ident.replace(self.has[-1], self.add)
        new_operand = rename_token(template, ident, new_ident)
        new_operand = new_operand.with_changes(lpar=[], rpar=[])  # type: ignore[union-attr]
        widened = cst.BooleanOperation(
            left=chain.with_changes(lpar=[], rpar=[]),
            operator=_or_like(chain),
            right=new_operand,  # type: ignore[arg-type]
            lpar=chain.lpar,
            rpar=chain.rpar,
        )
        # Only a bare name or a call of a bare name needs a module-level binding.
        base = template.func if isinstance(template, cst.Call) else template
        bare = new_ident if isinstance(base, cst.Name) else None
        return widened, bare, ident


def _or_like(chain: cst.BooleanOperation) -> cst.Or:
    op = chain.operator
    return op if isinstance(op, cst.Or) else cst.Or()


def _or_chains(fn: cst.FunctionDef) -> list[tuple[cst.BooleanOperation, cst.CSTNode]]:
    """Outermost `or` chains in a function, each with its enclosing statement."""
    found: list[tuple[cst.BooleanOperation, cst.CSTNode]] = []

    class _V(Walker):
        def __init__(self) -> None:
            self.stmt: list[cst.CSTNode] = []

        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, (cst.BaseCompoundStatement, cst.SimpleStatementLine)):
                self.stmt.append(node)
            if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.Or):
                found.append((node, self.stmt[-1] if self.stmt else fn))
                # operands may hold nested parenthesised chains of their own
                for part in flatten_or(node):
                    self.walk(part)
                return False
            return True

        def on_leave(self, node: cst.CSTNode) -> None:
            if self.stmt and self.stmt[-1] is node:
                self.stmt.pop()

    _V().walk(fn.body)
    return found
