"""Fuzzed recipes and journals through the CLI's own entry point (in process, for speed).

Whatever the bytes, the answer is exit 0/1, or exit 2 with one `sm120patch: error:` line: never a
traceback, never exit 3 (internal error). Recipes are only read: the tree is never written. A
mutated journal may make rollback restore files, but only ever to bytes it recorded (each file is
either as it was or the release's original) and never outside the tree.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sm120patch.catalogue.recipes import default_recipe_dir
from sm120patch.cli import main
from sm120patch.engine.journal import DIRNAME
from tests.reliability.conftest import APPLY, count, fingerprint, make_fake

RECIPE_CASES = 300
JOURNAL_CASES = 200
CATALOGUE = default_recipe_dir()
SOURCES = sorted(CATALOGUE.glob("sglang/*.toml"))
SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
    "derandomize": True,
    "database": None,
}


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
        except SystemExit as e:
            code = e.code
    code = 0 if code is None else code
    return int(code) if isinstance(code, int) else 1, out.getvalue(), err.getvalue()


def check_answer(code: int, out: str, err: str) -> None:
    if "Traceback" in out + err or code == 3 or "internal error" in err:
        count("tracebacks")
    assert "Traceback" not in out + err and "internal error" not in err, err
    assert code in (0, 1, 2), (code, err)
    if code == 2:
        assert err.startswith("sm120patch: error: "), err
        if len(err.strip().splitlines()) > 1:  # a control character from the input: see test below
            count("errors_split_by_control_chars")


def test_control_characters_from_input_stay_on_one_line(tmp_path: Path) -> None:
    d = tmp_path / "recipes"
    shutil.copytree(CATALOGUE, d)
    victim = d / "sglang" / SOURCES[0].name
    victim.write_text(victim.read_text() + '\n"evil\\nkey\\f" = 1\n')
    code, out, err = run("recipes", "--recipes", str(d))
    assert code == 2 and len(err.strip().splitlines()) == 1, err


# --- recipes -----------------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=30),
    st.sampled_from(
        [
            "sm_120",
            "sm90",
            "sm100",
            ">=0.5.5",
            "..",
            "/etc/passwd",
            "../x.py",
            "widen-arch-test",
            "add-list-item",
            "insert-rule",
            "sglang",
            "srt/server_args.py",
            "\x00",
            "~=1",
            "*",
        ]
    ),
)
values = st.recursive(
    scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=8
)


def toml_value(v: object) -> str:
    if v is None:
        return '""'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v).replace("inf", "inf").replace("nan", "nan")
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


@st.composite
def recipe_texts(draw) -> bytes:
    src = draw(st.sampled_from(SOURCES)).read_bytes()
    how = draw(
        st.sampled_from(["truncate", "flip", "splice", "line", "key", "edit-key", "string", "string", "garbage"])
    )
    if how == "truncate":
        return src[: draw(st.integers(0, len(src)))]
    if how == "flip":
        data = bytearray(src)
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
        return bytes(data)
    if how == "splice":
        i = draw(st.integers(0, len(src)))
        return src[:i] + draw(st.binary(max_size=40)) + src[i:]
    lines = src.decode().splitlines()
    if how == "line":
        del lines[draw(st.integers(0, len(lines) - 1))]
        return "\n".join(lines).encode()
    if how == "string":  # keep the types right, change a string: reaches the planner more often
        first_edit = lines.index("[[edit]]")
        idx = [i for i, ln in enumerate(lines) if i > first_edit and '"' in ln and "=" in ln and '"""' not in ln]
        i = draw(st.sampled_from(idx))
        a, b = lines[i].index('"'), lines[i].rindex('"')
        pick = draw(st.one_of(st.text(max_size=12), st.sampled_from(["sm90", "sm100", "sm120", "allreduce", "self"])))
        lines[i] = lines[i][: a + 1] + json.dumps(pick)[1:-1] + lines[i][b:]
        return "\n".join(lines).encode()
    if how in ("key", "edit-key"):
        idx = [i for i, ln in enumerate(lines) if " = " in ln and not ln.startswith(" ")]
        i = draw(st.sampled_from(idx))
        key = lines[i].split(" = ", 1)[0]
        if how == "key":  # replace a top-level value
            lines[i] = f"{key} = {toml_value(draw(values))}"
            return "\n".join(lines).encode()
        lines.append(f"{draw(st.sampled_from(['[[edit]]', '[edit.params]']))}")
        lines.append(f"{json.dumps(draw(st.text(min_size=1, max_size=10)))} = {toml_value(draw(values))}")
        return "\n".join(lines).encode()
    return draw(st.binary(max_size=200))


