"""Start a run-rung check under the target interpreter: one prepare process, then N ranks.

The tool never imports torch: it starts `checks/harness.py` with the server's Python, one
process per rank, each in its own session so that a timeout kills it with everything it
spawned (nvcc, ninja). Ranks meet through a file store in a private folder of the run's
workspace (no port to race for). Each child prints JSON lines; the last `phase` a child
named says where it was when it died or hung. When one rank fails, the others get `grace` seconds to report their
own view before they are killed: a peer blocked in a collective would otherwise wait forever.
Every child's environment forbids NVLink multicast (NO_MULTICAST), which on a shared host
can take every GPU out of service.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120patch.probes.subproc import own_dir

HARNESS = Path(__file__).resolve().parent / "checks" / "harness.py"
TIMING_LIB = HARNESS.parent / "kernel_timing.py"  # what checks time with (importable beside the harness)
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
GRACE_S = 20.0  # how long the other ranks may still report after one failed
TERM_GRACE_S = 3.0  # SIGTERM, then SIGKILL this much later
SIGNAL_FIRST_S = 1.0  # a signal death this close after a peer's error is still the cause (first_failure)
STDERR_LINES = 40


@dataclass(frozen=True)
class RunCheck:
    """One numeric check: the script, how many ranks (GPUs) it needs, and its time budget."""

    name: str  # the catalogue's `run` value
    file: str  # in checks/
    world_size: int
    timeout_s: float  # prepare (a cold JIT build included) and the ranks together
    api: str  # what it calls, for the reason line when a rank cannot say


def child_environment(base: Mapping[str, str]) -> dict[str, str]:
    """`base` with multicast forbidden (always: these override whatever `base` says) and a
    device order that matches nvidia-smi/NVML, so GPU indices mean the same in every child."""
    env = dict(base)
    env.update(NO_MULTICAST)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Child:
    """What one process said and how it ended."""

    name: str  # "prepare" or "rank 1"
    phase: str = "start"  # the last phase it named
    info: dict[str, Any] = field(default_factory=dict)  # what it said with that phase (e.g. the case)
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    returncode: int | None = None
    killed: str = ""  # why we killed it ("timeout", "rank 0 failed"), "" if it ended by itself
    stderr_tail: str = ""
    ended_s: float | None = None  # seconds after the start when it ended
    error_s: float | None = None  # seconds after the start when it reported an error

    @property
    def failed_s(self) -> float:
        """When it failed: the error line if it wrote one (its exit can lag behind a peer's), else its end."""
        return self.error_s if self.error_s is not None else (self.ended_s or 0.0)

    @property
    def failed(self) -> bool:
        """It ended without a result: it raised, exited non-zero, died on a signal, or was killed."""
        return self.result is None or self.error is not None or bool(self.returncode)

    @property
    def how(self) -> str:
        """How it ended, in words."""
        if self.killed:
            return f"killed ({self.killed})"
        if self.error:
            return "raised"
        rc = self.returncode
        if rc is not None and rc < 0:
            try:
                sig = signal.Signals(-rc).name
            except ValueError:
                sig = str(-rc)
            return f"died on {sig}"
        if rc:
            return f"exited {rc} without a result"
        return "ended without a result" if self.result is None else "finished"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "phase": self.phase,
            "info": self.info,
            "how": self.how,
            "returncode": self.returncode,
            "killed": self.killed,
            "error": (self.error or {}).get("error"),
            "stderr_tail": self.stderr_tail[-600:],
        }


@dataclass
class Run:
    children: list[Child]
    elapsed_s: float
    timed_out: bool = False

    def first_failure(self) -> Child | None:
        """The child whose failure came first and was not our doing (the cause, not the fallout).
        A child that died on a signal outranks one that raised less than SIGNAL_FIRST_S after it:
        the peer of a killed rank raises as soon as its socket closes, and the two timestamps come
        from threads of ours that a loaded box can wake in either order."""
        own = [c for c in self.children if c.failed and not c.killed]
        if not own:
            return None
        first = min(own, key=lambda c: c.failed_s)
        died = [c for c in own if (c.returncode or 0) < 0 and c.error is None]
        if first.error is not None and died:
            signalled = min(died, key=lambda c: c.failed_s)
            if signalled.failed_s - first.failed_s < SIGNAL_FIRST_S:
                return signalled
        return first


