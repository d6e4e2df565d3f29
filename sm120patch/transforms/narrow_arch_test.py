"""narrow-arch-test: `is_blackwell_supported() and <fmt>` becomes `is_sm100_supported() and <fmt>`.

The opposite of widening: a test that admits SM12x by accident (`blackwell` covers majors
10 and 12) in front of kernels that exist for SM100 only. Narrowing it lets SM12x fall
through to the next branch, which is how upstream fixed the same tests later.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from sm120patch.arch import PREDICATE_MAJORS, predicate_token
from sm120patch.transforms.base import (
    FileOutcome,
    Transform,
    arch_predicates,
    leaf_identifier,
    need_str,
    unknown_keys,
)
from sm120patch.transforms.bindings import ensure_bound, rename_token
from sm120patch.transforms.rewrite import find_ifs

if TYPE_CHECKING:
    import libcst as cst
else:  # loaded on first use: validating recipes needs no parser
    from sm120patch.transforms._cst import cst


class NarrowArchTest(Transform):
    NAME: ClassVar[str] = "narrow-arch-test"
    DESCRIPTION: ClassVar[str] = (
        "In the named functions, every `if`/`elif` test that mentions `near` and holds a `drop` "
        "arch predicate gets it replaced by the `keep` one, in the same shape "
        "(`is_blackwell_supported()` -> `is_sm100_supported()`), binding the new name beside its "
        "sibling. Such tests that hold arch predicates but no `drop` one are satisfied."
    )
    PARAMS_HELP: ClassVar[str] = (
        'params = { drop = "blackwell", keep = "sm100", near = "mxfp4", import_from = "sglang.srt.utils" (optional) }'
    )

    @classmethod
    def check_params(cls, params: dict[str, Any], functions: Any) -> str | None:
        problem = (
            unknown_keys(params, ("drop", "keep", "near", "import_from"))
            or need_str(params, "drop")
            or need_str(params, "keep")
            or need_str(params, "near")
            or need_str(params, "import_from", required=False)
        )
        if problem:
            return problem
        for tok in (params["drop"], params["keep"]):
            if tok not in PREDICATE_MAJORS:
                return f"{tok!r} is not an arch token; use one of {', '.join(PREDICATE_MAJORS)}"
        if not PREDICATE_MAJORS[params["keep"]] < PREDICATE_MAJORS[params["drop"]]:
            return f"keep ({params['keep']}) must admit fewer majors than drop ({params['drop']})"
        if not functions:
            return "'functions' must name the functions that hold the test"
        return None

    def __init__(self, params: dict[str, Any], functions: Any) -> None:
        super().__init__(params, functions)
        self.drop: str = params["drop"]
        self.keep: str = params["keep"]
        self.near: str = params["near"]
        self.import_from: str | None = params.get("import_from")

    def shape(self) -> str:
        return f"arch test mentioning {self.near!r}"

    def apply(self, module: cst.Module) -> FileOutcome:
        out = FileOutcome()
        swaps: dict[cst.CSTNode, cst.CSTNode] = {}
        needed: list[tuple[str, str]] = []
        for fn in self.functions_in(module):
            for test in _if_tests(fn):
                if self.near not in module.code_for_node(test):
                    continue
                preds = arch_predicates(test)
                if not preds:
                    continue
                drops = [p for p in preds if predicate_token(leaf_identifier(p) or "") == self.drop]
                if not drops:
                    out.satisfied += 1
                    continue
                for p in drops:
                    ident = leaf_identifier(p) or ""
                    new_ident = ident.replace(self.drop, self.keep)
                    swaps[p] = rename_token(p, ident, new_ident)
                    base = p.func if isinstance(p, cst.Call) else p
                    if isinstance(base, cst.Name):
                        needed.append((new_ident, ident))
                out.changed += 1
        if not swaps:
            return out

        new = self.replace(module, swaps)
        for name, sibling in needed:
            new, why = ensure_bound(new, name, sibling=sibling, import_from=self.import_from)
            if why:
                out.notes.append(why)
        out.module = new
        return out


def _if_tests(fn: cst.FunctionDef) -> list[cst.BaseExpression]:
    return [node.test for node in find_ifs(fn)]  # a statement walk, not a visitor that rebuilds the body
