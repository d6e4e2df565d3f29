"""Shared test plumbing: real releases from PyPI, fetched once into a cache outside the repo,
and the one rule for what may skip.

The rule (`unavailable`): in CI (`CI` set to 1/true/yes) a test that cannot get what it needs
fails; elsewhere it skips with the reason. Only hardware a CI box never has (a GPU, an nvcc
that builds for SM12x) is a plain skip, and that goes through `requires`, which says why.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

import pytest

# every test run checks the planner's splice shortcut against a full regeneration
os.environ.setdefault("SM120PATCH_CHECK_SPLICE", "1")

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools import releases  # noqa: E402


def in_ci() -> bool:
    """True when CI says so (`CI=true`, `1` or `yes`); `CI=false` or unset is a developer's box."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def unavailable(why: str) -> NoReturn:
    """Something a test needs and that CI always has (a download, a venv) is missing."""
    if in_ci():
        pytest.fail(why)
    pytest.skip(why)


def requires(ok: bool, why: str) -> None:
    """Skip, with the reason, when hardware or a toolchain CI may lack is not here (a GPU, nvcc)."""
    if not ok:
        pytest.skip(why)


def fetch_or_skip(package: str, version: str, dest: Path, layout: str = "wheel") -> Path:
    """A private copy of a real release."""
    try:
        return releases.copy_tree(package, version, dest, layout)
    except RuntimeError as e:
        unavailable(f"{package} {version}: {e}")


def pristine_or_skip(package: str, version: str) -> Path:
    try:
        return releases.pristine(package, version)
    except RuntimeError as e:
        unavailable(f"{package} {version}: {e}")
