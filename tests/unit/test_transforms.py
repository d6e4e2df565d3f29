"""Before/after fixtures for every transform, in the manner of libcst's CodemodTest.

Each fixture states the exact expected output text; every changing fixture is also
checked for idempotence (the output is `satisfied` and a second run changes nothing)
and for compiling.
"""

from __future__ import annotations

import textwrap
from typing import Any

import libcst as cst
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sm120patch.transforms import TRANSFORMS, FileOutcome
from sm120patch.transforms.add_collection_item import AddCollectionItem
from sm120patch.transforms.add_condition import AddCondition
from sm120patch.transforms.add_function import AddFunction
from sm120patch.transforms.add_list_item import AddListItem
from sm120patch.transforms.insert_rule import InsertRule
from sm120patch.transforms.narrow_arch_test import NarrowArchTest
from sm120patch.transforms.widen_arch_test import WidenArchTest
from sm120patch.transforms.widen_major_list import WidenMajorList
from sm120patch.transforms.wrap_expression import WrapExpression

WIDEN = {"has": ["sm90", "sm100"], "add": "sm120", "import_from": "sglang.srt.utils"}
ADD = {"anchors": ["flashinfer_trtllm", "flashinfer_mxfp4"], "item": "flashinfer_cutlass"}
RULE_CODE = """
if (
    self.moe_runner_backend == "auto"
    and is_sm120_supported()
):
    self.moe_runner_backend = "flashinfer_cutlass"
"""
RULE = {
    "code": RULE_CODE,
    "assigns": "moe_runner_backend",
    "value": "flashinfer_cutlass",
    "arch": "sm120",
    "imports": ["sglang.srt.utils:is_sm120_supported"],
}


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def run(cls: type, params: dict[str, Any], functions: list[str], before: str) -> FileOutcome:
    assert cls.check_params(params, functions) is None
    return cls(params, functions).apply(cst.parse_module(before))


def assert_rewrites(
    cls: type, params: dict[str, Any], functions: list[str], before: str, after: str, changed: int = 1
) -> None:
    """`before` becomes exactly `after`; `after` compiles and is left alone as satisfied."""
    before, after = src(before), src(after)
    out = run(cls, params, functions, before)
    assert out.notes == []
    assert out.module is not None, "expected a rewrite"
    assert out.module.code == after
    assert out.changed == changed
    compile(out.module.code, "<after>", "exec")
    again = run(cls, params, functions, after)
    assert again.module is None and again.changed == 0
    assert again.satisfied >= 1


def assert_satisfied(cls: type, params: dict[str, Any], functions: list[str], code: str, sites: int = 1) -> None:
    out = run(cls, params, functions, src(code))
    assert out.module is None and out.changed == 0 and out.notes == []
    assert out.satisfied == sites


def assert_untouched(cls: type, params: dict[str, Any], functions: list[str], code: str) -> None:
    out = run(cls, params, functions, src(code))
    assert out.module is None and out.changed == 0 and out.satisfied == 0


def test_registry_names_every_transform() -> None:
    expected = {
        "widen-arch-test": WidenArchTest,
        "narrow-arch-test": NarrowArchTest,
        "add-list-item": AddListItem,
        "insert-rule": InsertRule,
        "widen-major-list": WidenMajorList,
        "add-collection-item": AddCollectionItem,
        "wrap-expression": WrapExpression,
        "add-condition": AddCondition,
        "add-function": AddFunction,
    }
    assert expected == TRANSFORMS
    for cls in TRANSFORMS.values():
        assert cls.DESCRIPTION and cls.PARAMS_HELP and "\n" not in cls.PARAMS_HELP


# --- widen-arch-test ------------------------------------------------------------------------------------


def test_widen_module_flag_gains_flag_and_multiline_import() -> None:
    assert_rewrites(
        WidenArchTest,
        WIDEN,
        ["apply_flashinfer_allreduce_fusion"],
        """
        from sglang.srt.utils import (
            is_cuda,
            is_sm90_supported,
            is_sm100_supported,
        )

        _is_cuda = is_cuda()
        _is_sm90_supported = _is_cuda and is_sm90_supported()
        _is_sm100_supported = _is_cuda and is_sm100_supported()


        def apply_flashinfer_allreduce_fusion(batch_size):
            return (
                (_is_sm90_supported or _is_sm100_supported)
                and batch_size > 0
            )
        """,
        """
        from sglang.srt.utils import (
            is_cuda,
            is_sm90_supported,
            is_sm100_supported,
            is_sm120_supported,
        )

        _is_cuda = is_cuda()
        _is_sm90_supported = _is_cuda and is_sm90_supported()
        _is_sm100_supported = _is_cuda and is_sm100_supported()
        _is_sm120_supported = _is_cuda and is_sm120_supported()


        def apply_flashinfer_allreduce_fusion(batch_size):
            return (
                (_is_sm90_supported or _is_sm100_supported or _is_sm120_supported)
                and batch_size > 0
            )
        """,
    )


def test_widen_sibling_in_the_middle_of_a_multiline_import() -> None:
    assert_rewrites(
        WidenArchTest,
        WIDEN,
        ["f"],
        """
        from sglang.srt.utils import (
            is_sm100_supported,
            is_sm90_supported,
            log_info_on_rank0,
        )

        _is_sm90_supported = is_sm90_supported()
        _is_sm100_supported = is_sm100_supported()


        def f():
            return _is_sm90_supported or _is_sm100_supported
        """,
        """
        from sglang.srt.utils import (
            is_sm100_supported,
            is_sm120_supported,
            is_sm90_supported,
            log_info_on_rank0,
        )

        _is_sm90_supported = is_sm90_supported()
        _is_sm100_supported = is_sm100_supported()
        _is_sm120_supported = is_sm120_supported()


        def f():
            return _is_sm90_supported or _is_sm100_supported or _is_sm120_supported
        """,
    )


def test_widen_call_operands_extend_a_single_line_import() -> None:
    assert_rewrites(
        WidenArchTest,
        WIDEN,
        ["f"],
        """
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported


        def f(x):
            if is_sm90_supported() or is_sm100_supported():
                return x
            return None
        """,
        """
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported, is_sm120_supported


        def f(x):
            if is_sm90_supported() or is_sm100_supported() or is_sm120_supported():
                return x
            return None
        """,
    )


