"""Shared test plumbing: real releases from PyPI, fetched once into a cache outside the repo.

In CI (CI=true) a release that cannot be downloaded fails the test; locally it skips.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# every test run checks the planner's splice shortcut against a full regeneration
os.environ.setdefault("SM120PATCH_CHECK_SPLICE", "1")

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools import releases  # noqa: E402


def fetch_or_skip(package: str, version: str, dest: Path, layout: str = "wheel") -> Path:
    """A private copy of a real release; skip locally when offline, fail in CI."""
    try:
        return releases.copy_tree(package, version, dest, layout)
    except RuntimeError as e:
        if os.environ.get("CI"):
            pytest.fail(f"{package} {version}: {e}")
        pytest.skip(f"{package} {version} not downloadable here: {e}")


def pristine_or_skip(package: str, version: str) -> Path:
    try:
        return releases.pristine(package, version)
    except RuntimeError as e:
        if os.environ.get("CI"):
            pytest.fail(f"{package} {version}: {e}")
        pytest.skip(f"{package} {version} not downloadable here: {e}")
