"""The `add-function` transform: before/after fixtures (helpers: tests/unit/transforms/helpers.py)."""

from __future__ import annotations

from sm120patch.transforms.add_function import AddFunction
from tests.unit.transforms.helpers import assert_rewrites, assert_untouched

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
