"""add-condition: an arch-keyed `if` gets one more `and` condition, written in the recipe.

Where a gate should stay open but not everywhere: SGLang's allreduce-fusion auto-enable is
`if (<model> and (sm90 or sm100 or sm120) and tp_size > 1 ...):`; this appends
`and not (is_sm120_supported() and self.tp_size >= 4)`, so the launch decides at run time.
Only tests that hold an arch predicate and whose own arm (test and body, never the
`elif`/`else` branches) mentions `near` are touched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from sm120patch.arch import PREDICATE_MAJORS, predicate_token
from sm120patch.transforms.base import (
    FileOutcome,
    Transform,
    arch_predicates,
    arm_code,
    leaf_identifier,
    need_expr,
    need_imports,
    need_str,
    norm_expr,
    parenthesized,
    unknown_keys,
)
from sm120patch.transforms.bindings import ensure_bound
from sm120patch.transforms.rewrite import find_ifs

if TYPE_CHECKING:
    import libcst as cst
else:  # loaded on first use: validating recipes needs no parser
    from sm120patch.transforms._cst import cst


class AddCondition(Transform):
    NAME: ClassVar[str] = "add-condition"
    DESCRIPTION: ClassVar[str] = (
        "In the named functions, every `if`/`elif` whose test holds an arch predicate and whose "
        "own arm mentions `near` (and, with `arch`, admits that arch) gets `and <code>` appended to "
        "its test. A test that already has `code` as one of its `and` terms is satisfied. `imports` "
        '("module:name") are bound when unbound.'
    )
    PARAMS_HELP: ClassVar[str] = (
        'params = { code = "not (is_sm120_supported() and self.tp_size >= 4)", near = "allreduce_fusion", '
        'arch = "sm120" (optional), imports = ["sglang.srt.utils:is_sm120_supported"] (optional) }'
    )

    @classmethod
    def check_params(cls, params: dict[str, Any], functions: Any) -> str | None:
        problem = (
            unknown_keys(params, ("code", "near", "arch", "imports"))
            or need_expr(params, "code")
            or need_str(params, "near")
            or need_str(params, "arch", required=False)
            or need_imports(params)
        )
        if problem:
            return problem
        if "arch" in params and params["arch"] not in PREDICATE_MAJORS:
            return f"arch {params['arch']!r} is not an arch token; use one of {', '.join(PREDICATE_MAJORS)}"
        if not functions:
            return "'functions' must name the functions that hold the test"
        return None

    def __init__(self, params: dict[str, Any], functions: Any) -> None:
        super().__init__(params, functions)
        self.code: str = params["code"]
        self.near: str = params["near"]
        self.imports = [tuple(i.split(":")) for i in params.get("imports", [])]
        self.majors = PREDICATE_MAJORS[params["arch"]] if "arch" in params else None
        self._norm = norm_expr(self.code)

    def shape(self) -> str:
        return f"arch-keyed `if` mentioning {self.near!r}"

    def apply(self, module: cst.Module) -> FileOutcome:
        out = FileOutcome()
        swaps: dict[cst.CSTNode, cst.CSTNode] = {}
        for fn in self.functions_in(module):
            for stmt in _ifs(fn):
                preds = arch_predicates(stmt.test)
                if self.near not in arm_code(module, stmt) or not preds:
                    continue
                tokens = [predicate_token(leaf_identifier(p) or "") for p in preds]
                if self.majors is not None and not any(t and PREDICATE_MAJORS[t] & self.majors for t in tokens):
                    continue  # e.g. an SM100-only test: the condition could never matter there
                terms = _and_terms(stmt.test)
                if any(norm_expr(module.code_for_node(t)) == self._norm for t in terms):
                    out.satisfied += 1
                    continue
                swaps[stmt.test] = self._extend(stmt.test)
                out.changed += 1
        if not swaps:
            return out
        new = self.replace(module, swaps)
        for mod, name in self.imports:
            new, why = ensure_bound(new, name, import_from=mod)
            if why:
                out.notes.append(why)
        out.module = new
        return out

    def _extend(self, test: cst.BaseExpression) -> cst.BaseExpression:
        """`test and (code)`, laid out like the test's own last `and` (one term per line stays so)."""
        left = test.with_changes(lpar=[], rpar=[])
        if not (isinstance(left, cst.BooleanOperation) and isinstance(left.operator, cst.And)):
            left = parenthesized(left)  # `a or b` must not become `a or b and c`
        last = _last_and(test)
        op = last.deep_clone() if last is not None else cst.And()  # a node appears once in a tree
        right = cst.parse_expression(self.code)
        if isinstance(right, (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr)) and not (
            isinstance(right, cst.BooleanOperation) and isinstance(right.operator, cst.And)
        ):
            right = parenthesized(right)
        return cst.BooleanOperation(left=left, operator=op, right=right, lpar=test.lpar, rpar=test.rpar)  # type: ignore[arg-type]


def _ifs(fn: cst.FunctionDef) -> list[cst.If]:
    return find_ifs(fn)  # a statement walk: a visitor would rebuild every node of the body


def _and_terms(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    """`a and b and c` (left-nested) as [a, b, c]; anything else is one term."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        left = test.left
        return [*([left] if left.lpar else _and_terms(left)), test.right]
    return [test]


def _last_and(test: cst.BaseExpression) -> cst.And | None:
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return test.operator
    return None