def test_widen_platform_attribute_needs_no_import() -> None:
    assert_rewrites(
        WidenArchTest,
        WIDEN,
        ["f"],
        """
        from sglang.srt.platforms import get_platform


        def f():
            return get_platform().is_sm90 or get_platform().is_sm100
        """,
        """
        from sglang.srt.platforms import get_platform


        def f():
            return get_platform().is_sm90 or get_platform().is_sm100 or get_platform().is_sm120
        """,
    )


def test_widen_reversed_operand_order() -> None:
    assert_rewrites(
        WidenArchTest,
        WIDEN,
        ["f"],
        """
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported

        _is_sm100_supported = is_sm100_supported()
        _is_sm90_supported = is_sm90_supported()


        def f():
            return _is_sm100_supported or _is_sm90_supported
        """,
        """
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported, is_sm120_supported

        _is_sm100_supported = is_sm100_supported()
        _is_sm120_supported = is_sm120_supported()
        _is_sm90_supported = is_sm90_supported()


        def f():
            return _is_sm100_supported or _is_sm90_supported or _is_sm120_supported
        """,
    )


def test_widen_parenthesised_sub_chain_inside_a_longer_or() -> None:
    assert_rewrites(
        WidenArchTest,
        WIDEN,
        ["f"],
        """
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported


        def f(_is_hip):
            return _is_hip or (is_sm90_supported() or is_sm100_supported())
        """,
        """
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported, is_sm120_supported


        def f(_is_hip):
            return _is_hip or (is_sm90_supported() or is_sm100_supported() or is_sm120_supported())
        """,
    )


def test_widen_method_in_class_and_every_chain_in_it() -> None:
    assert_rewrites(
        WidenArchTest,
        WIDEN,
        ["f"],
        """
        from sglang.srt.platforms import get_platform


        class A:
            def f(self):
                a = get_platform().is_sm90 or get_platform().is_sm100
                b = get_platform().is_sm100 or get_platform().is_sm90
                return a and b
        """,
        """
        from sglang.srt.platforms import get_platform


        class A:
            def f(self):
                a = get_platform().is_sm90 or get_platform().is_sm100 or get_platform().is_sm120
                b = get_platform().is_sm100 or get_platform().is_sm90 or get_platform().is_sm120
                return a and b
        """,
        changed=2,
    )


def test_widen_near_scopes_to_the_statement_mentioning_it() -> None:
    params = {**WIDEN, "near": "allreduce_fusion"}
    assert_rewrites(
        WidenArchTest,
        params,
        ["_handle_model_specific_adjustments"],
        """
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported


        def _handle_model_specific_adjustments(self):
            if is_sm90_supported() or is_sm100_supported():
                self.attention_backend = "fa3"
            if self.tp_size > 1:
                pass
            elif is_sm90_supported() or is_sm100_supported():
                self.enable_flashinfer_allreduce_fusion = True
            x = is_sm90_supported() or is_sm100_supported()
            return x
        """,
        """
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported, is_sm120_supported


        def _handle_model_specific_adjustments(self):
            if is_sm90_supported() or is_sm100_supported():
                self.attention_backend = "fa3"
            if self.tp_size > 1:
                pass
            elif is_sm90_supported() or is_sm100_supported() or is_sm120_supported():
                self.enable_flashinfer_allreduce_fusion = True
            x = is_sm90_supported() or is_sm100_supported()
            return x
        """,
    )


def test_widen_near_does_not_leak_from_a_later_branch() -> None:
    """Issue 14.3: `near` is the arm's own test and body. A word in an `elif`/`else` branch
    (or a nested one) must not widen the `if` above it, whose arm never mentions it."""
    before = """
        def f(self):
            if is_sm90_supported() or is_sm100_supported():
                self.attention_backend = "fa3"
            elif self.tp_size > 1:
                self.enable_flashinfer_allreduce_fusion = True
            else:
                self.x = "allreduce_fusion"
            while is_sm90_supported() or is_sm100_supported():
                break
            else:
                self.enable_flashinfer_allreduce_fusion = False
        """
    assert_untouched(WidenArchTest, {**WIDEN, "near": "allreduce_fusion"}, ["f"], before)


def test_widen_near_with_no_mention_is_untouched() -> None:
    assert_untouched(
        WidenArchTest,
        {**WIDEN, "near": "allreduce_fusion"},
        ["f"],
        """
        def f(self):
            if is_sm90_supported() or is_sm100_supported():
                self.attention_backend = "fa3"
        """,
    )


@pytest.mark.parametrize(
    "test",
    [
        "is_sm90_supported() or is_blackwell_supported()",
        "_is_sm90_supported or _is_sm100_supported or _is_sm120_supported",
        "is_sm100_supported() or is_sm120_supported()",
        "get_platform().is_sm90 or get_platform().is_sm100 or get_platform().is_sm120",
        "is_hopper() or is_sm100_supported() or is_sm12x_supported()",
    ],
)
def test_widen_satisfied_when_the_test_already_admits_sm120(test: str) -> None:
    assert_satisfied(
        WidenArchTest,
        WIDEN,
        ["f"],
        f"""
        def f():
            return {test}
        """,
    )


def test_widen_untouched_outside_the_named_functions() -> None:
    before = src("""
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported

        GATE = is_sm90_supported() or is_sm100_supported()


        def other():
            return is_sm90_supported() or is_sm100_supported()


        def f():
            return is_sm90_supported() or is_sm100_supported()
        """)
    out = run(WidenArchTest, WIDEN, ["f"], before)
    assert out.changed == 1 and out.module is not None
    code = out.module.code
    assert "GATE = is_sm90_supported() or is_sm100_supported()\n" in code
    assert "def other():\n    return is_sm90_supported() or is_sm100_supported()\n" in code
    assert "def f():\n    return is_sm90_supported() or is_sm100_supported() or is_sm120_supported()\n" in code


