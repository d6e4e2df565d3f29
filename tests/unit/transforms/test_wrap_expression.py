"""The `wrap-expression` transform: before/after fixtures (helpers: tests/unit/transforms/helpers.py)."""

from __future__ import annotations

from sm120patch.transforms.wrap_expression import WrapExpression
from tests.unit.transforms.helpers import assert_rewrites, assert_untouched

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
