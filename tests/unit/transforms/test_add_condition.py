"""The `add-condition` transform: before/after fixtures (helpers: tests/unit/transforms/helpers.py)."""

from __future__ import annotations

from sm120patch.transforms.add_condition import AddCondition
from tests.unit.transforms.helpers import assert_rewrites

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
