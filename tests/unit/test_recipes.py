"""Recipes: the real catalogue loads, and strict validation names the file and the key in one line."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sm120patch.arch import Arch
from sm120patch.catalogue.recipes import Recipe, default_recipe_dir, load_recipe, load_recipes
from sm120patch.errors import RecipeError, UserError
from sm120patch.transforms import TRANSFORMS

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

SGLANG_IDS = {
    "sglang-allreduce-fusion-sm120",
    "sglang-autotune-flashinfer-cutlass",
    "sglang-gptoss-mxfp4-sm120",
    "sglang-moe-backend-sm120",
    # the SGLang 0.5.17-0.5.23 frontier (ids fixed: docs and scripts name them)
    "sglang-dsa-sparse-mla-sm120",
    "sglang-fp4-gemm-b12x-sm120",
    "sglang-gdn-prefill-sm120",
    "sglang-pcie-ipc-allreduce-sm120",
    "sglang-autotune-moe-guard-sm120",
    "sglang-gptoss-trtllm-mha-sm120",
}
FLASHINFER_IDS = {"flashinfer-trtllm-comm-sm120"}
CATALOGUE_IDS = SGLANG_IDS | FLASHINFER_IDS
# the oldest release each package's recipes claim, and the one just before it
FIRST = {"sglang": ("0.5.5", "0.5.4"), "flashinfer": ("0.5.0", "0.4.1")}
NEWEST = {"sglang": "0.5.23", "flashinfer": "0.7.4"}

GOOD = """\
id = "r"
package = "sglang"
title = "A title"
why = "Because."
versions = ">=0.5.5"
arch = ["sm_120", "sm_121"]
needs = ["flashinfer:trtllm_comm"]