class _Proc:
    """A child process and the threads that read its two pipes."""

    def __init__(self, child: Child, argv: list[str], env: dict[str, str], start: float) -> None:
        self.child = child
        self.start = start
        self.err: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env=env,
            start_new_session=True,
        )
        self.term_at = 0.0  # when we sent SIGTERM
        self.exit_time: float | None = None  # when it ended, to the millisecond: who failed first matters
        self.threads = [
            threading.Thread(target=self._read_out, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for t in self.threads:
            t.start()
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        self.proc.wait()
        self.exit_time = time.monotonic()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # a library printing on stdout: not ours to parse
            if not isinstance(msg, dict):
                continue
            if "phase" in msg and "error" not in msg:
                self.child.phase = str(msg["phase"])
                self.child.info = {k: v for k, v in msg.items() if k != "phase"}
            elif "result" in msg:
                self.child.result = msg["result"] if isinstance(msg["result"], dict) else {"value": msg["result"]}
            elif "error" in msg:
                self.child.error_s = round(time.monotonic() - self.start, 3)
                self.child.error = msg
                self.child.phase = str(msg.get("phase") or self.child.phase)
                if msg.get("case") is not None:
                    self.child.info = {**self.child.info, "case": msg["case"]}

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line.rstrip("\n"))

    def kill(self, why: str) -> None:
        """SIGTERM to its process group, SIGKILL after TERM_GRACE_S. Not SIGKILL at once: ninja
        runs each nvcc in a process group of its own and only takes them down on SIGTERM."""
        if self.proc.poll() is not None:
            return
        now = time.monotonic()
        if not self.child.killed:
            self.child.killed, self.term_at = why, now
            sig = signal.SIGTERM
        elif now - self.term_at >= TERM_GRACE_S:
            sig = signal.SIGKILL
        else:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def finish(self) -> None:
        self.proc.wait()
        for t in self.threads:
            t.join(timeout=5.0)
        self.child.returncode = self.proc.returncode
        self.child.stderr_tail = "\n".join(self.err)[-2000:]


def _argv(python: str, mode: str, check: Path, args: Mapping[str, Any]) -> list[str]:
    return [python, str(HARNESS), mode, str(check), json.dumps(dict(args))]


@contextlib.contextmanager
def _killed_on_sigterm(procs: list[_Proc]) -> Iterator[None]:
    """A SIGTERM to us (`timeout`, a supervisor) first kills the ranks: they run in sessions of
    their own, so nothing else would, and an orphaned rank can spin on a GPU for good."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.getsignal(signal.SIGTERM)
    old = old if old is not None else signal.SIG_DFL  # a handler set outside Python

    def on_term(signum: int, frame: object) -> None:
        for p in procs:
            p.kill("we were terminated")
        deadline = time.monotonic() + TERM_GRACE_S
        while time.monotonic() < deadline and any(p.proc.poll() is None for p in procs):
            time.sleep(0.05)
        for p in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if p.proc.poll() is None:
                    os.killpg(p.proc.pid, signal.SIGKILL)
        signal.signal(signal.SIGTERM, old)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run_children(specs: list[tuple[Child, list[str], dict[str, str]]], timeout: float, grace: float = GRACE_S) -> Run:
    """Run the children to the end, or until `timeout`, or until `grace` after the first failure."""
    procs: list[_Proc] = []
    with _killed_on_sigterm(procs):
        return _supervise(specs, procs, timeout, grace)


def _supervise(
    specs: list[tuple[Child, list[str], dict[str, str]]], procs: list[_Proc], timeout: float, grace: float
) -> Run:
    start = time.monotonic()
    timed_out = False
    try:
        for child, argv, env in specs:
            try:
                procs.append(_Proc(child, argv, env, start))
            except OSError as e:
                child.error, child.returncode = {"error": f"cannot start {argv[0]}: {e}"}, 127
                child.ended_s = 0.0
        failed_at: float | None = None
        while True:
            now = time.monotonic() - start
            for p in procs:
                if p.child.ended_s is None and p.exit_time is not None:
                    p.finish()
                    p.child.ended_s = round(p.exit_time - start, 3)
                    if p.child.failed and failed_at is None:
                        failed_at = now
            alive = [p for p in procs if p.child.ended_s is None]
            if not alive:
                break
            if failed_at is None and any(c.failed and c.ended_s is not None for c, _, _ in specs):
                failed_at = now  # a child that could not even start
            if now >= timeout:
                timed_out = True
                for p in alive:
                    p.kill(f"no answer within {timeout:.0f} s")
            elif failed_at is not None and now - failed_at >= grace:
                cause = min((c for c, _, _ in specs if c.failed and c.ended_s is not None), key=lambda c: c.failed_s)
                for p in alive:
                    p.kill(f"{cause.name} failed {grace:.0f} s earlier")
            time.sleep(0.05)
    except BaseException:  # Ctrl-C: leave no rank behind
        for p in procs:
            p.kill("interrupted")
        raise
    finally:
        for p in procs:
            while p.child.ended_s is None and p.exit_time is None:
                p.kill(p.child.killed or "interrupted")  # TERM first, KILL after TERM_GRACE_S
                time.sleep(0.05)
            if p.child.ended_s is None:
                p.finish()
                p.child.ended_s = round((p.exit_time or time.monotonic()) - start, 3)
    return Run([c for c, _, _ in specs], round(time.monotonic() - start, 3), timed_out)


def prepare(python: str, check: Path, args: Mapping[str, Any], env: Mapping[str, str], timeout: float) -> Run:
    """The check's one-process step: which GPUs match, and the JIT build of its module."""
    child = Child("prepare")
    return run_children([(child, _argv(python, "prepare", check, args), child_environment(env))], timeout)


def run_ranks(
    python: str,
    check: Path,
    args: Mapping[str, Any],
    world_size: int,
    env: Mapping[str, str],
    timeout: float,
    grace: float = GRACE_S,
    scratch: Path | None = None,
) -> Run:
    """`world_size` ranks of the check, one process each, meeting through a file store
    (in `scratch` when given, see `subproc.own_dir`)."""
    with own_dir("ranks", scratch) as tmp:
        store = tmp / "store"
        specs = []
        for rank in range(world_size):
            e = child_environment(env)
            e.update(
                SM120PATCH_RANK=str(rank),
                SM120PATCH_WORLD_SIZE=str(world_size),
                SM120PATCH_INIT=store.as_uri(),
            )
            specs.append((Child(f"rank {rank}"), _argv(python, "rank", check, args), e))
        return run_children(specs, timeout, grace)
