"""The transform registry: every transform is registered, described and documented."""

from __future__ import annotations

from sm120patch.transforms import TRANSFORMS
from sm120patch.transforms.add_collection_item import AddCollectionItem
from sm120patch.transforms.add_condition import AddCondition
from sm120patch.transforms.add_function import AddFunction
from sm120patch.transforms.add_list_item import AddListItem
from sm120patch.transforms.insert_rule import InsertRule
from sm120patch.transforms.narrow_arch_test import NarrowArchTest
from sm120patch.transforms.widen_arch_test import WidenArchTest
from sm120patch.transforms.widen_major_list import WidenMajorList
from sm120patch.transforms.wrap_expression import WrapExpression


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