@pytest.mark.parametrize(
    "test",
    [
        "_is_sm90_supported or _is_hip",  # one arch operand: not an arch test
        "is_sm90_supported() or is_sm103_supported()",  # sm100 missing
        "is_sm90_supported(dev) or is_sm100_supported(dev)",  # calls with arguments are not predicates we copy
        "is_sm90_supported() and is_sm100_supported()",  # not an or
    ],
)
def test_widen_leaves_other_shapes_alone(test: str) -> None:
    assert_untouched(
        WidenArchTest,
        WIDEN,
        ["f"],
        f"""
        def f(dev=None):
            return {test}
        """,
    )


def test_widen_unbindable_flag_is_a_note_not_a_rewrite_of_broken_code() -> None:
    params = {"has": ["sm90", "sm100"], "add": "sm120"}  # no import_from
    out = run(
        WidenArchTest,
        params,
        ["f"],
        src("""
        def f():
            return _is_sm90_supported or _is_sm100_supported
        """),
    )
    assert out.changed == 1
    assert out.notes and "_is_sm120_supported" in out.notes[0]


def test_widen_import_from_fallback_when_sibling_is_not_module_level() -> None:
    out = run(
        WidenArchTest,
        WIDEN,
        ["f"],
        src("""
        import os


        def f():
            from sglang.srt.utils import is_sm90_supported, is_sm100_supported

            return is_sm90_supported() or is_sm100_supported()
        """),
    )
    assert out.notes == [] and out.module is not None
    assert out.module.code.startswith("import os\nfrom sglang.srt.utils import is_sm120_supported\n")
    compile(out.module.code, "<after>", "exec")


def test_widen_needles_and_missing_reason() -> None:
    t = WidenArchTest(WIDEN, ["a", "b"])
    assert t.needles() == ["def a(", "def b("]
    assert "a() / b()" in t.describe_missing()
    # once a named function was seen without the gate, the reason names it and the shape sought
    t.apply(cst.parse_module("def b():\n    return 1\n"))
    reason = t.describe_missing()
    assert "b()" in reason and "a()" not in reason and "sm90 or sm100" in reason


@pytest.mark.parametrize(
    ("params", "functions", "fragment"),
    [
        ({"add": "sm120"}, ["f"], "'has' is missing"),
        ({"has": [], "add": "sm120"}, ["f"], "'has' must be a non-empty list"),
        ({"has": ["sm90"], "add": "sm999"}, ["f"], "'sm999' is not an arch token"),
        ({"has": ["sm90"], "add": "sm120", "typo": 1}, ["f"], "unknown param(s) typo"),
        ({"has": ["sm90"], "add": "sm120", "near": 3}, ["f"], "'near' must be a non-empty string"),
        ({"has": ["sm90"], "add": "sm120"}, [], "'functions' must name"),
    ],
)
def test_widen_check_params(params: dict[str, Any], functions: list[str], fragment: str) -> None:
    problem = WidenArchTest.check_params(params, functions)
    assert problem is not None and fragment in problem and "\n" not in problem


# Semantics: evaluate the gate before and after for every major. The widened gate must
# answer exactly as before on 8..11 and answer True on 12.
OPERANDS = {"flag": "_is_sm{n}_supported", "call": "is_sm{n}_supported()", "platform": "get_platform().is_sm{n}"}
GATE_HEADER = """_MAJOR = 0
_is_hip = False
_enabled = True


def is_sm90_supported():
    return _MAJOR == 9


def is_sm100_supported():
    return _MAJOR == 10


def is_sm120_supported():
    return _MAJOR == 12


class _Platform:
    def __getattr__(self, name):
        return _MAJOR == int(name[len("is_sm"):]) // 10


def get_platform():
    return _Platform()


_is_sm90_supported = is_sm90_supported()
_is_sm100_supported = is_sm100_supported()
"""


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(
    shape=st.sampled_from(sorted(OPERANDS)),
    reverse=st.booleans(),
    extra=st.sampled_from(["", "_is_hip or ", " and _enabled"]),
    parens=st.booleans(),
)
def test_widen_gate_semantics(shape: str, reverse: bool, extra: str, parens: bool) -> None:
    ops = [OPERANDS[shape].format(n=90), OPERANDS[shape].format(n=100)]
    if reverse:
        ops.reverse()
    chain = " or ".join(ops)
    if parens or extra:
        chain = f"({chain})"
    expr = f"{extra}{chain}" if extra.endswith("or ") else f"{chain}{extra}"
    code = GATE_HEADER + f"\n\ndef gate():\n    return {expr}\n"
    params = {"has": ["sm90", "sm100"], "add": "sm120"}
    out = run(WidenArchTest, params, ["gate"], code)
    assert out.notes == [] and out.module is not None and out.changed == 1
    new = out.module.code
    for major in (8, 9, 10, 11, 12):
        old_ns: dict[str, Any] = {}
        new_ns: dict[str, Any] = {}
        exec(compile(code.replace("_MAJOR = 0", f"_MAJOR = {major}", 1), "<before>", "exec"), old_ns)
        exec(compile(new.replace("_MAJOR = 0", f"_MAJOR = {major}", 1), "<after>", "exec"), new_ns)
        if major == 12:
            assert new_ns["gate"]() is True
        else:
            assert new_ns["gate"]() == old_ns["gate"]()
    assert run(WidenArchTest, params, ["gate"], new).module is None


# --- add-list-item --------------------------------------------------------------------------------------


def test_add_list_item_uncomments_between_elements() -> None:
    assert_rewrites(
        AddListItem,
        ADD,
        ["_should_run_flashinfer_autotune"],
        """
        def _should_run_flashinfer_autotune(self):
            backend = self.server_args.moe_runner_backend
            return backend in [
                "flashinfer_trtllm",
                # TODO: flashinfer_cutlass will cause some flashinfer compilation errors.
                # "flashinfer_cutlass",
                "flashinfer_mxfp4",
            ]
        """,
        """
        def _should_run_flashinfer_autotune(self):
            backend = self.server_args.moe_runner_backend
            return backend in [
                "flashinfer_trtllm",
                # TODO: flashinfer_cutlass will cause some flashinfer compilation errors.
                "flashinfer_cutlass",
                "flashinfer_mxfp4",
            ]
        """,
    )


