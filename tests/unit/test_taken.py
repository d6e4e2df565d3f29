"""The taken line: `[[taken]]` in recipes, the helper the planner inserts, and the one parser."""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import logging
import sys
from collections.abc import Iterator
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from sm120patch.arch import parse_arch
from sm120patch.catalogue.recipes import load_recipe, load_recipes
from sm120patch.engine import tree as engine
from sm120patch.errors import RecipeError
from sm120patch.planning.plan import APPLICABLE
from sm120patch.planning.taken import HELPER, HELPER_CODE
from sm120patch.planning.targets import discover
from sm120patch.taken_line import taken_before, taken_id, taken_ids, taken_in_text, taken_positions
from tests.unit.sglang_fakes import ALLREDUCE, COMMUNICATOR_REL, make_sglang, snapshot
from tests.unit.test_recipes import GOOD

# --- the parser -------------------------------------------------------------------------------


def test_a_bare_line_and_a_logger_prefixed_line_are_taken() -> None:
    assert taken_id("sm120patch: sglang-moe-backend-sm120 taken") == "sglang-moe-backend-sm120"
    assert taken_id("[2026-12-02 10:00:01 TP0] sm120patch: sglang-gdn-prefill-sm120 taken\n") == (
        "sglang-gdn-prefill-sm120"
    )
    assert taken_id("INFO:sm120patch:sm120patch: sglang-fp4-gemm-b12x-sm120 taken") == "sglang-fp4-gemm-b12x-sm120"


@pytest.mark.parametrize(
    "line",
    [
        "sm120patch: sglang-moe-backend-sm120 applied",  # another verb
        "sm120patch: sglang-moe-backend-sm120 taken back after the crash",  # not the end of the line
        "xsm120patch: sglang-moe-backend-sm120 taken",  # another prefix glued on
        "mysm120patch: r taken",
        "sm120patch:  sglang-moe-backend-sm120 taken",  # two spaces: not our format
        "sm120patch: Sglang-Moe taken",  # ids are lowercase
        "verify: sm120patch: taken",  # no id
        "",
    ],
)
def test_noise_and_other_prefixes_are_not_taken(line: str) -> None:
    assert taken_id(line) is None


def test_each_id_once_in_the_order_first_taken() -> None:
    log = [
        "[TP0] sm120patch: b-recipe taken",
        "sm120patch: b-recipe taken",  # the same process's stderr copy
        "loading weights",
        "[TP1] sm120patch: b-recipe taken",  # another process of the same server
        "[TP0] sm120patch: a-recipe taken",
    ]
    assert taken_ids(log) == ["b-recipe", "a-recipe"]
    assert taken_in_text("\n".join(log)) == ["b-recipe", "a-recipe"]
    assert taken_positions(log) == [(0, "b-recipe"), (1, "b-recipe"), (3, "b-recipe"), (4, "a-recipe")]
    assert taken_before(log, 4) == ["b-recipe"]
    assert taken_before(log, 0) == []


# --- the recipe data ---------------------------------------------------------------------------

