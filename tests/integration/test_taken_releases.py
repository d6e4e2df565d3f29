"""The taken line on every SGLang release: each applied recipe's anchor is wrapped, the module
still compiles, the inserted helper logs once per process when run, and rollback gives the
release's bytes back."""

from __future__ import annotations

import ast
import hashlib
import io
import json
import logging
import shutil
import subprocess
import sys
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from sm120patch.catalogue.recipes import load_recipes
from sm120patch.planning.taken import HELPER
from tests.conftest import fetch_or_skip
from tools.releases import SGLANG_RELEASES

pytestmark = pytest.mark.releases

CLI = [sys.executable, "-m", "sm120patch"]
BY_ID = {r.id: r for r in load_recipes(package="sglang")}
WITH_TAKEN = {i for i, r in BY_ID.items() if r.taken}


def _sm(*args: object) -> dict:
    r = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)


def _hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".sm120patch" not in p.relative_to(root).parts and "__pycache__" not in p.parts
    }


def _taken_calls(tree: ast.AST) -> list[str]:
    """The recipe ids of every `_sm120patch_taken("<id>", anchor[, logs_if])` call in a module."""
    return [id_ for id_, _ in _taken_args(tree)]


def _taken_args(tree: ast.AST) -> list[tuple[str, str]]:
    """(recipe id, what its third argument says: "true" when absent, "false", "reached" for None)."""
    out = []
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == HELPER):
            continue
        if len(n.args) not in (2, 3) or not isinstance(n.args[0], ast.Constant):
            continue
        third = n.args[2] if len(n.args) == 3 else None
        said = "true" if third is None else {False: "false", None: "reached"}[ast.literal_eval(third)]
        out.append((n.args[0].value, said))
    return out


def _helper_source(text: str) -> str:
    tree = ast.parse(text)
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == HELPER]
    seg = ast.get_source_segment(text, fn)
    assert seg
    return seg


@pytest.mark.parametrize("version", SGLANG_RELEASES)
def test_every_applied_recipe_wraps_its_anchor_and_rollback_restores_the_release(version: str, tmp_path: Path) -> None:
    tree = fetch_or_skip("sglang", version, tmp_path / "tree")
    before = _hashes(tree)
    out = _sm("apply", tree, "--arch", "sm_120", "--probe", "none", "--json")
    applied = {r["id"]: r for r in out["recipes"] if r["status"] == "applied" and r["id"] in WITH_TAKEN}
    assert applied, f"no recipe with [[taken]] applied on {version}"
    for rid, r in applied.items():
        assert "no taken line" not in r["reason"], r["reason"]
        ids: list[str] = []
        for rel in r["files"]:
            text = (tree / rel).read_text(encoding="utf-8")
            compile(text, rel, "exec")
            found = _taken_calls(ast.parse(text))
            wanted = {t.logs_if for t in BY_ID[rid].taken}
            assert all(said in wanted for i, said in _taken_args(ast.parse(text)) if i == rid), (rel, wanted)
            if rid in found:
                assert len([n for n in ast.parse(text).body if getattr(n, "name", "") == HELPER]) == 1, rel
            ids += found
        assert rid in ids, f"{rid} on {version}: no {HELPER}({rid!r}, ...) in {r['files']}"
    # patched code without its journal (a bundle applied with git apply): planned again, nothing more to do
    bare = tmp_path / "bare"
    shutil.copytree(tree, bare, ignore=shutil.ignore_patterns(".sm120patch"))
    again = _sm("plan", bare, "--arch", "sm_120", "--probe", "none", "--json")
    redo = {r["id"]: r["reason"] for r in again["recipes"] if r["status"] not in ("satisfied", "not-applicable")}
    assert not redo, redo
    assert {r["id"] for r in again["recipes"] if r["status"] == "satisfied"} >= set(applied)
    rb = subprocess.run([*CLI, "rollback", str(tree)], capture_output=True, text=True, timeout=600)
    assert rb.returncode == 0, rb.stderr
    assert _hashes(tree) == before


def test_the_inserted_helper_runs_and_logs_once(tmp_path: Path) -> None:
    version = SGLANG_RELEASES[-1]
    tree = fetch_or_skip("sglang", version, tmp_path / "tree")
    out = _sm("apply", tree, "--arch", "sm_120", "--probe", "none", "--json")
    files = [f for r in out["recipes"] if r["status"] == "applied" and r["id"] in WITH_TAKEN for f in r["files"]]
    texts = [(tree / f).read_text(encoding="utf-8") for f in files]
    text = next(t for t in texts if _taken_calls(ast.parse(t)))
    ns: dict[str, object] = {}
    exec(compile(_helper_source(text), "<helper>", "exec"), ns)
    helper = ns[HELPER]

    logger = logging.getLogger("sm120patch")
    records: list[str] = []

    class _H(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler, old_level = _H(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.__dict__.pop("_sm120patch_taken", None)
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            assert helper("sglang-h100", False) is False  # type: ignore[operator]  # the SM12x test fails: nothing
            assert helper("sglang-x-sm120", 41) == 41  # type: ignore[operator]
            assert helper("sglang-x-sm120", True) is True  # type: ignore[operator]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.__dict__.pop("_sm120patch_taken", None)
    assert records == ["sm120patch: sglang-x-sm120 taken"]
    assert err.getvalue() == "sm120patch: sglang-x-sm120 taken\n"