def test_add_list_item_uncomments_after_the_last_element() -> None:
    assert_rewrites(
        AddListItem,
        ADD,
        ["f"],
        """
        def f(backend):
            return backend in [
                "flashinfer_trtllm",
                "flashinfer_mxfp4",
                # "flashinfer_cutlass",
                # a closing remark
            ]
        """,
        """
        def f(backend):
            return backend in [
                "flashinfer_trtllm",
                "flashinfer_mxfp4",
                "flashinfer_cutlass",
                # a closing remark
            ]
        """,
    )


def test_add_list_item_uncomment_keeps_a_trailing_comment_on_its_element() -> None:
    assert_rewrites(
        AddListItem,
        ADD,
        ["f"],
        """
        def f(backend):
            return backend in [
                "flashinfer_trtllm",  # first
                # 'flashinfer_cutlass'
                "flashinfer_mxfp4",
            ]
        """,
        """
        def f(backend):
            return backend in [
                "flashinfer_trtllm",  # first
                "flashinfer_cutlass",
                "flashinfer_mxfp4",
            ]
        """,
    )


def test_add_list_item_appends_multiline_with_trailing_comma() -> None:
    assert_rewrites(
        AddListItem,
        ADD,
        ["f"],
        """
        def f(backend):
            return backend in [
                "flashinfer_trtllm",
                "flashinfer_mxfp4",
            ]
        """,
        """
        def f(backend):
            return backend in [
                "flashinfer_trtllm",
                "flashinfer_mxfp4",
                "flashinfer_cutlass",
            ]
        """,
    )


def test_add_list_item_appends_multiline_without_trailing_comma() -> None:
    assert_rewrites(
        AddListItem,
        ADD,
        ["f"],
        """
        def f(backend):
            return backend in [
                "flashinfer_trtllm",
                "flashinfer_mxfp4"
            ]
        """,
        """
        def f(backend):
            return backend in [
                "flashinfer_trtllm",
                "flashinfer_mxfp4",
                "flashinfer_cutlass"
            ]
        """,
    )


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (
            '["flashinfer_trtllm", "flashinfer_mxfp4"]',
            '["flashinfer_trtllm", "flashinfer_mxfp4", "flashinfer_cutlass"]',
        ),
        (
            "['flashinfer_mxfp4', 'flashinfer_trtllm',]",
            "['flashinfer_mxfp4', 'flashinfer_trtllm', \"flashinfer_cutlass\",]",
        ),
        (
            '["x", "flashinfer_trtllm", "flashinfer_mxfp4", "y"]',
            '["x", "flashinfer_trtllm", "flashinfer_mxfp4", "y", "flashinfer_cutlass"]',
        ),
    ],
)
def test_add_list_item_appends_single_line(before: str, after: str) -> None:
    assert_rewrites(
        AddListItem,
        ADD,
        ["f"],
        f"""
        def f(backend):
            return backend in {before}
        """,
        f"""
        def f(backend):
            return backend in {after}
        """,
    )


def test_add_list_item_every_matching_list_in_the_function_only() -> None:
    before = src("""
        OUTSIDE = ["flashinfer_trtllm", "flashinfer_mxfp4"]


        def f():
            a = ["flashinfer_trtllm", "flashinfer_mxfp4"]
            b = ["flashinfer_trtllm"]
            return [["flashinfer_mxfp4", "flashinfer_trtllm"]], a, b
        """)
    out = run(AddListItem, ADD, ["f"], before)
    assert out.changed == 2 and out.module is not None
    code = out.module.code
    assert 'OUTSIDE = ["flashinfer_trtllm", "flashinfer_mxfp4"]\n' in code
    assert 'a = ["flashinfer_trtllm", "flashinfer_mxfp4", "flashinfer_cutlass"]\n' in code
    assert 'b = ["flashinfer_trtllm"]\n' in code
    assert '[["flashinfer_mxfp4", "flashinfer_trtllm", "flashinfer_cutlass"]]' in code


@pytest.mark.parametrize(
    "lst",
    [
        '["flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_mxfp4"]',
        "['flashinfer_cutlass', 'flashinfer_mxfp4', 'flashinfer_trtllm']",
        '[\n        "flashinfer_trtllm",\n        "flashinfer_mxfp4",\n        "flashinfer_cutlass",\n    ]',
    ],
)
def test_add_list_item_satisfied_when_present(lst: str) -> None:
    assert_satisfied(AddListItem, ADD, ["f"], f"def f(backend):\n    return backend in {lst}\n")


def test_add_list_item_untouched_without_anchors_or_function() -> None:
    assert_untouched(
        AddListItem,
        ADD,
        ["f"],
        """
        def f(backend):
            return backend in ["flashinfer_trtllm", "triton"]


        def g(backend):
            return backend in ["flashinfer_trtllm", "flashinfer_mxfp4"]
        """,
    )


def test_add_list_item_append_keeps_the_last_elements_comment_in_place() -> None:
    out = run(
        AddListItem,
        ADD,
        ["f"],
        src("""
        def f(backend):
            return backend in [
                "flashinfer_trtllm",
                "flashinfer_mxfp4",  # keep me here
            ]
        """),
    )
    assert out.module is not None
    assert '"flashinfer_mxfp4",  # keep me here\n' in out.module.code


def test_add_list_item_check_params() -> None:
    assert AddListItem.check_params(ADD, ["f"]) is None
    assert "functions" in (AddListItem.check_params(ADD, []) or "")
    assert "'item' is missing" in (AddListItem.check_params({"anchors": ["a"]}, ["f"]) or "")
    assert "'anchors' must be" in (AddListItem.check_params({"anchors": "a", "item": "b"}, ["f"]) or "")
    assert "unknown param(s) extra" in (AddListItem.check_params({**ADD, "extra": 1}, ["f"]) or "")


# --- insert-rule ----------------------------------------------------------------------------------------


