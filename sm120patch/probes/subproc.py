"""Run a probe script under the target interpreter: own process group, timeout, Ctrl-C safe.

FlashInfer and torch are only ever imported in a child of the *target* Python, so a
hang, a crash or a CUDA init there cannot take the tool down. The child gets its own
session so that a timeout or Ctrl-C kills it and everything it spawned (nvcc, ninja).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120patch.arch import Arch
from sm120patch.probes.verdict_cache import default_cache_dir


@dataclass
class ChildResult:
    payload: dict[str, object] | None  # the JSON line the script printed last
    returncode: int | None
    stderr_tail: str
    elapsed_s: float
    timed_out: bool = False
    lines: list[dict[str, Any]] = field(default_factory=list)  # every JSON line, in order


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    return True


@contextlib.contextmanager
def own_dir(prefix: str, under: Path | None = None) -> Iterator[Path]:
    """A private scratch folder for one probe step, removed afterwards.

    It lives under `under` (default: the probe cache's `scratch/`) and is named for this
    process, so a probe killed before it could clean up (SIGKILL, an unhandled SIGTERM)
    leaves its folder where the next probe finds it and removes it, instead of in the
    system temp. Where that folder cannot be made, the system temp is used.
    """
    base = under if under is not None else default_cache_dir() / "scratch"
    try:
        base.mkdir(parents=True, exist_ok=True)
        for old in base.glob(f"{prefix}-*-*"):
            pid = old.name[len(prefix) + 1 :].split("-")[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                shutil.rmtree(old, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}-{os.getpid()}-", dir=base))
    except OSError:
        tmp = Path(tempfile.mkdtemp(prefix=f"sm120patch-{prefix}-"))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def arch_list_value(arch: Arch, cuda_at_least_12_9: bool = True) -> str:
    """FLASHINFER_CUDA_ARCH_LIST entry with an explicit suffix.

    Every FlashInfer from 0.5 to 0.7 keeps a suffixed minor ("12.0f") as given, while
    an unsuffixed "12.0" makes 0.6.x+ ask nvcc for its version first; the suffix is
    also what FlashInfer itself picks: 9.0a, 10.0a, 12.0f (12.0a before CUDA 12.9), 12.1a.
    """
    if arch.major == 12 and arch.minor == 0:
        return "12.0f" if cuda_at_least_12_9 else "12.0a"
    if arch.major >= 9:
        return f"{arch.major}.{arch.minor}a"
    return f"{arch.major}.{arch.minor}"


def child_env(arch: Arch, sys_path: str | None, workspace: str, cuda_at_least_12_9: bool = True) -> dict[str, str]:
    env = dict(os.environ)
    env["FLASHINFER_CUDA_ARCH_LIST"] = arch_list_value(arch, cuda_at_least_12_9)
    env["FLASHINFER_WORKSPACE_BASE"] = workspace  # keep FlashInfer's cache writes out of $HOME
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if sys_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [sys_path, env.get("PYTHONPATH")]))
    return env


_LIVE: set[subprocess.Popen[str]] = set()  # children of run_script still running, in any thread
_LIVE_LOCK = threading.Lock()


def kill_live() -> None:
    """End every child run_script started that is still running (the caller was interrupted while
    other threads waited on them)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_script(
    python: str, script: str, args: list[str], env: dict[str, str], timeout: float, progress: str | None = None
) -> ChildResult:
    """Run `python -c script args...`; on Ctrl-C kill the whole group and re-raise."""
    start = time.monotonic()
    show = progress is not None and sys.stderr.isatty()
    try:
        proc = subprocess.Popen(
            [python, "-c", script, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
    except OSError as e:
        return ChildResult(None, None, f"cannot start {python}: {e}", 0.0)
    timed_out = False
    with _LIVE_LOCK:
        _LIVE.add(proc)
    try:
        while True:
            try:
                out, err = proc.communicate(timeout=1.0 if show else timeout)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - start
                if elapsed >= timeout:
                    timed_out = True
                    _kill_group(proc)
                    out, err = proc.communicate()
                    break
                if show:
                    sys.stderr.write(f"\r{progress} ... {elapsed:4.0f} s")
                    sys.stderr.flush()
    except BaseException:  # Ctrl-C or anything else: leave no child behind
        _kill_group(proc)
        if show:
            sys.stderr.write("\n")
        raise
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc)
    if show:
        sys.stderr.write(f"\r{progress} ... {time.monotonic() - start:4.0f} s\n")
    lines: list[dict[str, Any]] = []
    for line in (out or "").strip().splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            lines.append(obj)
    payload = lines[-1] if lines else None
    elapsed = time.monotonic() - start
    return ChildResult(payload, proc.returncode, (err or "").strip()[-800:], elapsed, timed_out, lines)
