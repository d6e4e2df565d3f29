"""The `sm120patch` command: help, JSON shapes, exit codes and one-line errors.

Most tests call `sm120patch.cli.main` in-process (the real entry point, with its
error handling); a few run `python -m sm120patch` to see exactly what a shell sees.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

from sm120patch.cli import cli, main
from sm120patch.cli import common as cli_common
from sm120patch.engine import which_flashinfer
from sm120patch.probes import recipe_probe
from tests.unit.sglang_fakes import (
    ALL_IDS,
    ALLREDUCE,
    AUTOTUNE,
    COMMUNICATOR_REL,
    GIT_ENV,
    MODEL_RUNNER_REL,
    MOE,
    SERVER_ARGS_REL,
    git,
    make_clone,
    make_sglang,
    snapshot,
)


@pytest.fixture(autouse=True)
def _fake_shaped_catalogue(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake tree is shaped for these recipes; the rest of the catalogue is tested on real releases."""
    from shutil import copy

    from sm120patch.catalogue.recipes import default_recipe_dir

    root = tmp_path_factory.mktemp("recipes")
    (root / "sglang").mkdir()
    for rid in ALL_IDS:
        copy(default_recipe_dir() / "sglang" / f"{rid}.toml", root / "sglang")
    monkeypatch.setenv("SM120PATCH_RECIPES", str(root))


CORE_COMMANDS = {"recipes", "plan", "apply", "rollback", "status", "clone"}
# plan/apply default to probing FlashInfer and to the GPUs present; unit tests pin both
NO_PROBE = ("--probe", "none", "--arch", "sm_120")


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in GIT_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SM120PATCH_DEBUG", raising=False)
    monkeypatch.delenv("SM120PATCH_RECIPES", raising=False)


class Run:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def sm(capsys: pytest.CaptureFixture[str]):  # noqa: ANN201
    def run(*args: str) -> Run:
        capsys.readouterr()
        with pytest.raises(SystemExit) as ei:
            main([str(a) for a in args])
        out, err = capsys.readouterr()
        code = ei.value.code
        return Run(code if isinstance(code, int) else (0 if code is None else 1), out, err)

    return run


def assert_one_line_error(r: Run, code: int = 2, fragment: str = "") -> None:
    assert r.code == code, (r.code, r.out, r.err)
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r.err
    assert lines[0].startswith("sm120patch: error: "), r.err
    assert "Traceback" not in r.err and fragment in lines[0], r.err


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site-packages"
    make_sglang(root)
    return root


# --- help and catalogue ------------------------------------------------------------------------------------


def test_help_for_every_command(sm) -> None:  # noqa: ANN001
    names = cli.list_commands(click.Context(cli))
    assert set(names) >= CORE_COMMANDS
    top = sm("--help")
    assert top.code == 0 and "Usage: sm120patch" in top.out and "Exit codes" in top.out
    for name in names:
        r = sm(name, "--help")
        assert r.code == 0 and f"Usage: sm120patch {name}" in r.out, name
        assert r.err == ""
    assert sm("-h").code == 0


def test_version(sm) -> None:  # noqa: ANN001
    from sm120patch import __version__

    r = sm("--version")
    assert r.code == 0 and __version__ in r.out


def test_recipes_json_shape(sm) -> None:  # noqa: ANN001
    r = sm("recipes", "--json")
    assert r.code == 0
    data = r.json()
    assert set(data) == {"recipes"}
    assert {x["id"] for x in data["recipes"]} == set(ALL_IDS)
    for x in data["recipes"]:
        assert {
            "id",
            "package",
            "title",
            "why",
            "versions",
            "arch",
            "needs",
            "crash_signatures",
            "advice",
            "edits",
            "path",
            "sha256",
        } <= set(x)
        assert x["package"] == "sglang" and x["arch"] == ["sm_120", "sm_121"] and x["versions"] == ">=0.5.5"
        assert isinstance(x["edits"], list) and x["edits"]


def test_recipes_text(sm) -> None:  # noqa: ANN001
    r = sm("recipes")
    assert r.code == 0
    for rid in ALL_IDS:
        assert rid in r.out
    assert "needs: flashinfer:trtllm_comm" in r.out