def test_insert_rule_after_docstring_with_import_into_existing_from_import() -> None:
    assert_rewrites(
        InsertRule,
        RULE,
        ["_handle_moe_kernel_config"],
        '''
        import logging

        from sglang.srt.utils import is_sm100_supported

        logger = logging.getLogger(__name__)


        class ServerArgs:
            def _handle_moe_kernel_config(self):
                """Pick the MoE runner."""
                if self.quantization == "fp8" and is_sm100_supported():
                    self.moe_runner_backend = "flashinfer_trtllm"
        ''',
        '''
        import logging

        from sglang.srt.utils import is_sm100_supported, is_sm120_supported

        logger = logging.getLogger(__name__)


        class ServerArgs:
            def _handle_moe_kernel_config(self):
                """Pick the MoE runner."""
                if (
                    self.moe_runner_backend == "auto"
                    and is_sm120_supported()
                ):
                    self.moe_runner_backend = "flashinfer_cutlass"

                if self.quantization == "fp8" and is_sm100_supported():
                    self.moe_runner_backend = "flashinfer_trtllm"
        ''',
    )


def test_insert_rule_without_docstring_goes_first_and_keeps_bound_import() -> None:
    assert_rewrites(
        InsertRule,
        RULE,
        ["f"],
        """
        from sglang.srt.utils import is_sm120_supported


        def f(self):
            # choose
            self.x = 1
        """,
        """
        from sglang.srt.utils import is_sm120_supported


        def f(self):
            if (
                self.moe_runner_backend == "auto"
                and is_sm120_supported()
            ):
                self.moe_runner_backend = "flashinfer_cutlass"

            # choose
            self.x = 1
        """,
    )


def test_insert_rule_adds_import_when_unbound() -> None:
    assert_rewrites(
        InsertRule,
        RULE,
        ["f"],
        """
        import logging


        def f(self):
            \"\"\"Only a docstring.\"\"\"
        """,
        """
        import logging
        from sglang.srt.utils import is_sm120_supported


        def f(self):
            \"\"\"Only a docstring.\"\"\"
            if (
                self.moe_runner_backend == "auto"
                and is_sm120_supported()
            ):
                self.moe_runner_backend = "flashinfer_cutlass"
        """,
    )


def test_insert_rule_prefers_the_first_listed_function() -> None:
    out = run(
        InsertRule,
        RULE,
        ["second_in_file", "first_in_file"],
        src("""
        class S:
            def first_in_file(self):
                pass

            def second_in_file(self):
                pass
        """),
    )
    assert out.module is not None and out.changed == 1
    code = out.module.code
    assert code.index("def first_in_file") < code.index("def second_in_file") < code.index("if (")


@pytest.mark.parametrize(
    "rule",
    [
        'if is_sm120_supported() and self.x:\n        self.moe_runner_backend = "flashinfer_cutlass"',
        'if is_blackwell_supported():\n        self.moe_runner_backend = "flashinfer_cutlass"',
        "if self.a:\n        pass\n    elif _is_sm120_supported:\n"
        '        self.moe_runner_backend = "flashinfer_cutlass"',
        'if get_platform().is_sm120:\n        if self.q:\n            self.moe_runner_backend = "flashinfer_cutlass"',
    ],
)
def test_insert_rule_satisfied_by_an_equivalent_upstream_rule(rule: str) -> None:
    assert_satisfied(InsertRule, RULE, ["g", "f"], f"def f(self):\n    {rule}\n")


@pytest.mark.parametrize(
    "rule",
    [
        'if is_sm100_supported():\n        self.moe_runner_backend = "flashinfer_cutlass"',  # wrong arch
        'if is_sm120_supported():\n        self.moe_runner_backend = "triton"',  # wrong value
        'if is_sm120_supported():\n        self.attention_backend = "flashinfer_cutlass"',  # wrong target
    ],
)
def test_insert_rule_not_fooled_by_near_misses(rule: str) -> None:
    code = f"from sglang.srt.utils import is_sm120_supported\n\n\ndef f(self):\n    {rule}\n"
    out = run(InsertRule, RULE, ["f"], code)
    assert out.changed == 1 and out.satisfied == 0 and out.module is not None


def test_insert_rule_missing_function_and_one_line_def() -> None:
    assert_untouched(InsertRule, RULE, ["f"], "def g(self):\n    pass\n")
    out = run(InsertRule, RULE, ["f"], "def f(self): pass\n")
    assert out.module is None and out.changed == 0 and "one-line def" in out.notes[0]


def test_insert_rule_import_keeps_module_docstring_first() -> None:
    import ast

    out = run(InsertRule, RULE, ["f"], '"""Server arguments."""\n\n\ndef f(self):\n    pass\n')
    assert out.module is not None
    assert ast.get_docstring(ast.parse(out.module.code)) == "Server arguments."


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"code": "x = 1"}, "single `if` statement"),
        ({"code": "if x:\n  pass\nfoo()"}, "does not parse"),
        ({"arch": "volta"}, "not an arch token"),
        ({"imports": ["sglang.srt.utils.is_sm120_supported"]}, "must read 'module:name'"),
        ({"assigns": ""}, "'assigns' must be a non-empty string"),
        ({"bogus": True}, "unknown param(s) bogus"),
    ],
)
def test_insert_rule_check_params(change: dict[str, Any], fragment: str) -> None:
    problem = InsertRule.check_params({**RULE, **change}, ["f"])
    assert problem is not None and fragment in problem
    assert "'functions'" in (InsertRule.check_params(RULE, []) or "")


# --- narrow-arch-test -----------------------------------------------------------------------

NARROW = {"drop": "blackwell", "keep": "sm100", "near": "mxfp4", "import_from": "sglang.srt.utils"}

NARROW_BEFORE = """\
from sglang.srt.utils import is_blackwell_supported, is_cuda


class ServerArgs:
    def _handle_model_specific_adjustments(self):
        if is_blackwell_supported():
            self.enable_flashinfer_allreduce_fusion = True
        if self.moe_runner_backend == "auto":
            if is_blackwell_supported() and is_mxfp4_quant_format:
                self.moe_runner_backend = "flashinfer_mxfp4"
            elif self.ep_size == 1:
                self.moe_runner_backend = "triton_kernel"
"""

