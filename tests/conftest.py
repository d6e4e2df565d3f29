"""Shared test plumbing: real releases from PyPI, fetched once into a cache outside the repo,
and the one rule for what may skip.

The rule (`unavailable`): in CI (`CI` set to 1/true/yes) a test that cannot get what it needs
fails; elsewhere it skips with the reason. Only hardware a CI box never has (a GPU, an nvcc
that builds for SM12x, root) is a plain skip, and that goes through `requires`, which says why.

What CI promises is written down here, once: the tools in CI_TOOLS (.ci/run runs on a Debian/Ubuntu
image with git and the build tools), a download from PyPI, pip building a venv. A test states such a
need with a marker (`@pytest.mark.needs("patch")`, `@pytest.mark.network`) or `needs_tool()`, so it
fails in CI where the tool is missing and skips elsewhere, naming the tool; tools/check_tests.py
refuses a plain skip on one of these tools.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path
from typing import NoReturn

import pytest

# A shell that starts a job in the background without job control (`make test &`, a CI runner's
# step) starts it with SIGINT ignored, and every child inherits that: the Ctrl-C tests'
# simulated SIGINT (SM120PATCH_FAULT=int:N) was then ignored and apply ran to the end. A handler
# here (not an ignore) is reset to the default in each exec'd child, so the children see Ctrl-C.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

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


# tools every CI box has; a missing one is `unavailable` (fails in CI), never a silent skip
CI_TOOLS = ("git", "patch", "setpriv", "c++", "nm", "nvcc", "objcopy", "cc")


def needs_tool(name: str, why: str = "") -> str:
    """The tool's path; where it is missing, `unavailable` (a CI promise) or, for a tool CI does
    not promise, a skip: either way the reason names the tool and what needed it."""
    path = shutil.which(name)
    if path is None:
        reason = f"{name} is not on PATH" + (f": {why}" if why else "")
        if name in CI_TOOLS:
            unavailable(reason)
        pytest.skip(reason)
    return path


def pytest_configure(config: pytest.Config) -> None:
    """Every test run checks the planner's splice shortcut against a full regeneration. Set by
    pytest, not when this module is imported: the benchmarks import test helpers, and a plan
    they time must not pay for the check (it did: `make bench` measured it until 2026-12-03)."""
    os.environ.setdefault("SM120PATCH_CHECK_SPLICE", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files marked `long` first, the rest in their order: make test hands whole files to two
    workers in collection order (--no-loadscope-reorder), and a long file started last would run
    alone at the end. The same sort on every worker, so xdist sees the same collection."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """`@pytest.mark.needs("patch", "git", why=...)`: each tool checked by `needs_tool` before the test."""
    for mark in item.iter_markers("needs"):
        for name in mark.args:
            needs_tool(name, mark.kwargs.get("why", ""))


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
