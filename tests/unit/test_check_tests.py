"""tools/check_tests.py: each rule on a small snippet of the defect it names, and on its fix."""

from __future__ import annotations

import ast
import textwrap

import pytest

from tools import check_tests

TOOLS = ("git", "patch", "setpriv")


def rules(src: str, rel: str = "tests/unit/test_x.py") -> list[tuple[str, str]]:
    """(test, rule) of every finding in the snippet."""
    tree = ast.parse(textwrap.dedent(src))
    return [(test, rule) for _line, test, rule, _text in check_tests.check_tree(rel, tree, TOOLS)]


def test_a_test_without_a_check_is_found() -> None:
    src = """
        def test_runs(tmp_path):
            make_tree(tmp_path)
            subprocess.run(["sm120patch", "plan", str(tmp_path)])
    """
    assert rules(src) == [("test_runs", "no-check")]


@pytest.mark.parametrize(
    "body",
    [
        "assert plan() == []",
        "with pytest.raises(UserError):\n        plan()",
        "pytest.fail('no')",
        "assert_clean_failure(run())",
        "check_edit_bindings(root, [])",
        "m.assert_called_once()",
        "refused(run())",  # a helper of the same file that asserts
        "outer()",  # ... or that calls one that does
    ],
)
def test_an_assert_a_raises_or_a_checking_helper_counts(body: str) -> None:
    src = f"""
def refused(r):
    assert r.returncode == 2

def outer():
    refused(1)

def test_it():
    {body}
"""
    assert rules(src) == []


def test_a_helper_that_checks_nothing_does_not_count() -> None:
    src = """
        def run_it(x):
            return x + 1

        def test_it():
            run_it(1)
    """
    assert rules(src) == [("test_it", "no-check")]


@pytest.mark.parametrize(
    "line", ["assert True", "assert 'ok'", "assert x == x", "assert f(a) == f(a)", "assert t.id is t.id"]
)
def test_a_tautology_is_found(line: str) -> None:
    assert rules(f"def test_it(x, f, a, t):\n    {line}\n") == [("test_it", "tautology")]


@pytest.mark.parametrize("line", ["assert f(a) == f(b)", "assert x == 1", "assert not False is True or x"])
def test_a_comparison_of_two_things_is_no_tautology(line: str) -> None:
    assert ("test_it", "tautology") not in rules(f"def test_it(x, f, a, b):\n    {line}\n")


@pytest.mark.parametrize(
    "src",
    [
        'def test_it():\n    if shutil.which("patch"):\n        run_patch()\n    assert ok()\n',
        'def test_it():\n    requires(shutil.which("git") is not None, "no git")\n    assert ok()\n',
        'skip = pytest.mark.skipif(not shutil.which("setpriv"), reason="x")\n',
    ],
)
def test_a_skip_on_a_tool_ci_promises_is_found(src: str) -> None:
    assert [r for _, r in rules(src)] == ["ci-tool"]


def test_a_tool_ci_does_not_promise_may_skip_and_conftest_may_look() -> None:
    src = 'def test_it():\n    requires(shutil.which("nvcc") is not None, "no nvcc")\n    assert ok()\n'
    assert rules(src) == []
    assert rules('def needs_tool(n):\n    return shutil.which("git")\n', rel="tests/conftest.py") == []


def test_an_expectation_read_from_a_generated_file_is_found() -> None:
    src = """
        def test_statuses():
            '''Statuses as docs/compatibility.md shows them (a docstring naming it is fine).'''
            table = (REPO / "docs" / "compatibility.md").read_text()
            assert plan() == parse(table)
    """
    assert rules(src) == [("test_statuses", "generated")]


def test_the_old_rules_still_hold() -> None:
    src = """
        def test_it():
            pytest.importorskip("sm120patch")
            t = time.perf_counter()
            assert time.perf_counter() - t < 1.0
            assert os.environ.get("CI")
    """
    assert sorted(r for _, r in rules(src)) == ["importorskip", "reads-ci", "timed"]


def test_ci_tools_is_read_from_the_conftest() -> None:
    from tests.conftest import CI_TOOLS

    assert check_tests.ci_tools() == CI_TOOLS and "patch" in CI_TOOLS


def test_the_repo_s_tests_pass_the_checker(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_tests.main() == 0, capsys.readouterr().out
