"""Shared before/after helpers for the transform tests, in the manner of libcst's CodemodTest.

Each fixture states the exact expected output text; every changing fixture is also
checked for idempotence (the output is `satisfied` and a second run changes nothing)
and for compiling.
"""

from __future__ import annotations

import textwrap
from typing import Any

import libcst as cst

from sm120patch.transforms import FileOutcome

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
