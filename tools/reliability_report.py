"""Render docs/reliability.md from the figures the reliability suite wrote on its last run.

    python -m pytest tests/reliability        # writes $SM120PATCH_CACHE/reliability-figures.json
    python tools/reliability_report.py        # -> docs/reliability.md

The promises and how each is tested are written here; every number comes from the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools import docstamp  # noqa: E402
from tools.releases import cache_dir  # noqa: E402

PROMISES = [
    (
        "pip may change the site under the journal",
        "On a real venv (`python -m venv` + `pip install --no-deps sglang==0.5.9 flashinfer-python==0.6.3`, one "
        "site-packages): apply, then `pip install --force-reinstall` of either package, a downgrade of SGLang "
        "to 0.5.8 and an upgrade of FlashInfer to 0.6.17, then status/apply/rollback. Checked on bytes against "
        "the wheels: no file of another release is ever written into a package (not by `rollback --force`); "
        "a file back at the release's bytes is `replaced-by-pip` (retired, no `--force`); a changed version "
        "is `other-release` (retired, planned afresh); rolling back the FlashInfer backport takes the SGLang "
        "gate standing on it first, in one site-packages too, and guard's rollback does the same; exit 2 "
        "(a write refused after FlashInfer's files were written) and Ctrl-C leave the site byte-identical; "
        "`--commit` without a git identity writes nothing; a reader who may not write can plan; nothing "
        "exits 3.",
        "tests/integration/test_lifecycle_releases.py",
    ),
    (
        "A kill never costs a byte",
        "`apply` and `rollback` are SIGKILLed at every write step (`SM120PATCH_FAULT=kill:N`: before the temp "
        "file, before the rename, after it, before each removal in the journal folder) on real SGLang wheels, "
        "and at random moments from outside. Then `status` must answer, and `rollback` must leave every file "
        "byte-identical to the release (sha256 and mode; no temp files, no journal folder). Every fifth kill "
        "first runs `apply` again and checks the fully patched state, then rolls back. Some rollback kills "
        "are followed by a second kill during the recovery.",
        "tests/reliability/test_kills.py",
    ),
    (
        "The journal survives a kill while it is written",
        "journal.json is only ever replaced by rename; the kill points above include both sides of each "
        "journal rename, and every later command must read it (no `damaged journal` error).",
        "tests/reliability/test_kills.py",
    ),
    (
        "Two runs never interleave",
        "Two `apply` runs started together on one release: without `--wait` one refuses with exit 2 and says "
        "`--wait`; with `--wait` both succeed and the journal still records everything; `apply` and `rollback` "
        "together end wholly patched or wholly original.",
        "tests/reliability/test_concurrency.py",
    ),
    (
        "Your edits are never silently overwritten",
        "A file edited (or deleted) after apply makes `rollback` and a second `apply` refuse (exit 2, naming "
        "the file and `--force`); `--force` goes ahead and keeps your version in `.sm120patch/saved/`.",
        "tests/reliability/test_user_edits.py",
    ),
    (
        "Bad input ends in one line, exit 2, nothing written",
        "Malformed, truncated, mistyped recipes; unknown transforms; bad specifiers; hints with `..` or "
        "absolute paths; targets that are files, empty, missing, unparsable or not UTF-8; corrupt journals, "
        "missing or corrupt blobs, journals naming paths outside the tree; symlinks out of the tree (never "
        "written through); a `.sm120patch` that is a symlink; read-only folders and trees (run as `nobody` "
        "via setpriv when the suite runs as root); a file changed between plan and write. Each: "
        "`sm120patch: error: <file>: <problem>; <fix>`, exit 2, no traceback, every file's hash unchanged.",
        "tests/reliability/test_hostile.py",
    ),
    (
        "Fuzzed recipes and journals never crash it",
        "Hypothesis mutates the catalogue's recipes (truncation, byte flips, splices, wrong types, unknown "
        "keys) through `sm120patch recipes`/`plan`, and a journal (with a pending transaction) through "
        "`rollback`/`status`. Exit 0/1/2 only, never a traceback or exit 3; a plan writes nothing; a rollback "
        "only ever restores recorded bytes, never outside the tree.",
        "tests/reliability/test_fuzz.py",
    ),
    (
        "Recipes are data",
        "Python in a recipe's strings and `.py` files in the recipe folder: an audit hook sees no import from "
        "the folder, no execution of code from it or the tree, only read-mode opens of `.toml`/`.diff` files, "
        "and the marker file the code would create never appears.",
        "tests/reliability/test_recipes_are_data.py",
    ),
]


def figures_path() -> Path:
    env = os.environ.get("SM120PATCH_RELIABILITY_FIGURES")
    return Path(env) if env else cache_dir() / "reliability-figures.json"


def render(data: dict) -> str:
    f = data["figures"]
    g = f.get
    kills = sum(
        g(k, 0)
        for k in (
            "kill_points_apply",
            "kill_points_rollback",
            "kill_points_recovery",
            "random_kills_apply",
            "random_kills_rollback",
        )
    )
    fuzzed = g("fuzz_recipes", 0) + g("fuzz_journals", 0)
    lines = [
        "# Reliability: no byte of your tree lost",
        "",
        # the figures come from the suite's last run (outside the repo), so no input digest: the
        # line says which command and commit wrote the page
        docstamp.stamp(docstamp.command_line() + " (after `python -m pytest tests/reliability`; do not edit)"),
        "",
        "sm120patch changes files in other people's source trees, so it promises that no run, however it "
        "ends, loses a byte of them. How the promise is kept is in `sm120patch/engine/journal.py`'s docstring "
        "(undo data and a `pending` transaction on disk before the first write, every write a rename, "
        "recovery on the next `apply`/`rollback`, one lock per tree, the journal re-read once the lock is held).",
        "",
        "## Last run",
        "",
        f"Generated {data['generated']} on Python {data['python']} (pytest exit status {data['exit_status']}).",
        "",
        "| figure | value |",
        "| --- | ---: |",
        f"| kills tried (SIGKILL) | {kills} |",
        f"| &nbsp;&nbsp;at every write step of apply | {g('kill_points_apply', 0)} |",
        f"| &nbsp;&nbsp;at every write step of rollback | {g('kill_points_rollback', 0)} |",
        f"| &nbsp;&nbsp;during the recovery after a kill | {g('kill_points_recovery', 0)} |",
        f"| &nbsp;&nbsp;at random moments (apply / rollback) | {g('random_kills_apply', 0)} / "
        f"{g('random_kills_rollback', 0)} |",
        f"| trees checked byte for byte after a kill | {g('trees_checked', 0)} |",
        f"| cases fuzzed (recipes + journals) | {fuzzed} ({g('fuzz_recipes', 0)} + {g('fuzz_journals', 0)}) |",
        f"| hostile-input cases | {g('hostile_cases', 0)} |",
        f"| user-edit cases / concurrent runs | {g('user_edit_cases', 0)} / {g('concurrent_runs', 0)} |",
        f"| **bytes lost** | **{g('bytes_lost', 0)}** (trees differing: {g('trees_differing', 0)}) |",
        f"| **tracebacks** | **{g('tracebacks', 0)}** |",
        f"| tests passed / failed / xfailed | {g('tests_passed', 0)} / {g('tests_failed', 0)} / "
        f"{g('tests_xfailed', 0)} |",
        "",
        "## What is promised, and how each promise is tested",
        "",
    ]
    for title, how, where in PROMISES:
        lines += [f"### {title}", "", how, "", f"Test: `{where}`.", ""]
    lines += [
        "## Known gaps",
        "",
        "- An error message quotes input verbatim: a recipe key holding a newline or form feed splits the "
        "one-line error (`test_control_characters_from_input_stay_on_one_line`, xfail until `cli.main` "
        f"escapes non-printables; seen {g('errors_split_by_control_chars', 0)} times in the fuzz run).",
        "- Kills are process kills, not power cuts: files and folders are fsynced, but the suite cannot pull "
        "the plug on the disk.",
        "",
        "## Reproduce",
        "",
        "```",
        "make reliability    # pytest tests/reliability, then tools/reliability_report.py",
        "```",
        "",
        "The suite needs the SGLang 0.5.5, 0.5.9 and 0.5.23 wheels (downloaded once from PyPI into "
        "`$SM120PATCH_CACHE`); it writes its figures to `$SM120PATCH_RELIABILITY_FIGURES` "
        "(default `$SM120PATCH_CACHE/reliability-figures.json`).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--figures", type=Path, default=None, help="figures JSON (default: where the suite wrote it)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "reliability.md")
    a = ap.parse_args()
    src = a.figures or figures_path()
    if not src.is_file():
        sys.exit(f"{src}: no figures; run `python -m pytest tests/reliability` first")
    a.out.write_text(render(json.loads(src.read_text())))
    print(a.out)


if __name__ == "__main__":
    main()