TAKEN = """
[[taken]]
functions = ["f"]
anchor = "_is_sm120_supported"
when = "the check reaches SM12x"
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "sglang" / "r.toml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_a_taken_table_loads(tmp_path: Path) -> None:
    (t,) = load_recipe(_write(tmp_path, GOOD + TAKEN + 'near = "allreduce"\n')).taken
    assert (t.functions, t.anchor, t.near, t.when) == (
        ("f",),
        "_is_sm120_supported",
        "allreduce",
        "the check reaches SM12x",
    )


@pytest.mark.parametrize(
    "extra, key",
    [
        (TAKEN + 'color = "red"\n', "taken[0].color: unknown key"),
        (TAKEN.replace('anchor = "_is_sm120_supported"', 'anchor = "if x:"'), "taken[0].anchor"),
        (TAKEN.replace('when = "the check reaches SM12x"', ""), "taken[0].when: missing"),
        (TAKEN.replace('functions = ["f"]', "functions = []"), "taken[0].functions: is empty"),
        (TAKEN.replace('functions = ["f"]', 'functions = "f"'), "taken[0].functions: is a str"),
    ],
)
def test_a_bad_taken_table_is_one_line_naming_the_file(tmp_path: Path, extra: str, key: str) -> None:
    path = _write(tmp_path, GOOD + extra)
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    assert str(e.value).startswith(f"{path}: {key}")
    assert "\n" not in str(e.value)


def test_every_sglang_recipe_says_where_its_gate_is_taken() -> None:
    assert all(r.taken for r in load_recipes(package="sglang"))


# --- the helper, for real ------------------------------------------------------------------------


@contextlib.contextmanager
def _taken_log() -> Iterator[tuple[list[str], io.StringIO]]:
    """The sm120patch logger's messages at INFO and stderr, with the helper's seen-set fresh before
    and after (it lives on the logger, so a test would otherwise see an earlier one's ids)."""
    records: list[str] = []

    class _H(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger, h, err = logging.getLogger("sm120patch"), _H(level=logging.INFO), io.StringIO()
    old_level = logger.level
    logger.addHandler(h)
    logger.setLevel(logging.INFO)
    _fresh_seen()
    try:
        with redirect_stderr(err):
            yield records, err
    finally:
        logger.removeHandler(h)
        logger.setLevel(old_level)
        _fresh_seen()


def _fresh_seen() -> None:
    logging.getLogger("sm120patch").__dict__.pop("_sm120patch_taken", None)


def test_the_helper_logs_once_over_two_calls_and_returns_its_argument() -> None:
    ns: dict[str, object] = {}
    exec(compile(HELPER_CODE, "<helper>", "exec"), ns)
    helper = ns[HELPER]
    sentinel = object()
    with _taken_log() as (records, err):
        assert helper("r-one", sentinel) is sentinel  # type: ignore[operator]
        assert helper("r-one", 1) == 1  # type: ignore[operator]
        assert helper("r-two", None, None) is None  # type: ignore[operator]
    assert records == ["sm120patch: r-one taken", "sm120patch: r-two taken"]
    assert err.getvalue() == "sm120patch: r-one taken\nsm120patch: r-two taken\n"


@pytest.mark.parametrize(
    ("calls", "logged"),
    [
        ([(False, True)], []),  # an H100 evaluates the SM12x test and gets False: nothing taken
        ([(False, True), (True, True)], ["r"]),  # the first true value logs
        ([(True, False)], []),  # logs_if = "false": an SM100 passing the SM100 test takes nothing of ours
        ([(0, False)], ["r"]),
        ([((9, 0), None)], ["r"]),  # logs_if = "reached": any value
        ([(None, None)], ["r"]),
    ],
)
def test_the_helper_logs_only_for_the_value_that_takes_the_gate(calls: list, logged: list[str]) -> None:
    ns: dict[str, object] = {}
    exec(compile(HELPER_CODE, "<helper>", "exec"), ns)
    with _taken_log() as (records, _):
        for value, logs_if in calls:
            assert ns[HELPER]("r", value, logs_if) == value  # type: ignore[operator]
    assert records == [f"sm120patch: {i} taken" for i in logged]


def test_logs_if_loads_and_a_bad_value_is_refused(tmp_path: Path) -> None:
    (t,) = load_recipe(_write(tmp_path, GOOD + TAKEN + 'logs_if = "false"\n')).taken
    assert t.logs_if == "false"
    (t,) = load_recipe(_write(tmp_path, GOOD + TAKEN)).taken
    assert t.logs_if == "true"
    path = _write(tmp_path, GOOD + TAKEN + 'logs_if = "sometimes"\n')
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    assert str(e.value).startswith(f"{path}: taken[0].logs_if") and "true, false, reached" in str(e.value)


def test_an_anchor_that_breaks_its_line_outside_brackets_is_refused_not_silently_lost(tmp_path: Path) -> None:
    # libcst parses the anchor as written: a multi-line anchor without parentheses was found nowhere
    # and cost the taken line without a word (the GPT-OSS recipe's first try at a whole-arm anchor)
    bad = TAKEN.replace('anchor = "_is_sm120_supported"', 'anchor = """_is_sm120_supported\n    and ok"""')
    path = _write(tmp_path, GOOD + bad)
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    assert str(e.value).startswith(f"{path}: taken[0].anchor") and "one line" in str(e.value)
    inside = TAKEN.replace('anchor = "_is_sm120_supported"', 'anchor = """f(a,\n  b)"""')
    (t,) = load_recipe(_write(tmp_path, GOOD + inside)).taken
    assert t.anchor == "f(a,\n  b)"


def test_the_helper_never_raises() -> None:
    ns: dict[str, object] = {}
    exec(compile(HELPER_CODE, "<helper>", "exec"), ns)

    class _Broken(io.StringIO):
        def write(self, s: str) -> int:
            raise OSError("stderr closed")

    _fresh_seen()
    try:
        with redirect_stderr(_Broken()):
            assert ns[HELPER]("r-three", 7) == 7  # type: ignore[operator]
    finally:
        _fresh_seen()


def test_a_patched_fake_module_logs_its_taken_line_once_and_rollback_restores_it(tmp_path: Path) -> None:
    pkg = make_sglang(tmp_path)
    before = snapshot(tmp_path)
    (target,) = discover(tmp_path)
    recipes = [r for r in load_recipes() if r.id == ALLREDUCE]
    (p,) = engine.make_plan(target, recipes, parse_arch("sm_120"))
    assert p.status == APPLICABLE and "no taken line" not in p.reason
    engine.apply(target, recipes, parse_arch("sm_120"))
    text = (tmp_path / COMMUNICATOR_REL).read_text()
    calls = [
        n
        for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == HELPER and ast.literal_eval(n.args[0]) == ALLREDUCE
    ]
    assert len(calls) == 1

    sys.path.insert(0, str(tmp_path))
    try:
        for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
            del sys.modules[name]
        with _taken_log() as (records, err):
            mod = importlib.import_module("sglang.srt.layers.communicator")
            assert mod.apply_flashinfer_allreduce_fusion(8) is True  # the fake utils say SM12x
            assert mod.apply_flashinfer_allreduce_fusion(8) is True
            assert mod.apply_flashinfer_allreduce_fusion(0) is False
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
            del sys.modules[name]
    assert records == [f"sm120patch: {ALLREDUCE} taken"]
    assert err.getvalue() == f"sm120patch: {ALLREDUCE} taken\n"

    engine.rollback(target, recipes)
    assert snapshot(tmp_path) == before
    assert pkg.is_dir()


# --- diagnose and guard -------------------------------------------------------------------------

CRASH_LOG = [
    "[2026-12-02 10:00:00] server_args=ServerArgs(model_path='glm')",
    "[2026-12-02 10:00:01 TP0] sm120patch: sglang-moe-backend-sm120 taken",
    "sm120patch: sglang-moe-backend-sm120 taken",
    "[2026-12-02 10:00:05 TP0] Load weight end.",
    "[2026-12-02 10:00:09 TP0] sm120patch: sglang-allreduce-fusion-sm120 taken",
    "Traceback (most recent call last):",
    '  File "/x/communicator.py", line 10, in apply_flashinfer_allreduce_fusion',
    "RuntimeError: No supported CUDA architectures found for major versions [9, 10].",
    "[2026-12-02 10:00:12 TP1] sm120patch: sglang-gdn-prefill-sm120 taken",  # after the crash
]


def test_diagnose_names_the_gates_taken_before_the_crash() -> None:
    from sm120patch.triage.diagnose import diagnose

    recipes = load_recipes(package="sglang")
    d = diagnose(CRASH_LOG, recipes, {ALLREDUCE, "sglang-moe-backend-sm120"})
    data = d.to_dict()
    assert data["taken_before_crash"] == ["sglang-moe-backend-sm120", ALLREDUCE]
    assert data["taken"] == ["sglang-moe-backend-sm120", ALLREDUCE, "sglang-gdn-prefill-sm120"]
    assert d.last_taken_before_crash == (5, ALLREDUCE)
    assert f"taken:   {ALLREDUCE} was the last gate taken before the crash" in d.render()
    assert d.implicated_recipes == [ALLREDUCE]  # the taken lines change no finding


def test_diagnose_without_a_crash_has_taken_lines_but_none_before_a_crash() -> None:
    from sm120patch.triage.diagnose import diagnose

    d = diagnose(CRASH_LOG[:5], load_recipes(package="sglang"), set())
    assert d.to_dict()["taken"] == ["sglang-moe-backend-sm120", ALLREDUCE]
    assert d.to_dict()["taken_before_crash"] == [] and d.last_taken_before_crash is None
    assert "last gate taken" not in d.render()


def test_guard_names_the_last_gate_taken_when_it_rolls_back(tmp_path: Path) -> None:
    from sm120patch.triage.guard import GuardLog, GuardOptions, run_guard

    script = tmp_path / "server.py"
    script.write_text("import sys\n" + "".join(f"print({line!r})\n" for line in CRASH_LOG[:8]) + "sys.exit(1)\n")
    calls: list[list[str]] = []
    err = io.StringIO()
    log = GuardLog(stream=err, path=tmp_path / "guard.log")
    try:
        code = run_guard(
            GuardOptions(command=[sys.executable, "-u", str(script)], target=tmp_path, timeout=20.0, grace=1.0),
            recipes=load_recipes(package="sglang"),
            rollback=lambda t, ids: calls.append(list(ids)) or list(ids),
            applied=lambda p: {ALLREDUCE},
            out=io.StringIO(),
            log=log,
        )
    finally:
        log.close()
    assert code == 1 and calls == [[ALLREDUCE]]
    assert f"the last gate taken before the crash: {ALLREDUCE} (its taken line 5, the crash line" in err.getvalue()
