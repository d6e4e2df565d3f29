"""The `narrow-arch-test` transform: before/after fixtures (helpers: tests/unit/transforms/helpers.py)."""

from __future__ import annotations

import libcst as cst

from sm120patch.transforms.narrow_arch_test import NarrowArchTest

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