NARROW_AFTER = """\
from sglang.srt.utils import is_blackwell_supported, is_sm100_supported, is_cuda


class ServerArgs:
    def _handle_model_specific_adjustments(self):
        if is_blackwell_supported():
            self.enable_flashinfer_allreduce_fusion = True
        if self.moe_runner_backend == "auto":
            if is_sm100_supported() and is_mxfp4_quant_format:
                self.moe_runner_backend = "flashinfer_mxfp4"
            elif self.ep_size == 1:
                self.moe_runner_backend = "triton_kernel"
"""


def test_narrow_arch_test_only_the_test_near_its_word() -> None:
    t = NarrowArchTest(NARROW, ["_handle_model_specific_adjustments"])
    out = t.apply(cst.parse_module(NARROW_BEFORE))
    assert out.changed == 1 and out.module is not None
    assert out.module.code == NARROW_AFTER  # the allreduce `if is_blackwell_supported()` is left alone
    again = NarrowArchTest(NARROW, ["_handle_model_specific_adjustments"]).apply(out.module)
    assert again.module is None and again.changed == 0 and again.satisfied >= 1
    compile(out.module.code, "x.py", "exec")


def test_narrow_arch_test_platform_shape_is_satisfied_or_narrowed() -> None:
    src = (
        "def _gpt_oss_overrides(cfg):\n"
        "    if get_platform().is_blackwell and is_mxfp4_quant_format:\n"
        "        return 1\n"
    )
    out = NarrowArchTest(NARROW, ["_gpt_oss_overrides"]).apply(cst.parse_module(src))
    assert out.module is not None and "get_platform().is_sm100 and is_mxfp4_quant_format" in out.module.code


def test_narrow_arch_test_params_must_narrow() -> None:
    assert NarrowArchTest.check_params({**NARROW, "keep": "sm120", "drop": "sm100"}, ["f"]) is not None
    assert NarrowArchTest.check_params(NARROW, []) is not None
    assert NarrowArchTest.check_params(NARROW, ["f"]) is None


def test_widen_copies_a_flag_bound_inside_if_else_never_imports_a_private_name() -> None:
    """Issue 14.2: a sibling flag bound inside a module-level `if`/`else` is copied in every
    branch; the old fallback emitted `from sglang.srt.utils import _is_sm120_supported`, a name
    that module never defines."""
    assert_rewrites(
        WidenArchTest,
        WIDEN,
        ["apply_flashinfer_allreduce_fusion"],
        """
        from sglang.srt.utils import is_cuda

        if is_cuda():
            from sglang.srt.utils import is_sm90_supported, is_sm100_supported

            _is_sm90_supported = is_sm90_supported()
            _is_sm100_supported = is_sm100_supported()
        else:
            _is_sm90_supported = _is_sm100_supported = False
            _is_sm100_supported = False


        def apply_flashinfer_allreduce_fusion() -> bool:
            return _is_sm90_supported or _is_sm100_supported
        """,
        """
        from sglang.srt.utils import is_cuda

        if is_cuda():
            from sglang.srt.utils import is_sm90_supported, is_sm100_supported, is_sm120_supported

            _is_sm90_supported = is_sm90_supported()
            _is_sm100_supported = is_sm100_supported()
            _is_sm120_supported = is_sm120_supported()
        else:
            _is_sm90_supported = _is_sm100_supported = False
            _is_sm100_supported = False
            _is_sm120_supported = False


        def apply_flashinfer_allreduce_fusion() -> bool:
            return _is_sm90_supported or _is_sm100_supported or _is_sm120_supported
        """,
    )


def test_widen_refuses_to_import_a_private_flag_it_cannot_copy() -> None:
    out = run(
        WidenArchTest,
        WIDEN,
        ["f"],
        src(
            """
            from sglang.srt.layers.flags import _is_sm90_supported, _is_sm100_supported as _s100


            def f() -> bool:
                return _is_sm90_supported or _s100
            """
        ).replace("_s100", "_is_sm100_supported"),
    )
    assert out.notes and "cannot bind _is_sm120_supported" in out.notes[0]


# --- add-collection-item --------------------------------------------------------------------------------

ARCHS = {"target": "_DSA_ARCHS", "items": ["DeepseekV32ForCausalLM", "DeepseekV3ForCausalLMNextN"]}


def test_add_collection_item_module_tuple_one_per_line() -> None:
    assert_rewrites(
        AddCollectionItem,
        ARCHS,
        [],
        """
        import logging

        _DSA_ARCHS = (
            "GlmMoeDsaForCausalLM",
            "GlmMoeDsaForCausalLMNextN",
        )


        def check(arch):
            return arch in _DSA_ARCHS
        """,
        """
        import logging

        _DSA_ARCHS = (
            "GlmMoeDsaForCausalLM",
            "GlmMoeDsaForCausalLMNextN",
            "DeepseekV32ForCausalLM",
            "DeepseekV3ForCausalLMNextN",
        )


        def check(arch):
            return arch in _DSA_ARCHS
        """,
    )


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("X = frozenset()", "X = frozenset()"),  # no literal inside: not a site
        ('X = frozenset({"a"})', 'X = frozenset({"a", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLMNextN"})'),
        ("X: tuple = ('a',)", "X: tuple = ('a', 'DeepseekV32ForCausalLM', 'DeepseekV3ForCausalLMNextN',)"),
        ('X = ["a"]', 'X = ["a", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLMNextN"]'),
    ],
)
def test_add_collection_item_literal_shapes(before: str, after: str) -> None:
    params = {**ARCHS, "target": "X"}
    if before == after:
        assert_untouched(AddCollectionItem, params, [], before)
    else:
        assert_rewrites(AddCollectionItem, params, [], before, after)


def test_add_collection_item_in_function_by_anchors_ints() -> None:
    assert_rewrites(
        AddCollectionItem,
        {"anchors": [9, 10], "items": [12]},
        ["default"],
        """
        def default(sm_major):
            if sm_major not in (9, 10):
                return None
            return (8, 9)
        """,
        """
        def default(sm_major):
            if sm_major not in (9, 10, 12):
                return None
            return (8, 9)
        """,
    )