def test_bad_recipe_folder_is_exit_2(sm, tmp_path: Path) -> None:  # noqa: ANN001
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "x.toml").write_text("id = 1\n")
    assert_one_line_error(sm("recipes", "--recipes", tmp_path), fragment="x.toml")
    assert_one_line_error(sm("recipes", "--recipes", tmp_path / "nope"), fragment="recipe folder not found")


# --- plan ----------------------------------------------------------------------------------------------------------


def test_plan_json_shape(sm, site: Path) -> None:  # noqa: ANN001
    r = sm("plan", *NO_PROBE, "--json", site)
    assert r.code == 0, r.err
    data = r.json()
    assert set(data) == {"arch", "targets", "recipes", "actions"}  # actions: issue 33's reconciler
    assert data["arch"] == "sm_120"
    # --probe none: nothing proven, nothing to take back; one write per applicable recipe, its files
    assert [(a["kind"], a["recipe"], a["files"]) for a in data["actions"]] == [
        ("write", x["id"], x["files"]) for x in data["recipes"]
    ]
    (t,) = data["targets"]
    assert {"package", "version", "root"} <= set(t)
    assert (t["package"], t["version"], t["root"]) == ("sglang", "0.5.9", str(site.resolve()))
    assert [x["id"] for x in data["recipes"]] == list(ALL_IDS)
    for x in data["recipes"]:
        assert {"id", "package", "status", "reason", "files", "diff"} <= set(x)
        assert x["status"] == "applicable" and x["package"] == "sglang"
        assert x["files"] and all(f"+++ b/{f}" in x["diff"] for f in x["files"])
    assert not (site / ".sm120patch").exists()


def test_plan_text_and_no_diff(sm, site: Path) -> None:  # noqa: ANN001
    r = sm("plan", *NO_PROBE, site)
    assert r.code == 0
    assert "sglang 0.5.9 at" in r.out and "applicable" in r.out and "+++ b/sglang/srt/server_args.py" in r.out
    assert "\x1b[" not in r.out  # not a terminal: no colours
    quiet = sm("plan", *NO_PROBE, "--no-diff", site)
    assert quiet.code == 0 and "+++" not in quiet.out and ALLREDUCE in quiet.out


@pytest.mark.parametrize(("arch", "name"), [("12.1", "sm_121"), ("sm120", "sm_120"), ("sm_90", "sm_90")])
def test_plan_arch_spellings(sm, site: Path, arch: str, name: str) -> None:  # noqa: ANN001
    r = sm("plan", "--probe", "none", "--json", "--arch", arch, site)
    assert r.code == 0 and r.json()["arch"] == name
    statuses = {x["status"] for x in r.json()["recipes"]}
    assert statuses == ({"not-applicable"} if name == "sm_90" else {"applicable"})


def test_plan_failed_recipe_is_exit_1(sm, site: Path) -> None:  # noqa: ANN001
    p = site / SERVER_ARGS_REL
    text = p.read_text()
    start = text.index("    def _handle_moe_kernel_config")
    p.write_text(text[:start] + "    def _handle_moe_kernel_config(self): pass\n")
    r = sm("plan", *NO_PROBE, "--json", site)
    assert r.code == 1
    assert {x["id"]: x["status"] for x in r.json()["recipes"]}[MOE] == "failed"


def test_plan_every_arch_must_be_covered(sm, site: Path) -> None:  # noqa: ANN001
    both = sm("plan", "--probe", "none", "--json", "--arch", "sm_121", "--arch", "sm_120", site).json()
    assert both["arch"] == "sm_120,sm_121" and {x["status"] for x in both["recipes"]} == {"applicable"}
    mixed = sm("plan", "--probe", "none", "--json", "--arch", "sm_90", "--arch", "sm_120", site)
    assert mixed.code == 0
    for x in mixed.json()["recipes"]:
        assert x["status"] == "not-applicable" and "not sm_90" in x["reason"]