[[edit]]
name = "gate"
transform = "widen-arch-test"
functions = ["f"]
files = ["srt/layers/communicator.py"]
params = { has = ["sm90", "sm100"], add = "sm120" }
"""


def write(tmp_path: Path, text: str | bytes, name: str = "r") -> Path:
    d = tmp_path / "sglang"
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name}.toml"
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return p


def expect_error(path: Path, key: str) -> str:
    with pytest.raises(RecipeError) as ei:
        load_recipe(path)
    msg = str(ei.value)
    assert "\n" not in msg and "\r" not in msg, msg
    assert msg.startswith(f"{path}: "), msg
    assert key in msg, msg
    return msg


# --- the real catalogue ---------------------------------------------------------------------------------


def test_catalogue_loads() -> None:
    recipes = load_recipes()
    assert {r.id for r in recipes} == CATALOGUE_IDS
    assert default_recipe_dir().name == "patches"
    for r in recipes:
        assert r.path.stem == r.id and r.path.parent.name == r.package
        assert r.covers_arch(Arch(12, 0)) and r.covers_arch(Arch(12, 1)) and not r.covers_arch(Arch(10, 0))
        _, before = FIRST[r.package]
        assert not r.covers_version(before) and r.covers_version(r.tested[0])
        # every shipped recipe says which releases its tests cover, all inside its range
        assert r.tested and all(r.covers_version(v) for v in r.tested) and r.tested[-1] == NEWEST[r.package]
        assert r.title and r.why and r.why == r.why.strip()
        assert len(r.sha256) == 64 and r.sha256 == __import__("hashlib").sha256(r.path.read_bytes()).hexdigest()
        for e in r.edits:
            if e.diff_path is not None:
                assert e.transform is None and e.diff_path.is_file() and e.diff_path.parent == r.path.parent
                continue
            assert e.transform in TRANSFORMS and (e.functions or e.params.get("target"))  # a module-level name
            assert TRANSFORMS[e.transform].check_params(e.params, e.functions) is None
    assert [r.id for r in load_recipes(package="flashinfer")] == sorted(FLASHINFER_IDS)
    assert [r.id for r in load_recipes(package="sglang")] == sorted(SGLANG_IDS)


def test_catalogue_via_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    write(tmp_path, GOOD)
    monkeypatch.setenv("SM120PATCH_RECIPES", str(tmp_path))
    assert default_recipe_dir() == tmp_path
    assert [r.id for r in load_recipes()] == ["r"]


def test_good_recipe_fields(tmp_path: Path) -> None:
    r = load_recipe(write(tmp_path, GOOD))
    assert isinstance(r, Recipe)
    assert r.id == "r" and r.package == "sglang" and r.arch == (Arch(12, 0), Arch(12, 1))
    assert r.needs == ("flashinfer:trtllm_comm",) and r.crash_signatures == () and r.advice == ""
    (e,) = r.edits
    assert (e.name, e.transform, e.functions, e.files, e.optional) == (
        "gate",
        "widen-arch-test",
        ("f",),
        ("srt/layers/communicator.py",),
        False,
    )
    assert e.params == {"has": ["sm90", "sm100"], "add": "sm120"}


@pytest.mark.parametrize(
    ("version", "covered"),
    [
        ("0.5.5", True),
        ("0.5.10rc1", True),
        ("0.6.0.post1", True),
        ("0.5.4", False),
        (None, False),
        ("not a version", False),
    ],
)
def test_covers_version(tmp_path: Path, version: str | None, covered: bool) -> None:
    assert load_recipe(write(tmp_path, GOOD)).covers_version(version) is covered


def test_diff_edit_loads_with_path_next_to_recipe(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD.split("[[edit]]")[0] + '[[edit]]\ndiff = "fix.diff"\n')
    (p.parent / "fix.diff").write_text("--- a/x.py\n+++ b/x.py\n")
    (e,) = load_recipe(p).edits
    assert e.diff_path == p.parent / "fix.diff" and e.transform is None and e.name == "diff-0"


# --- strict validation ----------------------------------------------------------------------------------


def replace(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new, 1)


BAD = {
    "unknown-top-key": (GOOD.replace("[[edit]]", 'colour = "red"\n\n[[edit]]'), "colour"),
    "unknown-edit-key": (GOOD + 'where = "f"\n', "edit[0].where"),
    "bool-for-string": (replace('title = "A title"', "title = true"), "title"),
    "int-for-string": (replace('versions = ">=0.5.5"', "versions = 5"), "versions"),
    "string-for-list": (replace('arch = ["sm_120", "sm_121"]', 'arch = "sm_120"'), "arch"),
    "bool-for-edit-string": (replace('transform = "widen-arch-test"', "transform = true"), "edit[0].transform"),
    "string-for-bool": (GOOD + 'optional = "yes"\n', "edit[0].optional"),
    "string-for-params": (
        replace('params = { has = ["sm90", "sm100"], add = "sm120" }', 'params = "x"'),
        "edit[0].params",
    ),
    "list-item-not-string": (replace('needs = ["flashinfer:trtllm_comm"]', "needs = [1]"), "needs[0]"),
    "missing-required": (replace('why = "Because."\n', ""), "why"),
    "bad-pep440": (replace('versions = ">=0.5.5"', 'versions = ">>0.5"'), "versions"),
    "bad-arch": (replace('arch = ["sm_120", "sm_121"]', 'arch = ["sm_120", "ampere"]'), "arch[1]"),
    "unknown-package": (replace('package = "sglang"', 'package = "vllm"'), "package"),
    "id-not-filename": (replace('id = "r"', 'id = "other"'), "id"),
    "unknown-transform": (replace('transform = "widen-arch-test"', 'transform = "widen"'), "edit[0].transform"),
    "params-missing": (
        replace('params = { has = ["sm90", "sm100"], add = "sm120" }', 'params = { has = ["sm90"] }'),
        "edit[0].params",
    ),
    "params-bad-token": (replace('add = "sm120"', 'add = "sm1200"'), "edit[0].params"),
    "params-unknown": (replace('add = "sm120" }', 'add = "sm120", nearby = "x" }'), "edit[0].params"),
    "no-functions": (replace('functions = ["f"]\n', ""), "edit[0].params"),
    "hint-dotdot": (replace('"srt/layers/communicator.py"', '"srt/../../etc/passwd"'), "edit[0].files"),
    "hint-absolute": (replace('"srt/layers/communicator.py"', '"/etc/passwd"'), "edit[0].files"),
    "hint-backslash": (replace('"srt/layers/communicator.py"', '"srt\\\\layers\\\\c.py"'), "edit[0].files"),
    "hint-home": (replace('"srt/layers/communicator.py"', '"~/x.py"'), "edit[0].files"),
    "transform-and-diff": (GOOD + 'diff = "x.diff"\n', "edit[0]"),
    "neither": (GOOD.split("[[edit]]")[0] + '[[edit]]\nname = "x"\n', "edit[0]"),
    "missing-diff": (GOOD.split("[[edit]]")[0] + '[[edit]]\ndiff = "nope.diff"\n', "edit[0].diff"),
    "diff-escapes": (GOOD.split("[[edit]]")[0] + '[[edit]]\ndiff = "../x.diff"\n', "edit[0].diff"),
    "edit-empty": (GOOD.split("[[edit]]")[0] + "edit = []\n", "edit"),
    "edit-not-table": (GOOD.split("[[edit]]")[0] + "edit = [1]\n", "edit[0]"),
    "insert-rule-code": (replace('transform = "widen-arch-test"', 'transform = "insert-rule"'), "edit[0].params"),
    "tested-not-list": (replace('needs = ["flashinfer:trtllm_comm"]', 'tested = "0.5.9"'), "tested"),
    "tested-not-version": (replace('needs = ["flashinfer:trtllm_comm"]', 'tested = ["latest"]'), "tested[0]"),
    "tested-outside-versions": (
        replace('needs = ["flashinfer:trtllm_comm"]', 'tested = ["0.5.9", "0.5.4"]'),
        "tested[1]",
    ),
    "tested-twice": (replace('needs = ["flashinfer:trtllm_comm"]', 'tested = ["0.5.9", "0.5.9.0"]'), "tested"),
}


def test_tested_is_sorted_and_names_the_newest(tmp_path: Path) -> None:
    r = load_recipe(
        write(tmp_path, replace('needs = ["flashinfer:trtllm_comm"]', 'tested = ["0.5.23", "0.5.9", "0.5.10"]'))
    )
    assert r.tested == ("0.5.9", "0.5.10", "0.5.23") and str(r.newest_tested) == "0.5.23"
    assert [r.untested(v) for v in ("0.5.9", "0.5.23", "0.5.23.post1", "0.5.24.dev0", "0.6.0", None, "x")] == [
        False,
        False,
        True,
        True,
        True,
        False,
        False,
    ]
    assert load_recipe(write(tmp_path, GOOD)).untested("9.9") is False  # no `tested`: nothing is newer


@pytest.mark.parametrize("case", sorted(BAD))
def test_strict_validation(tmp_path: Path, case: str) -> None:
    text, key = BAD[case]
    expect_error(write(tmp_path, text), key)


def test_unknown_key_error_lists_the_allowed_keys(tmp_path: Path) -> None:
    msg = expect_error(write(tmp_path, GOOD + 'where = "f"\n'), "edit[0].where")
    assert "unknown key" in msg and "transform" in msg and "functions" in msg


@pytest.mark.parametrize(
    "text",
    [
        GOOD.replace('title = "A title"', 'title = "A title'),  # unterminated string
        GOOD[: len(GOOD) // 2],  # truncated mid-file
        GOOD.replace("[[edit]]", "[[edit]"),
        "id = 'x'\n" + GOOD,  # duplicate key
        "= 1\n",
    ],
)
def test_malformed_toml(tmp_path: Path, text: str) -> None:
    msg = expect_error(write(tmp_path, text), "invalid TOML")
    assert "line" in msg


def test_non_utf8(tmp_path: Path) -> None:
    msg = expect_error(write(tmp_path, GOOD.replace("Because.", "Caf\xe9.").encode("latin-1")), "UTF-8")
    assert "not UTF-8" in msg


def test_unreadable_path_is_a_recipe_error(tmp_path: Path) -> None:
    d = tmp_path / "sglang" / "dir.toml"
    d.mkdir(parents=True)
    expect_error(d, "cannot read")


def test_load_recipes_folder_rules(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="recipe folder not found"):
        load_recipes(tmp_path / "missing")
    write(tmp_path, GOOD)
    (tmp_path / "flashinfer").mkdir()
    (tmp_path / "flashinfer" / "r.toml").write_text(GOOD.replace('package = "sglang"', 'package = "flashinfer"'))
    with pytest.raises(RecipeError, match="also used by"):
        load_recipes(tmp_path)
    (tmp_path / "flashinfer" / "r.toml").unlink()
    (tmp_path / "flashinfer" / "s.toml").write_text(GOOD.replace('id = "r"', 'id = "s"'))
    with pytest.raises(RecipeError) as ei:
        load_recipes(tmp_path)
    assert "package" in str(ei.value) and "flashinfer/" in str(ei.value) and "\n" not in str(ei.value)


def test_empty_recipe_folder_fails_loudly(tmp_path: Path) -> None:
    (tmp_path / "sglang").mkdir()
    with pytest.raises(RecipeError, match="no recipes here") as e:
        load_recipes(tmp_path)
    assert str(tmp_path) in str(e.value)


def test_installed_copy_reads_its_own_data_not_a_stray_patches_folder(tmp_path: Path) -> None:
    """A wheel-like install: site/sm120patch/ with its data in sm120patch/patches/, and an
    unrelated, empty site/patches/ beside it (another package's). The catalogue is still ours."""
    import shutil
    import subprocess
    import sys

    pkg = Path(__import__("sm120patch").__file__).parent
    site = tmp_path / "site"
    shutil.copytree(pkg, site / "sm120patch", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(default_recipe_dir(), site / "sm120patch" / "patches", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "patches" / "sglang").mkdir(parents=True)
    env = {k: v for k, v in __import__("os").environ.items() if k != "SM120PATCH_RECIPES"}
    env["PYTHONPATH"] = str(site)
    code = "import sm120patch.catalogue.recipes as r; print(r.default_recipe_dir()); print(len(r.load_recipes()))"
    out = subprocess.run(
        [sys.executable, "-s", "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert out.returncode == 0, out.stderr
    where, count = out.stdout.split()
    assert Path(where) == site / "sm120patch" / "patches"
    assert int(count) == len(CATALOGUE_IDS)


def test_overlong_diff_name_is_a_recipe_error(tmp_path: Path) -> None:
    expect_error(write(tmp_path, GOOD.split("[[edit]]")[0] + f'[[edit]]\ndiff = "{"a" * 300}.diff"\n'), "edit[0].diff")


def test_deeply_nested_toml_is_a_recipe_error(tmp_path: Path) -> None:
    expect_error(write(tmp_path, GOOD + "x = " + "[" * 5000 + "]" * 5000 + "\n"), "TOML")


@pytest.mark.parametrize(
    "text",
    [
        GOOD.replace("[[edit]]", '"a\\nb" = 1\n\n[[edit]]'),
        GOOD + '"x\\ny" = 1\n',
        GOOD.replace('add = "sm120" }', 'add = "sm120", "p\\nq" = 1 }'),
        GOOD.split("[[edit]]")[0] + '[[edit]]\ndiff = "a\\nb.diff"\n',
    ],
)
def test_error_stays_one_line_for_keys_with_newlines(tmp_path: Path, text: str) -> None:
    with pytest.raises(RecipeError) as ei:
        load_recipe(write(tmp_path, text))
    assert "\n" not in str(ei.value)


# --- fuzzing: only RecipeError/UserError, ever ----------------------------------------------------------

# Strings are kept short (a diff name past NAME_MAX is the known bug pinned above).
_short = st.text(max_size=24)
_scalars = st.one_of(
    _short,
    st.integers(-5, 5),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(
        [
            "sglang",
            "sm_120",
            ">=0.5",
            "sm90",
            "sm100",
            "sm120",
            "widen-arch-test",
            "add-list-item",
            "insert-rule",
            "if x:\n    y = 1\n",
            "../x",
            "/abs",
        ]
    ),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_short, inner, max_size=4)),
    max_leaves=10,
)
_KEYS = [
    "id",
    "package",
    "title",
    "why",
    "versions",
    "arch",
    "needs",
    "crash_signatures",
    "advice",
    "min_tool_version",
    "edit",
    "name",
    "transform",
    "diff",
    "functions",
    "files",
    "optional",
    "params",
    "has",
    "add",
    "near",
    "import_from",
    "anchors",
    "item",
    "code",
    "assigns",
    "value",
    "imports",
]
_keys = st.one_of(st.sampled_from(_KEYS), _short)


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)} = {toml_value(x)}" for k, x in v.items()) + "}"


