"""The `widen-arch-test` transform: before/after fixtures (helpers: tests/unit/transforms/helpers.py)."""

from __future__ import annotations

from typing import Any

import libcst as cst
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sm120patch.transforms.widen_arch_test import WidenArchTest
from tests.unit.transforms.helpers import WIDEN, assert_rewrites, assert_satisfied, assert_untouched, run, src


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
