"""The bundle check's words are closed sets (as `Status` and the edit outcomes): a state outside
them is refused where it is made, and JSON carries the plain word."""

from __future__ import annotations

import json

import pytest

from sm120patch.bundle.node import CheckState, FileState, RecipeCheck


def test_a_check_state_outside_the_set_is_refused() -> None:
    with pytest.raises(ValueError, match="'fine'"):
        RecipeCheck("r", "sglang", "fine", "why")  # type: ignore[arg-type]


def test_the_json_word_is_the_states_value() -> None:
    c = RecipeCheck("r", "sglang", "mismatch", "bytes", ["not the bundle's bytes"])  # type: ignore[arg-type]
    assert c.state is CheckState.MISMATCH
    d = json.loads(json.dumps(c.to_dict()))
    assert d["state"] == "mismatch" and d["problems"] == ["not the bundle's bytes"]
    assert json.dumps({"f": FileState.CHANGED}) == '{"f": "changed"}'
    assert f"{FileState.MISSING}" == "missing" and str(CheckState.NOT_EXPORTED) == "not-exported"


def test_the_sets_are_what_the_docs_name() -> None:
    assert [s.value for s in FileState] == ["patched", "unpatched", "changed", "missing"]
    assert [s.value for s in CheckState] == ["ok", "mismatch", "not-exported"]
