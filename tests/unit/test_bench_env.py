"""The benchmarks time what a user runs: none of the switches with which sm120patch checks
itself reaches a timed process, even though the benchmarks import test helpers.

Found on 2026-12-03: `benchmarks/probe_costs.py` imports `tests.integration.fi_releases`, whose
import of tests/conftest.py set SM120PATCH_CHECK_SPLICE=1 for the whole `make bench`, so every
timed `plan` also regenerated each spliced module in full (2.4x floor A where a user's plan
ran at 1.4-1.7x).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.measure import SELF_CHECKS, env_with

REPO = Path(__file__).resolve().parents[2]


def test_importing_the_benchmarks_sets_no_self_check() -> None:
    env = {k: v for k, v in os.environ.items() if k not in SELF_CHECKS}
    code = (
        "import os, sys; sys.path.insert(0, '.'); import benchmarks.bench, benchmarks.probe_costs; "
        f"print(sorted(k for k in {list(SELF_CHECKS)!r} if k in os.environ))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_a_timed_process_gets_none_of_them(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    for k in SELF_CHECKS:
        monkeypatch.setenv(k, "1")
    env = env_with(tmp_path)
    assert not set(SELF_CHECKS) & set(env)
    assert env["XDG_CACHE_HOME"] == str(tmp_path) and env["NO_COLOR"] == "1"