def test_add_collection_item_partial_is_completed_and_full_is_satisfied() -> None:
    assert_rewrites(
        AddCollectionItem,
        ARCHS,
        [],
        '_DSA_ARCHS = ("DeepseekV32ForCausalLM",)\n',
        '_DSA_ARCHS = ("DeepseekV32ForCausalLM", "DeepseekV3ForCausalLMNextN",)\n',
    )
    full = '_DSA_ARCHS = ("DeepseekV3ForCausalLMNextN", "DeepseekV32ForCausalLM")'
    assert_satisfied(AddCollectionItem, ARCHS, [], full)


def test_add_collection_item_missing_shapes() -> None:
    assert_untouched(AddCollectionItem, ARCHS, [], "_DSA_ARCHS = get_archs()\n")
    assert_untouched(AddCollectionItem, ARCHS, [], "def f():\n    _DSA_ARCHS = ('a',)\n")  # not module level
    t = AddCollectionItem(ARCHS, [])
    assert t.apply(cst.parse_module("x = 1\n")).module is None
    assert "no module-level _DSA_ARCHS" in t.describe_missing()


@pytest.mark.parametrize(
    ("params", "functions", "fragment"),
    [
        ({"items": ["a"]}, [], "exactly one of 'target'"),
        ({"target": "X", "anchors": ["a"], "items": ["a"]}, ["f"], "exactly one of 'target'"),
        ({"target": "X"}, [], "'items' is missing"),
        ({"target": "X", "items": [True]}, [], "strings or integers"),
        ({"target": "X", "items": []}, [], "strings or integers"),
        ({"anchors": [9], "items": [12]}, [], "'functions'"),
        ({"target": "X", "items": ["a"], "more": 1}, [], "unknown param(s) more"),
    ],
)
def test_add_collection_item_check_params(params: dict[str, Any], functions: list[str], fragment: str) -> None:
    assert fragment in (AddCollectionItem.check_params(params, functions) or "")


# --- wrap-expression ----------------------------------------------------------------------------------------

GPTOSS = {
    "anchor": "get_platform().is_sm100",
    "template": '__anchor__ or (get_platform().is_sm120 and cfg.kv_cache_dtype != "fp8_e4m3")',
    "near": "trtllm_mha",
}


def test_wrap_expression_only_the_arm_that_mentions_near() -> None:
    assert_rewrites(
        WrapExpression,
        GPTOSS,
        ["_overrides"],
        """
        def _overrides(cfg, overrides):
            if cfg.attention_backend is None:
                if get_platform().is_sm100:
                    overrides["attention_backend"] = "trtllm_mha"
                elif get_platform().is_sm90:
                    overrides["attention_backend"] = "fa3"
            if get_platform().is_sm100 and cfg.mxfp4:
                overrides["moe_runner_backend"] = "flashinfer_mxfp4"
            elif get_platform().is_sm100:
                overrides["note"] = "trtllm_mha is elsewhere"
            return overrides
        """,
        """
        def _overrides(cfg, overrides):
            if cfg.attention_backend is None:
                if get_platform().is_sm100 or (get_platform().is_sm120 and cfg.kv_cache_dtype != "fp8_e4m3"):
                    overrides["attention_backend"] = "trtllm_mha"
                elif get_platform().is_sm90:
                    overrides["attention_backend"] = "fa3"
            if get_platform().is_sm100 and cfg.mxfp4:
                overrides["moe_runner_backend"] = "flashinfer_mxfp4"
            elif get_platform().is_sm100 or (get_platform().is_sm120 and cfg.kv_cache_dtype != "fp8_e4m3"):
                overrides["note"] = "trtllm_mha is elsewhere"
            return overrides
        """,
        changed=2,
    )


def test_wrap_expression_operand_is_parenthesised_and_anchor_parens_kept() -> None:
    assert_rewrites(
        WrapExpression,
        {"anchor": 'model_arch == "Glm"', "template": '__anchor__ or model_arch == "DeepseekV32"'},
        ["resolve"],
        """
        def resolve(model_arch, major):
            is_glm = (
                model_arch == "Glm"
                and major == 12
            )
            also = (model_arch == "Glm")
            return is_glm, also
        """,
        """
        def resolve(model_arch, major):
            is_glm = (
                (model_arch == "Glm" or model_arch == "DeepseekV32")
                and major == 12
            )
            also = (model_arch == "Glm" or model_arch == "DeepseekV32")
            return is_glm, also
        """,
        changed=2,
    )


def test_wrap_expression_in_call_touches_the_argument_value_only() -> None:
    fp4 = {
        "anchor": "backend",
        "template": '"auto" if __anchor__ == "cutlass" and is_sm120_supported() else __anchor__',
        "in_call": "mm_fp4",
        "imports": ["sglang.srt.utils:is_sm120_supported"],
    }
    assert_rewrites(
        WrapExpression,
        fp4,
        ["fp4_gemm"],
        """
        from flashinfer import mm_fp4


        def fp4_gemm(a, b, backend):
            backend = backend.lower()
            out = mm_fp4(a, b, backend=backend)
            return mm_bf16(a, b, backend=backend), out
        """,
        """
        from flashinfer import mm_fp4
        from sglang.srt.utils import is_sm120_supported


        def fp4_gemm(a, b, backend):
            backend = backend.lower()
            out = mm_fp4(a, b, backend="auto" if backend == "cutlass" and is_sm120_supported() else backend)
            return mm_bf16(a, b, backend=backend), out
        """,
    )


def test_wrap_expression_comparison_needs_no_parens_under_and() -> None:
    assert_rewrites(
        WrapExpression,
        {"anchor": "sm_major not in (9, 10)", "template": "__anchor__ and not (sm_major == 12 and cuda >= 13)"},
        ["default"],
        """
        def default(sm_major, cuda, backend):
            if backend is not None or sm_major not in (9, 10):
                return None
            return "flashinfer"
        """,
        """
        def default(sm_major, cuda, backend):
            if backend is not None or (sm_major not in (9, 10) and not (sm_major == 12 and cuda >= 13)):
                return None
            return "flashinfer"
        """,
    )