def render(d: dict[str, Any]) -> str:
    return "".join(f"{json.dumps(k, ensure_ascii=False)} = {toml_value(v)}\n" for k, v in d.items())


BASE: dict[str, Any] = {
    "id": "r",
    "package": "sglang",
    "title": "t",
    "why": "w",
    "versions": ">=0.5.5",
    "arch": ["sm_120"],
    "edit": [
        {"transform": "widen-arch-test", "functions": ["f"], "params": {"has": ["sm90", "sm100"], "add": "sm120"}},
    ],
}
FUZZ = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def load_only_user_errors(text: str | bytes) -> str | None:
    """Load; a refusal is a UserError naming the file. Returns the message after the file name, or None."""
    with tempfile.TemporaryDirectory() as tmp:
        p = write(Path(tmp), text)
        try:
            load_recipe(p)
        except UserError as e:  # RecipeError is a UserError
            assert str(e).startswith(str(p)), str(e)
            return str(e)[len(str(p)) :].lstrip(": ")
    return None


# the recipe format's types, written by hand from docs/recipe-format.md (not read from the loader)
TOP_TYPES: dict[str, type] = {
    "id": str,
    "package": str,
    "title": str,
    "why": str,
    "versions": str,
    "arch": list,
    "edit": list,
}
EDIT_TYPES: dict[str, type] = {"transform": str, "functions": list, "files": list, "params": dict}


