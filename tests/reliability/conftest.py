"""Plumbing for the reliability suite: run the real CLI, fingerprint trees, count what was tried.

Every test adds to FIGURES; at the end of the session they are written as JSON to
`$SM120PATCH_RELIABILITY_FIGURES` (default `$SM120PATCH_CACHE/reliability-figures.json`),
which `tools/reliability_report.py` renders into docs/reliability.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from sm120patch.engine.journal import DIRNAME
from tests.conftest import needs_tool, unavailable
from tools.releases import cache_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
FIGURES: dict[str, int] = {}
_FIG_LOCK = threading.Lock()
_RAN: set[str] = set()


def count(key: str, n: int = 1) -> None:
    with _FIG_LOCK:
        FIGURES[key] = FIGURES.get(key, 0) + n


def figures_path() -> Path:
    env = os.environ.get("SM120PATCH_RELIABILITY_FIGURES")
    return Path(env) if env else cache_dir() / "reliability-figures.json"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "tests/reliability" in report.nodeid.replace(os.sep, "/") and report.when == "call":
        _RAN.add(report.nodeid)
        count("tests_xfailed" if hasattr(report, "wasxfail") else f"tests_{report.outcome}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _RAN or getattr(session.config.option, "numprocesses", None):
        return  # nothing ran here, or this is the controller of a `pytest -n` run: its workers count
    out = figures_path()
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # one file per worker of `make test` (tests/reliability's own run writes the one file)
        out = out.with_name(f"{out.stem}.{worker}{out.suffix}")
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": sys.version.split()[0],
        "exit_status": int(exitstatus),
        "figures": dict(sorted(FIGURES.items())),
    }
    out.write_text(json.dumps(data, indent=1) + "\n")


# --- running the CLI ----------------------------------------------------------------------------


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120, user: str | None = None):
    """`python -m sm120patch ARGS` as a real process; returns CompletedProcess (text).

    With `user`, the process runs as that unprivileged user from `unprivileged_runtime()`, a
    copy outside the clone: a clone in a private folder (`mktemp -d`, a home of mode 700)
    is invisible to other users, and so is the editable install inside it."""
    cmd = [sys.executable, "-m", "sm120patch", *args]
    cwd = None
    full_env = {**os.environ, "NO_COLOR": "1"}
    for k in ("SM120PATCH_FAULT", "SM120PATCH_FAULT_TRACE", "SM120PATCH_DEBUG"):
        full_env.pop(k, None)
    if user:
        rt = unprivileged_runtime(user)
        cmd = [*as_user(user), rt.python, "-s", "-m", "sm120patch", *args]
        cwd = rt.root  # not the clone: `-m` puts the working folder first on sys.path
        full_env.pop("VIRTUAL_ENV", None)
        full_env.update(PYTHONPATH=rt.pythonpath, PYTHONNOUSERSITE="1")
    full_env.update(env or {})
    r = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=full_env, start_new_session=True, cwd=cwd
    )
    if "Traceback" in r.stdout + r.stderr:
        count("tracebacks")
    return r


def unprivileged_user() -> str:
    """Who the permission tests run as: '' (themselves) when already unprivileged; under root,
    `nobody` through setpriv (root ignores file modes). setpriv is a CI promise (util-linux):
    missing, it fails in CI and skips elsewhere, saying so."""
    if os.geteuid() != 0:
        return ""
    needs_tool("setpriv", "under root the permission checks run as nobody through setpriv")
    return "nobody"


def as_user(user: str) -> list[str]:
    """The command prefix that runs what follows as `user` (root only)."""
    pw = pwd.getpwnam(user)
    return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--"]


class Runtime(NamedTuple):
    python: str  # an interpreter the user may run
    pythonpath: str  # sm120patch and its dependencies, in folders the user may read
    root: Path


_RUNTIMES: dict[str, Runtime] = {}


def unprivileged_runtime(user: str) -> Runtime:
    """sm120patch, its recipes and this venv's dependencies copied to a world-readable temp folder,
    with an interpreter of the same Python version that `user` can start. Built once per session."""
    if user in _RUNTIMES:
        return _RUNTIMES[user]
    import atexit
    import shutil
    import sysconfig
    import tempfile

    import sm120patch
    from sm120patch.catalogue.recipes import default_recipe_dir

    root = Path(tempfile.mkdtemp(prefix="sm120patch-unprivileged-"))
    atexit.register(shutil.rmtree, root, True)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    src, site = root / "src", root / "site"
    shutil.copytree(Path(sm120patch.__file__).parent, src / "sm120patch", ignore=skip)
    shutil.copytree(default_recipe_dir(), src / "sm120patch" / "patches", ignore=skip, dirs_exist_ok=True)
    purelib = Path(sysconfig.get_paths()["purelib"])
    own = ("__editable__", "sm120patch", "_sm120patch")
    for item in purelib.iterdir():
        if item.name.startswith(own) or item.name == "__pycache__":
            continue
        if item.is_dir():
            shutil.copytree(item, site / item.name, ignore=skip, symlinks=True)
        else:
            site.mkdir(exist_ok=True)
            shutil.copy2(item, site / item.name)
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for n in filenames:
            p = Path(dirpath) / n
            if not p.is_symlink():
                os.chmod(p, 0o644)
    pythonpath = f"{src}{os.pathsep}{site}"
    want = f"{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [getattr(sys, "_base_executable", ""), shutil.which(f"python{want}") or "", f"/usr/bin/python{want}"]
    probe = "import sys, libcst, click, sm120patch.cli; print('%d.%d' % sys.version_info[:2])"
    for python in dict.fromkeys(c for c in candidates if c):
        r = subprocess.run(
            [*as_user(user), python, "-s", "-c", probe],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=root,
            env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": pythonpath, "PYTHONNOUSERSITE": "1"},
        )
        if r.returncode == 0 and r.stdout.strip() == want:
            _RUNTIMES[user] = Runtime(python, pythonpath, root)
            return _RUNTIMES[user]
    unavailable(f"no Python {want} that {user} may run among {candidates}; install one under /usr/bin")


def assert_clean_failure(r: subprocess.CompletedProcess, *names: str) -> None:
    """A refusal: exit 2, one `sm120patch: error:` line naming the file(s), no traceback."""
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out
    assert r.returncode == 2, (r.returncode, out)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sm120patch: error: "), r.stderr
    for n in names:
        assert n in lines[0], (n, lines[0])


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


# --- fingerprints ---------------------------------------------------------------------------------


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def fingerprint(root: Path, skip_journal: bool = False) -> dict[str, tuple[str, int]]:
    """rel -> (sha256, mode) of every file and link under root (links by their target text)."""
    out: dict[str, tuple[str, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        if skip_journal and d == root and DIRNAME in dirnames:
            dirnames.remove(DIRNAME)
        for name in filenames + [n for n in dirnames if (d / n).is_symlink()]:
            p = d / name
            rel = p.relative_to(root).as_posix()
            st = p.lstat()
            if p.is_symlink():
                out[rel] = ("link:" + os.readlink(p), 0)
            else:
                out[rel] = (sha(p), st.st_mode & 0o7777)
        for n in list(dirnames):
            if (d / n).is_symlink():
                dirnames.remove(n)
    return out


class Baseline:
    """A release tree's every file (sha256, mode, inode) so a hard-linked copy is checked cheaply:
    a file still sharing the pristine inode and mtime was never replaced; any other is hashed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[str, tuple[str, int]] = {}
        self.stat: dict[str, tuple[int, int, int]] = {}
        for p in self._walk(root):
            st = p.stat()
            rel = p.relative_to(root).as_posix()
            self.files[rel] = (sha(p), st.st_mode & 0o7777)
            self.stat[rel] = (st.st_ino, st.st_mtime_ns, st.st_size)

    @staticmethod
    def _walk(root: Path):
        for dirpath, _dirnames, filenames in os.walk(root):
            for n in filenames:
                if n != ".complete":
                    yield Path(dirpath) / n

    def diff(self, tree: Path, expected: dict[str, tuple[str, int]] | None = None, skip_journal=False) -> list[str]:
        """Differences of `tree` from the baseline (with `expected` overriding some files)."""
        want = {**self.files, **(expected or {})}
        seen = set()
        problems = []
        for p in self._walk(tree):
            rel = p.relative_to(tree).as_posix()
            if skip_journal and rel.startswith(DIRNAME + "/"):
                continue
            seen.add(rel)
            if rel not in want:
                problems.append(f"extra {rel}")
                continue
            st = p.lstat()
            if p.is_symlink():
                problems.append(f"link {rel}")
                continue
            if self.stat.get(rel) == (st.st_ino, st.st_mtime_ns, st.st_size) and rel not in (expected or {}):
                got = self.files[rel]
            else:
                got = (sha(p), st.st_mode & 0o7777)
            if got != want[rel]:
                problems.append(f"differs {rel}")
        problems += [f"missing {rel}" for rel in sorted(set(want) - seen)]
        return problems

    def still_pristine(self) -> list[str]:
        """The cache itself was never written in place (hard links share it)."""
        return [rel for rel, (digest, _) in self.files.items() if sha(self.root / rel) != digest]


# --- a small fake SGLang tree (the shape of the gates, not SGLang code) ------------------------------

from tests.unit.sglang_fakes import COMMUNICATOR, COMMUNICATOR_REL, MODEL_RUNNER_REL, SERVER_ARGS_REL, make_sglang  # noqa: E402

__all__ = ["COMMUNICATOR", "COMMUNICATOR_REL", "MODEL_RUNNER_REL", "SERVER_ARGS_REL"]


def make_fake(root: Path) -> Path:
    """The unit tests' fake tree (tests/unit/sglang_fakes.py), as a wheel-shaped folder."""
    make_sglang(root)
    return root


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    return make_fake(tmp_path / "tree")


APPLY = ("--arch", "sm_120", "--probe", "none", "--no-diff")
