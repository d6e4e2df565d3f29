"""The transform library: small libcst rewrites that recipes name and parameterise."""

from __future__ import annotations

from sm120patch.transforms.add_collection_item import AddCollectionItem
from sm120patch.transforms.add_condition import AddCondition
from sm120patch.transforms.add_function import AddFunction
from sm120patch.transforms.add_list_item import AddListItem
from sm120patch.transforms.base import FileOutcome, Transform
from sm120patch.transforms.insert_rule import InsertRule
from sm120patch.transforms.narrow_arch_test import NarrowArchTest
from sm120patch.transforms.widen_arch_test import WidenArchTest
from sm120patch.transforms.widen_major_list import WidenMajorList
from sm120patch.transforms.wrap_expression import WrapExpression

TRANSFORMS: dict[str, type[Transform]] = {
    t.NAME: t
    for t in (
        WidenArchTest,
        NarrowArchTest,
        AddListItem,
        InsertRule,
        AddCollectionItem,
        WrapExpression,
        AddCondition,
        AddFunction,
        WidenMajorList,
    )
}

__all__ = ["TRANSFORMS", "FileOutcome", "Transform"]
