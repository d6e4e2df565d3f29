"""The `insert-rule` transform: before/after fixtures (helpers: tests/unit/transforms/helpers.py)."""

from __future__ import annotations

from typing import Any

import pytest

from sm120patch.transforms.insert_rule import InsertRule
from tests.unit.transforms.helpers import RULE, assert_rewrites, assert_satisfied, assert_untouched, run, src


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
