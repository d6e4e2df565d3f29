"""tools/run_only.py runs the installed sm120patch, as docs/gpu-validation.md's "Repeat it" does
from the wheel, even where PYTHONPATH or the working folder names this repository's source tree
(which has no `sm120patch.patches`: the wheel maps `patches/` there)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _installed_copy(site: Path) -> None:
    """The wheel's layout (pyproject maps `patches/` to `sm120patch.patches`), without a build."""
    shutil.copytree(REPO / "sm120patch", site / "sm120patch", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "patches", site / "sm120patch" / "patches")


def test_run_only_imports_the_installed_package_not_the_source_tree(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _installed_copy(site)
    deps = sysconfig.get_paths()["purelib"]  # packaging etc.; `-S` keeps the editable install's hook out
    env = {"PYTHONPATH": f"{REPO}:{site}:{deps}", "PATH": "/usr/bin:/bin"}
    for cwd in (REPO, tmp_path):
        r = subprocess.run(
            [sys.executable, "-S", str(REPO / "tools" / "run_only.py"), "flashinfer:no-such-kernel", "sm_120"],
            capture_output=True, text=True, timeout=120, env=env, cwd=cwd,
        )  # fmt: skip
        assert "Traceback" not in r.stderr, r.stderr
        assert r.returncode == 2, (r.returncode, r.stderr)
        assert f"sm120patch from {site / 'sm120patch'}" in r.stderr and "unknown kernel" in r.stderr, r.stderr
