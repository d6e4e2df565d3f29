"""Probe scratch folders: removed after use, and after a killed probe by the next one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sm120patch.probes.subproc import own_dir


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_removed_after_use(tmp_path: Path) -> None:
    with own_dir("spec", tmp_path) as d:
        (d / "x").write_text("1")
        assert d.parent == tmp_path and d.name.startswith(f"spec-{os.getpid()}-")
    assert list(tmp_path.iterdir()) == []


def test_a_dead_probes_folder_goes_a_live_ones_stays(tmp_path: Path) -> None:
    dead = tmp_path / f"spec-{_dead_pid()}-abc"
    live = tmp_path / f"spec-{os.getppid()}-abc"  # our parent is alive
    other = tmp_path / f"build-{_dead_pid()}-abc"  # another prefix: not ours to judge
    for d in (dead, live, other):
        (d / "sub").mkdir(parents=True)
    with own_dir("spec", tmp_path):
        pass
    assert not dead.exists() and live.is_dir() and other.is_dir()


def test_falls_back_to_system_temp_when_the_cache_is_unwritable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with own_dir("spec", blocker / "scratch") as d:
        assert d.is_dir() and not d.is_relative_to(tmp_path)
    assert not d.exists()
