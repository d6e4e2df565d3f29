"""The wheel a user installs: built without a warning, carrying every recipe and catalogue."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO, unavailable


@pytest.mark.network  # pip builds the wheel in an isolated env: setuptools from the index
def test_wheel_builds_without_warnings_and_carries_every_data_file(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-w", str(tmp_path), "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if r.returncode != 0 and "Could not find a version that satisfies" in r.stderr:
        unavailable(f"no build backend from PyPI: {r.stderr.strip()[-300:]}")
    assert r.returncode == 0, r.stderr[-2000:]
    noise = [ln for ln in (r.stdout + r.stderr).splitlines() if "warning" in ln.lower() or "deprecat" in ln.lower()]
    assert not noise, "\n".join(noise)
    (wheel,) = tmp_path.glob("sm120patch-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = [p for p in (REPO / "patches").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert data
    missing = [p for p in data if f"sm120patch/patches/{p.relative_to(REPO / 'patches').as_posix()}" not in names]
    assert not missing, f"not in the wheel: {missing}; list their folders in pyproject's packages/package-data"
    assert "sm120patch/verify/prompts.toml" in names, "verify's prompt set is package data: see pyproject"
