"""The `add-collection-item` transform: before/after fixtures (helpers: tests/unit/transforms/helpers.py)."""

from __future__ import annotations

from typing import Any

import libcst as cst
import pytest

from sm120patch.transforms.add_collection_item import AddCollectionItem
from tests.unit.transforms.helpers import assert_rewrites, assert_satisfied, assert_untouched

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