def _wrong_type(value: Any, want: type) -> bool:
    return isinstance(value, bool) or not isinstance(value, want) if want is not bool else not isinstance(value, bool)


def test_base_fuzz_recipe_is_valid() -> None:
    load_only_user_errors(render(BASE))
    with tempfile.TemporaryDirectory() as tmp:
        assert load_recipe(write(Path(tmp), render(BASE))).id == "r"


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(blob: bytes) -> None:
    load_only_user_errors(blob)


@FUZZ
@given(st.dictionaries(_keys, _values, max_size=8))
def test_fuzz_random_tables(d: dict[str, Any]) -> None:
    err = load_only_user_errors(render(d))
    if err is None:  # what loads has what every recipe must have (docs/recipe-format.md)
        assert {"id", "package", "versions", "arch"} <= set(d), (d, err)


@FUZZ
@given(
    top=st.sampled_from(sorted(BASE)),
    edit_key=st.sampled_from(["transform", "functions", "files", "params", "optional", "diff", "name", "junk"]),
    where=st.sampled_from(["top", "edit", "params"]),
    value=_values,
    param_key=_keys,
)
def test_fuzz_mutated_valid_recipe(top: str, edit_key: str, where: str, value: Any, param_key: str) -> None:
    d = json.loads(json.dumps(BASE))
    if where == "top":
        d[top] = value
    elif where == "edit":
        d["edit"][0][edit_key] = value
    else:
        d["edit"][0]["params"][param_key] = value
    text = render(d)
    err = load_only_user_errors(text)
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError:  # the rendering itself is no TOML (a control character): refused as such
        assert err is not None and err.startswith("invalid TOML"), err
        return
    # a required key given a value of the wrong type is refused, and the refusal names that key
    if where == "top" and top in TOP_TYPES and _wrong_type(value, TOP_TYPES[top]):
        assert err is not None and err.startswith(top), (top, value, err)
    if where == "edit" and edit_key in EDIT_TYPES and _wrong_type(value, EDIT_TYPES[edit_key]):
        assert err is not None and err.startswith(f"edit[0].{edit_key}"), (edit_key, value, err)


