"""The `to_dict`s that are `dataclasses.asdict` (issue 21) keep the JSON they wrote by hand: the same
keys in the same order, the same values and types. With asdict a field reordered or added in the
dataclass changes the JSON (a bundle's manifest.json, a journal's dependents, `--json`), so the
shapes are spelled out here as the hand-written methods had them."""

from __future__ import annotations

from pathlib import Path

from sm120patch.bundle.format import Bundle, BundleRecipe, BundleTarget, FileChange
from sm120patch.bundle.node import RecipeCheck
from sm120patch.engine.journal import Dependent
from sm120patch.planning.plan import EditResult
from sm120patch.probes.environment.compiled_cache import CachedBuild
from sm120patch.probes.environment.elf import FileArchs
from sm120patch.triage.logkind import Evidence
from sm120patch.verify.decide import Decision

A, B = "a" * 64, "b" * 64


def _items(d: dict) -> list[tuple[str, object, type]]:
    return [(k, v, type(v)) for k, v in d.items()]


def test_bundle_manifest_parts() -> None:
    fc = FileChange("sglang/x.py", A, B)
    assert _items(fc.to_dict()) == [("path", "sglang/x.py", str), ("before", A, str), ("after", B, str)]
    r = BundleRecipe(
        "rid", "sglang", "title", "why", "exported", "reason", "proof", "0001-rid.patch", A, B, ">=0.5.9",
        ["sm_120"], ["flashinfer:x"], [fc], {"verdicts": [{"result": "pass"}]},
    )  # fmt: skip
    assert list(r.to_dict()) == [
        "id", "package", "title", "why", "status", "reason", "proof", "patch", "patch_sha256",
        "recipe_sha256", "versions", "arch", "needs", "files", "evidence",
    ]  # fmt: skip
    d = r.to_dict()
    assert d["files"] == [{"path": "sglang/x.py", "before": A, "after": B}]
    assert (d["arch"], d["needs"], d["evidence"]) == (["sm_120"], ["flashinfer:x"], {"verdicts": [{"result": "pass"}]})
    assert (d["patch"], d["patch_sha256"], d["recipe_sha256"]) == ("0001-rid.patch", A, B)
    t = BundleTarget("sglang", "0.5.9", "site-packages", "python")
    assert list(t.to_dict().items()) == [
        ("package", "sglang"), ("version", "0.5.9"), ("apply_from", "site-packages"), ("clone_directory", "python"),
    ]  # fmt: skip
    b = Bundle(Path("/b"), "1.2.3", ["sm_120"], "static", [t], None, [r])
    assert b.to_dict()["targets"] == [t.to_dict()] and b.to_dict()["recipes"] == [r.to_dict()]


def test_node_check_and_edit_results() -> None:
    c = RecipeCheck("rid", "sglang", "ok", "fine", ["p"], [{"result": "pass"}], "sm120patch rollback '/a b'")
    assert _items(c.to_dict()) == [
        ("id", "rid", str), ("package", "sglang", str), ("state", "ok", str), ("reason", "fine", str),
        ("problems", ["p"], list), ("probe", [{"result": "pass"}], list),
        ("rollback", "sm120patch rollback '/a b'", str),
    ]  # fmt: skip
    assert RecipeCheck("rid", "sglang", "mismatch", "r").to_dict()["rollback"] is None
    e = EditResult("gate", "changed", ["x.py"], "note")
    assert _items(e.to_dict()) == [("name", "gate", str), ("outcome", "changed", str), ("files", ["x.py"], list),
                                   ("note", "note", str)]  # fmt: skip


def test_paths_become_strings_where_the_hand_written_ones_made_them() -> None:
    dep = Dependent(Path("/site packages"), "flashinfer", "fix")
    assert _items(dep.to_dict()) == [
        ("root", "/site packages", str), ("package", "flashinfer", str), ("id", "fix", str),
    ]  # fmt: skip
    cb = CachedBuild(Path("/cache/m.so"), "aot", True, "why")
    assert _items(cb.to_dict()) == [
        ("path", "/cache/m.so", str), ("kind", "aot", str), ("shadows", True, bool), ("why", "why", str),
        ("fix", "", str),
    ]  # fmt: skip


def test_census_triage_and_verify_parts() -> None:
    fa = FileArchs("/x.so", "so", [120, 90], [120], "")
    assert _items(fa.to_dict()) == [
        ("path", "/x.so", str), ("kind", "so", str), ("sass", [120, 90], list), ("ptx", [120], list),
        ("error", "", str),
    ]  # fmt: skip
    assert _items(Evidence(7, "line").to_dict()) == [("line_no", 7, int), ("line", "line", str)]
    d = Decision("cand", ["rid"], False, ["slower"], "slower", {1: {"delta": -0.2}, 8: {"delta": None}}, {"agree": 3})
    assert list(d.to_dict()) == [
        "name",
        "recipes",
        "keep",
        "reasons",
        "summary",
        "throughput",
        "answers",
        "launch",
        "verdict",
        "taken",
        "not_exercised",
    ]
    assert d.to_dict()["verdict"] == "rolled back"
    assert (d.to_dict()["taken"], d.to_dict()["not_exercised"]) == ([], [])
    assert d.to_dict()["throughput"] == {"1": {"delta": -0.2}, "8": {"delta": None}}  # JSON keys are strings
    assert (d.to_dict()["answers"], d.to_dict()["launch"]) == ({"agree": 3}, None)


def test_the_action_list_shape() -> None:
    """`plan --json` and `apply --json` carry the action list under "actions" in this shape (issue 33):
    a script comparing the two, or reading what an apply would do, keys on these names."""
    import pytest

    from sm120patch.engine.actions import Action, ActionKind

    a = Action(ActionKind.WRITE, "/t r", "sglang", "rid", "gate found", ("b.py", "a.py"))
    assert _items(a.to_dict()) == [
        ("kind", "write", str), ("tree", "/t r", str), ("package", "sglang", str), ("recipe", "rid", str),
        ("reason", "gate found", str), ("files", ["a.py", "b.py"], list),
    ]  # fmt: skip
    assert [k.value for k in ActionKind] == [
        "retire", "rollback-dependent", "rollback-stale", "record-proof", "write", "commit",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="not-a-kind"):
        Action("not-a-kind", "/t", "sglang", "rid", "why")  # type: ignore[arg-type]
