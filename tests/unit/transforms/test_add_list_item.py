"""The `add-list-item` transform: before/after fixtures (helpers: tests/unit/transforms/helpers.py)."""

from __future__ import annotations

import pytest

from sm120patch.transforms.add_list_item import AddListItem
from tests.unit.transforms.helpers import ADD, assert_rewrites, assert_satisfied, assert_untouched, run, src


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