@FUZZ
@given(st.text(max_size=200))
def test_fuzz_random_text(text: str) -> None:
    load_only_user_errors(GOOD[: len(text) % len(GOOD)] + text)


_one_line_text = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=24)
_one_line_values = st.recursive(
    st.one_of(_one_line_text, st.integers(-5, 5), st.booleans()),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_one_line_text, inner, max_size=3)),
    max_leaves=6,
)


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    where=st.sampled_from(["top", "edit", "params"]),
    key=st.one_of(st.sampled_from(_KEYS), _one_line_text),
    value=_one_line_values,
)
def test_fuzz_errors_are_one_line(where: str, key: str, value: Any) -> None:
    d = json.loads(json.dumps(BASE))
    target = {"top": d, "edit": d["edit"][0], "params": d["edit"][0]["params"]}[where]
    target[key] = value
    with tempfile.TemporaryDirectory() as tmp:
        p = write(Path(tmp), render(d))
        try:
            load_recipe(p)
        except UserError as e:
            assert "\n" not in str(e) and "\r" not in str(e), str(e)


# --- untested: a release newer than the newest the recipe was tested on -------------------------------------


def test_newer_release_is_untested_with_the_diff_and_nothing_carried(tmp_path: Path) -> None:
    """A fake 0.5.24 tree: every recipe that would open its gate is `untested`, loudly, with the same
    diff a tested release gets; no later recipe builds on it; `allow_untested` plans it as usual."""
    from sm120patch.planning.plan import APPLICABLE, UNTESTED, plan
    from sm120patch.planning.targets import discover
    from tests.unit.sglang_fakes import make_sglang

    recipes = load_recipes()
    (old,) = discover(make_sglang(tmp_path / "old", "0.5.9").parent)
    (new,) = discover(make_sglang(tmp_path / "new", "0.5.24").parent)
    sm120 = Arch(12, 0)
    before = {p.recipe.id: p for p in plan(old, recipes, sm120)}
    after = {p.recipe.id: p for p in plan(new, recipes, sm120)}
    opened = [rid for rid, p in before.items() if p.status == APPLICABLE]
    assert opened
    for rid in opened:
        p = after[rid]
        assert p.status == UNTESTED, (rid, p.status, p.reason)
        assert "0.5.24" in p.reason and p.recipe.tested[-1] in p.reason and "--allow-untested" in p.reason
        (alone,) = plan(old, [p.recipe], sm120)  # the same diff as a tested release, planned on its own
        assert p.diff() == alone.diff()
        for rel, (a, _) in p.changes.items():  # computed on the tree's own bytes, not on another recipe's
            assert a == (new.root / rel).read_bytes()
    allowed = {p.recipe.id: p for p in plan(new, recipes, sm120, allow_untested=True)}
    for rid in opened:
        assert allowed[rid].status == APPLICABLE and "--allow-untested" in allowed[rid].reason
        assert allowed[rid].diff() == before[rid].diff()  # and composed as usual