def test_wrap_expression_absent_anchor_and_bad_params() -> None:
    sm90 = "def _overrides(cfg):\n    return get_platform().is_sm90\n"
    assert_untouched(WrapExpression, GPTOSS, ["_overrides"], sm90)
    assert_untouched(WrapExpression, GPTOSS, ["_overrides"], "def _overrides(is_sm100):\n    is_sm100 = 1\n")
    cases = {
        "template": ({**GPTOSS, "template": "get_platform().is_sm120"}, "__anchor__"),
        "bare": ({**GPTOSS, "template": "(__anchor__)"}, "__anchor__"),
        "syntax": ({**GPTOSS, "anchor": "a or"}, "'anchor' is not a Python expression"),
        "imports": ({**GPTOSS, "imports": ["nocolon"]}, "module:name"),
        "unknown": ({**GPTOSS, "where": "x"}, "unknown param(s) where"),
    }
    for params, fragment in cases.values():
        assert fragment in (WrapExpression.check_params(params, ["f"]) or "")
    assert "'functions'" in (WrapExpression.check_params(GPTOSS, []) or "")


# --- add-condition ------------------------------------------------------------------------------------------

TP4 = {
    "code": "not (is_sm120_supported() and self.tp_size >= 4)",
    "near": "allreduce_fusion",
    "imports": ["sglang.srt.utils:is_sm120_supported"],
}


def test_add_condition_multiline_test_keeps_its_layout() -> None:
    assert_rewrites(
        AddCondition,
        TP4,
        ["_handle_model_specific_adjustments"],
        """
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported


        def _handle_model_specific_adjustments(self):
            if (
                not self.enable_flashinfer_allreduce_fusion
                and (is_sm90_supported() or is_sm100_supported())
                and self.nnodes == 1
            ):
                self.enable_flashinfer_allreduce_fusion = True
            elif is_sm90_supported():
                self.other = "allreduce_fusion"
        """,
        """
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported, is_sm120_supported


        def _handle_model_specific_adjustments(self):
            if (
                not self.enable_flashinfer_allreduce_fusion
                and (is_sm90_supported() or is_sm100_supported())
                and self.nnodes == 1
                and not (is_sm120_supported() and self.tp_size >= 4)
            ):
                self.enable_flashinfer_allreduce_fusion = True
            elif is_sm90_supported() and not (is_sm120_supported() and self.tp_size >= 4):
                self.other = "allreduce_fusion"
        """,
        changed=2,
    )


def test_add_condition_parenthesises_an_or_test_and_skips_non_arch_tests() -> None:
    assert_rewrites(
        AddCondition,
        {"code": "view.tp_size < 4 or view.nvlink", "near": "fusion"},
        ["auto"],
        """
        def auto(view):
            if view.fusion is None:
                return {}
            if is_sm90_supported() or is_sm100_supported():
                return {"fusion": "auto"}
        """,
        """
        def auto(view):
            if view.fusion is None:
                return {}
            if (is_sm90_supported() or is_sm100_supported()) and (view.tp_size < 4 or view.nvlink):
                return {"fusion": "auto"}
        """,
    )


def test_add_condition_check_params() -> None:
    assert AddCondition.check_params(TP4, ["f"]) is None
    assert "'near' is missing" in (AddCondition.check_params({"code": "a"}, ["f"]) or "")
    assert "not a Python expression" in (AddCondition.check_params({**TP4, "code": "a and"}, ["f"]) or "")
    assert "'functions'" in (AddCondition.check_params(TP4, []) or "")


# --- add-function -------------------------------------------------------------------------------------------

HELPER = {
    "code": 'def _helper(n: int) -> bool:\n    """Why."""\n    return n in _SIZES and is_sm120_supported()\n',
    "imports": ["sglang.srt.utils:is_sm120_supported"],
}


def test_add_function_goes_above_the_named_function_with_its_comments_kept() -> None:
    assert_rewrites(
        AddFunction,
        HELPER,
        ["eligible_group"],
        """
        \"\"\"Doc.\"\"\"

        import torch

        _SIZES = (2, 4, 8)


        # group eligibility
        @functools.cache
        def eligible_group(n: int) -> bool:
            return n > 1
        """,
        """
        \"\"\"Doc.\"\"\"

        import torch
        from sglang.srt.utils import is_sm120_supported

        _SIZES = (2, 4, 8)


        def _helper(n: int) -> bool:
            \"\"\"Why.\"\"\"
            return n in _SIZES and is_sm120_supported()


        # group eligibility
        @functools.cache
        def eligible_group(n: int) -> bool:
            return n > 1
        """,
    )


def test_add_function_missing_and_params() -> None:
    assert_untouched(AddFunction, HELPER, ["eligible_group"], "class A:\n    def eligible_group(self):\n        pass\n")
    assert "one unindented `def`" in (AddFunction.check_params({"code": "x = 1"}, ["f"]) or "")
    assert "one unindented `def`" in (AddFunction.check_params({"code": "def a(): pass\ndef b(): pass"}, ["f"]) or "")
    assert "'functions'" in (AddFunction.check_params(HELPER, []) or "")


def test_add_condition_arch_skips_tests_that_never_admit_it() -> None:
    before = """
        def adjust(self):
            if is_cuda() and is_sm100_supported():
                self.enable_flashinfer_allreduce_fusion = True
            if is_sm90_supported() or is_blackwell_supported():
                self.enable_flashinfer_allreduce_fusion = True
        """
    after = """
        def adjust(self):
            if is_cuda() and is_sm100_supported():
                self.enable_flashinfer_allreduce_fusion = True
            if (is_sm90_supported() or is_blackwell_supported()) and not (is_sm120_supported() and self.tp_size >= 4):
                self.enable_flashinfer_allreduce_fusion = True
        """
    params = {**TP4, "arch": "sm120"}
    params.pop("imports")
    assert_rewrites(AddCondition, params, ["adjust"], before, after)
    assert "not an arch token" in (AddCondition.check_params({**TP4, "arch": "ampere"}, ["f"]) or "")