@pytest.fixture(scope="module")
def recipe_home():
    base = Path(tempfile.mkdtemp(prefix="sm120patch-fuzz-recipes-"))
    tree = make_fake(base / "tree")
    yield base, tree, fingerprint(tree)
    shutil.rmtree(base, ignore_errors=True)


@settings(max_examples=RECIPE_CASES, **SETTINGS)
@given(text=recipe_texts(), which=st.integers(0, len(SOURCES) - 1))
def test_fuzzed_recipe(recipe_home, text: bytes, which: int) -> None:
    base, tree, pristine = recipe_home
    d = base / "recipes"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(CATALOGUE, d)
    victim = d / "sglang" / SOURCES[which].name
    victim.write_bytes(text)
    code, out, err = run("recipes", "--recipes", str(d))
    check_answer(code, out, err)
    count("fuzz_recipes")
    count(f"fuzz_recipes_exit_{code}")
    if code == 2:
        assert str(d) in err
        return
    code, out, err = run("plan", str(tree), "--arch", "sm_120", "--probe", "none", "--recipes", str(d))
    check_answer(code, out, err)
    assert fingerprint(tree) == pristine  # a plan writes nothing


# --- journals --------------------------------------------------------------------------------------

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**64), 2**64),
        st.text(max_size=20),
        st.sampled_from(
            [
                "../outside/victim.py",
                "/etc/passwd",
                "sglang/../../x",
                "",
                ".",
                ".sm120patch/journal.json",
                "0" * 64,
                "f" * 64,
                "sglang/srt/server_args.py",
                "sglang/srt/layers/communicator.py",
            ]
        ),
    ),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=10), c, max_size=3),
    max_leaves=6,
)


def _paths(obj: object, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def journal_mutations(draw, good: dict) -> bytes:
    data = json.loads(json.dumps(good))
    raw = json.dumps(data, indent=1).encode()
    how = draw(st.sampled_from(["replace", "replace", "delete", "rename", "truncate", "flip"]))
    if how == "truncate":
        return raw[: draw(st.integers(0, len(raw)))]
    if how == "flip":
        b = bytearray(raw)
        i = draw(st.integers(0, len(b) - 1))
        b[i] = draw(st.integers(0, 255))
        return bytes(b)
    path = draw(st.sampled_from(_paths(data)[1:]))
    parent = data
    for k in path[:-1]:
        parent = parent[k]
    if how == "replace":
        parent[path[-1]] = draw(json_values)
    elif how == "delete":
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.sampled_from(["../escape.py", "/abs.py", "x" * 300, "sglang/srt/utils.py"]))] = parent.pop(
            path[-1]
        )
    return json.dumps(data).encode()


@pytest.fixture(scope="module")
def journal_home():
    base = Path(tempfile.mkdtemp(prefix="sm120patch-fuzz-journals-"))
    template = make_fake(base / "template")
    pristine = fingerprint(template)
    code, _, err = run("apply", str(template), *APPLY)
    assert code == 0, err
    good = json.loads((template / DIRNAME / "journal.json").read_text())
    good["pending"] = {
        "started": 0,
        "writes": {  # an interrupted second run, to fuzz recovery too
            rel: {"before": f["current"], "after": f["original"]} for rel, f in good["files"].items()
        },
    }
    outside = base / "outside"
    outside.mkdir()
    (outside / "victim.py").write_text("precious\n")
    yield base, template, pristine, good, outside
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("command", ["rollback", "status"])
def test_fuzzed_journal(journal_home, command: str) -> None:
    base, template, pristine, good, outside = journal_home
    applied = {k: v for k, v in fingerprint(template).items() if not k.startswith(DIRNAME)}
    outside_fp = fingerprint(outside)

    @settings(max_examples=JOURNAL_CASES // 2, **SETTINGS)
    @given(blob=journal_mutations(good))
    def case(blob: bytes) -> None:
        tree = base / "tree"
        shutil.rmtree(tree, ignore_errors=True)
        shutil.copytree(template, tree)
        (tree / DIRNAME / "journal.json").write_bytes(blob)
        before = fingerprint(tree)
        code, out, err = run(command, str(tree))
        check_answer(code, out, err)
        count("fuzz_journals")
        count(f"fuzz_journals_exit_{code}")
        assert fingerprint(outside) == outside_fp
        after = fingerprint(tree)
        if code == 2 or command == "status":
            assert {k: v for k, v in after.items() if not k.startswith(DIRNAME)} == {
                k: v for k, v in before.items() if not k.startswith(DIRNAME)
            }
            return
        for rel in set(after) | set(applied):  # each file as it was, or the release's original
            if rel.startswith(DIRNAME):
                continue
            assert after.get(rel) in (applied.get(rel), pristine.get(rel)), rel

    case()