@pytest.fixture
def failing_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe that finds no kernels for the allreduce recipe, without looking for a FlashInfer."""
    from sm120patch.probes.recipe_probe import ProbeResult

    def make_probe(archs, fi, level):  # noqa: ANN001, ANN202
        def probe(recipe):  # noqa: ANN001, ANN202
            if recipe.id == ALLREDUCE:
                return ProbeResult(False, "trtllm_comm missing for sm_120", "static", level, [{"result": "fail"}])
            return ProbeResult(True, "kernels proven", "static", level, [])

        return probe

    monkeypatch.setattr(which_flashinfer, "resolve_flashinfer", lambda *a: None)
    monkeypatch.setattr(recipe_probe, "make_probe", make_probe)


@pytest.mark.usefixtures("failing_probe")
def test_blocked_plan_and_blocked_apply_are_exit_1(sm, site: Path) -> None:  # noqa: ANN001
    pristine = snapshot(site)
    r = sm("plan", "--arch", "sm_120", "--probe", "static", "--json", site)
    assert r.code == 1
    by_id = {x["id"]: x for x in r.json()["recipes"]}
    assert by_id[ALLREDUCE]["status"] == "blocked" and "trtllm_comm missing" in by_id[ALLREDUCE]["reason"]
    assert by_id[MOE]["status"] == "applicable"
    assert snapshot(site) == pristine
    r = sm("apply", "--arch", "sm_120", "--probe", "static", "--json", site)
    assert r.code == 1
    by_id = {x["id"]: x for x in r.json()["recipes"]}
    assert by_id[ALLREDUCE]["status"] == "blocked" and by_id[MOE]["status"] == "applied"
    assert snapshot(site)[COMMUNICATOR_REL] == pristine[COMMUNICATOR_REL]


def test_apply_commit_on_a_clone(sm, tmp_path: Path) -> None:  # noqa: ANN001
    root = make_clone(tmp_path / "sglang")
    r = sm("apply", *NO_PROBE, "--arch", "sm_121", "--commit", "--no-diff", root)
    assert r.code == 0, r.err
    assert git(root, "rev-parse", "--abbrev-ref", "HEAD").strip() == "sm120patch/sm_120+sm_121"
    assert len(git(root, "log", "--format=%s", "main..HEAD").splitlines()) == len(ALL_IDS)
    assert git(root, "status", "--porcelain") == ""


# --- exit 2 and one-line errors ---------------------------------------------------------------------------------


def test_bad_path_is_one_line_exit_2(sm, tmp_path: Path) -> None:  # noqa: ANN001
    assert_one_line_error(sm("plan", tmp_path / "nope"), fragment="no such file or folder")
    assert_one_line_error(sm("plan", tmp_path), fragment="holds no")
    f = tmp_path / "f.txt"
    f.write_text("x")
    assert_one_line_error(sm("apply", f), fragment="is a file")
    assert_one_line_error(sm("status", tmp_path / "nope"))
    assert_one_line_error(sm("rollback", tmp_path / "nope"))


def test_usage_errors_are_exit_2(sm, site: Path) -> None:  # noqa: ANN001
    assert_one_line_error(sm("plan", "--arch", "sm_999x", site), fragment="--arch 'sm_999x'")
    assert_one_line_error(sm("plan"), fragment="missing PATH")
    assert_one_line_error(sm("plan", "--installed", site), fragment="not both")
    assert_one_line_error(sm("apply", "--recipe", "no-such-recipe", site), fragment="no such recipe")
    assert not (site / ".sm120patch").exists()
    r = sm("plan", "--frobnicate", site)  # click's own usage error
    assert r.code == 2 and "No such option" in r.err and "Traceback" not in r.err
    assert sm("no-such-command").code == 2


def test_subprocess_bad_path_and_arch(site: Path, tmp_path: Path) -> None:
    for args, fragment in (
        (["plan", str(tmp_path / "nope")], "no such file or folder"),
        (["plan", "--arch", "sm_999x", str(site)], "not an architecture"),
    ):
        r = subprocess.run([sys.executable, "-m", "sm120patch", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("sm120patch: error: ") and fragment in r.stderr


def test_internal_error_is_exit_3_without_traceback(sm, site: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(cli_common, "load_recipes", boom)
    r = sm("plan", *NO_PROBE, site)
    assert r.code == 3 and "internal error: RuntimeError: kaboom" in r.err and "Traceback" not in r.err
    monkeypatch.setenv("SM120PATCH_DEBUG", "1")
    with pytest.raises(RuntimeError, match="kaboom"):
        main(["plan", str(site)])


def test_interrupt_is_130(sm, site: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    def interrupt(*a: object, **k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_common, "load_recipes", interrupt)
    r = sm("plan", *NO_PROBE, site)
    assert r.code == 130 and "interrupted" in r.err


# --- apply / status / rollback --------------------------------------------------------------------------------------


def test_apply_status_rollback_round_trip(sm, site: Path) -> None:  # noqa: ANN001
    pristine = snapshot(site)
    r = sm("apply", *NO_PROBE, "--json", site)
    assert r.code == 0, r.err
    assert {x["id"]: x["status"] for x in r.json()["recipes"]} == dict.fromkeys(ALL_IDS, "applied")
    st = sm("status", "--json", site)
    assert st.code == 0
    (t,) = st.json()["targets"]
    assert [a["id"] for a in t["applied"]] == list(ALL_IDS) and t["interrupted"] == []
    assert all(f["state"] == "as-applied" for f in t["files"])
    assert "applied" in sm("plan", *NO_PROBE, "--no-diff", site).out
    # a file edited after apply: status says so with exit 1, rollback refuses with exit 2
    p = site / SERVER_ARGS_REL
    p.write_bytes(p.read_bytes() + b"# mine\n")
    st = sm("status", site)
    assert st.code == 1 and "changed-since-apply" in st.out
    assert_one_line_error(sm("rollback", site), fragment="--force")
    r = sm("rollback", "--force", "--json", site)
    assert r.code == 0
    (res,) = r.json()["targets"]
    assert res["rolled_back"] == list(ALL_IDS) and len(res["kept_copies"]) == 1
    assert snapshot(site) == pristine
    nothing = sm("rollback", site)
    assert nothing.code == 0 and "nothing to roll back" in nothing.out


def test_rollback_one_recipe_text(sm, site: Path) -> None:  # noqa: ANN001
    assert sm("apply", *NO_PROBE, "--no-diff", site).code == 0
    r = sm("rollback", "--recipe", ALLREDUCE, site)
    assert r.code == 0 and f"rolled back     {ALLREDUCE}" in r.out and "still applied:" in r.out
    assert_one_line_error(sm("rollback", "--recipe", ALLREDUCE, site), fragment="not applied here")


# --- clone ----------------------------------------------------------------------------------------------------


@pytest.fixture
def bare(tmp_path: Path) -> tuple[Path, str]:
    """A bare repository holding an SGLang-shaped commit tagged v0.5.9 and one newer commit."""
    work = make_clone(tmp_path / "work", tag="v0.5.9")
    tagged = git(work, "rev-parse", "HEAD").strip()
    (work / "python" / "sglang" / "version.py").write_text('__version__ = "0.6.0.dev0"\n')
    git(work, "commit", "-q", "-am", "bump")
    bare = tmp_path / "sglang.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    git(work, "push", "-q", str(bare), "main", "--tags")
    git(bare, "symbolic-ref", "HEAD", "refs/heads/main")
    return bare, tagged


def test_clone_url_at_tag(sm, bare: tuple[Path, str], tmp_path: Path) -> None:  # noqa: ANN001
    url, tagged = bare
    dest = tmp_path / "dest"
    r = sm("clone", "--json", f"{url}@v0.5.9", dest)
    assert r.code == 0, r.err
    info = r.json()
    assert info == {"url": str(url), "ref": "v0.5.9", "dest": str(dest), "commit": tagged}
    plan = sm("plan", *NO_PROBE, "--json", "--no-diff", dest).json()
    assert plan["targets"][0]["version"] == "0.5.9" and plan["targets"][0]["git"] is True
    # without a ref: the default branch's newest commit
    r = sm("clone", url, tmp_path / "head")
    assert r.code == 0 and "default branch" in r.out and f"sm120patch plan {tmp_path / 'head'}" in r.out
    assert (tmp_path / "head" / "python" / "sglang" / "version.py").read_text() == '__version__ = "0.6.0.dev0"\n'


def test_clone_errors(sm, bare: tuple[Path, str], tmp_path: Path) -> None:  # noqa: ANN001
    url, _ = bare
    assert_one_line_error(sm("clone", f"{url}@v9.9.9", tmp_path / "a"), fragment="git clone/checkout failed")
    assert_one_line_error(sm("clone", tmp_path / "nothing-here.git", tmp_path / "b"), fragment="check the URL")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    assert_one_line_error(sm("clone", url, full), fragment="not empty")


@pytest.mark.parametrize(
    ("source", "split"),
    [
        ("https://github.com/sgl-project/sglang@v0.5.9", ("https://github.com/sgl-project/sglang", "v0.5.9")),
        ("git@github.com:sgl-project/sglang.git", ("git@github.com:sgl-project/sglang.git", None)),
        ("git@github.com:sgl-project/sglang.git@main", ("git@github.com:sgl-project/sglang.git", "main")),
        ("/srv/repos/sglang.git@abc123", ("/srv/repos/sglang.git", "abc123")),
        ("/srv/repos/sglang.git", ("/srv/repos/sglang.git", None)),
    ],
)
def test_split_ref(source: str, split: tuple[str, str | None]) -> None:
    from sm120patch.gitops import split_ref

    assert split_ref(source) == split


def test_cli_is_a_click_group() -> None:
    assert isinstance(cli, click.Group)


def test_a_release_newer_than_the_tests_is_untested_until_allowed(sm, tmp_path: Path) -> None:  # noqa: ANN001
    root = tmp_path / "site-packages"
    make_sglang(root, version="0.5.24")
    pristine = snapshot(root)
    r = sm("apply", *NO_PROBE, "--json", root)
    assert r.code == 1
    by_id = {x["id"]: x for x in r.json()["recipes"]}
    untested = [i for i, x in by_id.items() if x["status"] == "untested"]
    assert untested and all("--allow-untested" in by_id[i]["reason"] and by_id[i]["diff"] for i in untested)
    assert snapshot(root) == pristine  # said loudly, written nowhere
    r = sm("apply", *NO_PROBE, "--allow-untested", "--json", root)
    assert r.code == 0, r.err
    now = {x["id"]: x["status"] for x in r.json()["recipes"]}
    assert {i: now[i] for i in untested} == dict.fromkeys(untested, "applied")
    assert sm("rollback", root).code == 0 and snapshot(root) == pristine


def test_top_help_imports_no_command_module_and_lists_whole_summaries() -> None:
    """pip's lazy command table: `--help` lists each command from the table, imports none of
    their modules (of sm120patch, only the cli package and errors), and no summary is cut off."""
    code = (
        "import sys; from sm120patch.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('sm120patch')))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "['sm120patch', 'sm120patch.cli', 'sm120patch.errors']"
    listing = r.stdout.split("Commands:")[1]
    assert "..." not in listing and all(name in listing for name in CORE_COMMANDS)


def test_every_command_has_the_tables_summary_as_short_help() -> None:
    """Declared on the command itself (what shell completion and a direct invocation see), not
    patched in by the group when it looks the command up."""
    import importlib

    from sm120patch.cli import COMMANDS

    for name, (where, summary) in COMMANDS.items():
        module, attr = where.split(":")
        command = getattr(importlib.import_module(module), attr)
        assert command.name == name and command.short_help == summary, name
        assert command.get_short_help_str(limit=45) == summary, name
        assert cli.get_command(click.Context(cli), name) is command


def test_commands_return_their_exit_code_and_only_main_exits(site: Path, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """pre-commit's shape: a command returns its code (click hands it back), `run` turns errors into
    one line and a code, and nothing in the package but `main` exits."""
    import ast

    from sm120patch.cli import run

    assert cli.main(["recipes", "--json"], standalone_mode=False) == 0
    assert cli.main(["plan", *NO_PROBE, "--no-diff", str(site)], standalone_mode=False) == 0
    assert run(["plan", *NO_PROBE, str(site)]) == 0
    capsys.readouterr()
    assert run(["plan", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sm120patch: error: ") and err.count("\n") == 1
    exits = []
    package = Path(cli_common.__file__).parents[1]
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            called = ast.unparse(node.func) if isinstance(node, ast.Call) else ""
            raised = ast.unparse(node.exc) if isinstance(node, ast.Raise) and node.exc is not None else ""
            if called in ("sys.exit", "exit", "os._exit", "ctx.exit") or raised.startswith("SystemExit"):
                exits.append(f"{rel}:{node.lineno}")
    # the probe harness is its own program, run in a subprocess
    ours = [e.split(":")[0] for e in exits if not e.startswith("probes/run/checks/harness.py:")]
    assert ours == ["cli/__init__.py"], exits


def test_tree_options_is_one_frozen_object_in_the_order_help_lists() -> None:
    """One decorator builds the shared options; a command's own options sit between the shared
    head (PATH ... --recipes) and tail (--exclude, --ok-blocked, --json), and --probe on the command
    line is told from its default (a bundle's own rung yields only to a given one)."""
    import dataclasses

    from sm120patch.cli.options import TreeOptions, tree_options
    from sm120patch.cli.tree import apply_cmd, plan_cmd

    assert [p.name for p in plan_cmd.params] == [
        "paths", "package", "installed", "arch", "python", "flashinfer", "level", "recipe_dir",
        "allow_untested", "no_diff", "stat", "exclude", "ok_blocked", "as_json",
    ]  # fmt: skip
    assert [p.name for p in apply_cmd.params][-3:] == ["exclude", "ok_blocked", "as_json"]
    seen: list[TreeOptions] = []

    @click.command("t")
    @tree_options("spec", choice=True)
    @click.option("--own", is_flag=True)
    def t(opts: TreeOptions, own: bool) -> int:
        seen.append(opts)
        return 7 if own else 0

    assert t.main(["p1", "--arch", "sm_120", "--exclude", "x", "--own"], standalone_mode=False) == 7
    assert t.main(["--probe", "spec", "--json"], standalone_mode=False) == 0
    first, second = seen
    assert first.paths == (Path("p1"),) and first.arch == ("sm_120",) and first.exclude == ("x",)
    assert (first.level, first.probe_given, second.level, second.probe_given) == ("spec", False, "spec", True)
    assert second.as_json and not first.as_json
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.level = "run"  # type: ignore[misc]


def test_an_unknown_command_is_a_usage_error(sm) -> None:  # noqa: ANN001
    r = sm("aply", "x")
    assert r.code == 2 and "No such command" in r.err


def test_plan_stat_counts_lines_as_git_does(sm, tmp_path: Path) -> None:  # noqa: ANN001
    """`plan --stat`: one line per file, +added -removed; git's own --numstat of the tree that
    `apply` writes is the oracle."""
    pristine, patched = tmp_path / "a", tmp_path / "b"
    make_sglang(pristine)
    make_sglang(patched)
    r = sm("plan", *NO_PROBE, "--stat", pristine)
    assert r.code == 0, r.err
    assert "diff --git" not in r.out and "without --stat" in r.out
    assert sm("apply", *NO_PROBE, patched).code == 0
    numstat = subprocess.run(
        ["git", "diff", "--no-index", "--numstat", str(pristine / "sglang"), str(patched / "sglang")],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    rows = [line.split("\t") for line in numstat.splitlines() if "/.sm120patch/" not in line]
    assert rows
    for added, removed, path in rows:
        rel = path.split(f"{pristine.name}/", 1)[-1].split("=> ")[-1].rstrip("}")
        rel = rel[rel.index("sglang/") + len("sglang/") :]
        assert re.search(rf"{re.escape(rel)}\s+\+{added} -{removed}  \(", r.out), (rel, r.out)


# --- one recipe's failure is that recipe's, never the command's -----------------------------------------------


def test_a_file_that_does_not_parse_fails_only_the_recipe_that_edits_it(sm, site: Path) -> None:  # noqa: ANN001
    broken = site / COMMUNICATOR_REL
    broken.write_text(broken.read_text() + "\n\ndef broken(:\n")
    before = broken.read_bytes()
    r = sm("apply", *NO_PROBE, "--json", site)
    assert r.code == 1, (r.code, r.err)
    by_id = {x["id"]: x for x in r.json()["recipes"]}
    assert by_id[ALLREDUCE]["status"] == "failed"
    reason = by_id[ALLREDUCE]["reason"]
    assert str(broken) in reason and "does not parse" in reason and "line 20" in reason, reason
    assert by_id[AUTOTUNE]["status"] == "applied" and by_id[MOE]["status"] == "applied"
    assert broken.read_bytes() == before


def test_a_transform_that_raises_fails_only_its_recipe(sm, site: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    from sm120patch.transforms import TRANSFORMS

    def boom(self: object, module: object) -> None:
        raise RuntimeError("kaboom in the transform")

    monkeypatch.setattr(TRANSFORMS["add-list-item"], "apply", boom)
    pristine = snapshot(site)
    r = sm("apply", *NO_PROBE, "--json", site)
    assert r.code == 1, (r.code, r.err)
    by_id = {x["id"]: x for x in r.json()["recipes"]}
    assert by_id[AUTOTUNE]["status"] == "failed"
    assert "add-list-item" in by_id[AUTOTUNE]["reason"] and "RuntimeError: kaboom" in by_id[AUTOTUNE]["reason"]
    assert by_id[ALLREDUCE]["status"] == "applied" and by_id[MOE]["status"] == "applied"
    assert snapshot(site)[MODEL_RUNNER_REL] == pristine[MODEL_RUNNER_REL]
    monkeypatch.setenv("SM120PATCH_DEBUG", "1")  # a developer still gets the traceback
    with pytest.raises(RuntimeError, match="kaboom"):
        main(["plan", *NO_PROBE, str(site)])


@pytest.mark.parametrize("arch", ["sm_999", "sm_129", "13.7", "sm_12"])
def test_an_arch_no_gpu_has_is_exit_2_naming_the_known_ones(sm, site: Path, arch: str) -> None:  # noqa: ANN001
    for cmd in ("plan", "apply", "status"):
        r = sm(cmd, "--probe", "none", "--arch", arch, site) if cmd != "status" else sm(cmd, "--arch", arch, site)
        assert_one_line_error(r, fragment=f"--arch {arch!r}")
        assert "sm_120, sm_121" in r.err, r.err
    assert not (site / ".sm120patch").exists()


def test_a_real_arch_no_recipe_is_for_is_not_a_usage_error(sm, site: Path) -> None:  # noqa: ANN001
    r = sm("plan", "--probe", "none", "--json", "--arch", "sm_86", site)  # an RTX 3090: real, nothing to open
    assert r.code == 0 and {x["status"] for x in r.json()["recipes"]} == {"not-applicable"}


def test_a_file_where_the_state_folder_should_be_is_named_with_the_fix(sm, site: Path) -> None:  # noqa: ANN001
    state = site / ".sm120patch"
    state.write_text("not a folder\n")
    pristine = snapshot(site)
    for args in (("apply", *NO_PROBE), ("status",), ("rollback",), ("plan", *NO_PROBE)):
        r = sm(*args, site)
        assert_one_line_error(r, fragment=str(state))
        assert "is a file" in r.err and "remove it" in r.err, r.err
    assert snapshot(site) == pristine and state.read_text() == "not a folder\n"


@pytest.mark.usefixtures("failing_probe")
def test_apply_prints_what_it_wrote_not_the_diff_of_a_blocked_recipe(sm, site: Path) -> None:  # noqa: ANN001
    r = sm("apply", "--arch", "sm_120", "--probe", "static", site)
    assert r.code == 1
    lines = r.out.splitlines()
    assert not any(x.startswith(("+++", "---", "@@")) for x in lines), r.out  # no diff by default
    assert COMMUNICATOR_REL not in r.out  # the blocked recipe's file: never written, never shown
    assert "wrote 2 file(s):" in lines, r.out
    (runner,) = [x for x in lines if x.strip().startswith(MODEL_RUNNER_REL)]
    assert re.search(r"\+\d+ -\d+\s+\(" + AUTOTUNE + r"\)$", runner), runner
    (args,) = [x for x in lines if x.strip().startswith(SERVER_ARGS_REL)]
    assert args.endswith(f"({MOE})"), args  # the blocked allreduce recipe's edit of it is not there
    sm("rollback", site)
    shown = sm("apply", "--arch", "sm_120", "--probe", "static", "--diff", site)
    assert f"+++ b/{SERVER_ARGS_REL}" in shown.out and f"+++ b/{MODEL_RUNNER_REL}" in shown.out
    assert COMMUNICATOR_REL not in shown.out
    sm("rollback", site)
    assert sm("apply", "--arch", "sm_120", "--probe", "static", "--no-diff", site).out == r.out  # still accepted
