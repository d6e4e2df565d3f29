"""Find and stop what a server launch left behind outside its own process group.

guard's launcher starts the server in a session of its own and stops that process group. A
launcher that starts workers with `setsid` (or `setpgid`) puts them in another group, where the
group kill never reaches, and once their parent exits they belong to init: nothing in their
ancestry leads back to the launch. So each launch is marked: the server starts with
SM120PATCH_VERIFY_LAUNCH=<token> in its environment, which every descendant inherits across fork
and exec unless it clears its environment on purpose. After the group is gone, /proc is scanned
for live processes of this user that carry the token, or that sit in the launch's session or
group; they get SIGTERM, then SIGKILL after the grace period, and whatever survives is named.
Linux only (/proc); elsewhere nothing is found and nothing is claimed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

ENV = "SM120PATCH_VERIFY_LAUNCH"


@dataclass(frozen=True)
class Leftover:
    pid: int
    command: str


def new_token() -> str:
    return secrets.token_hex(8)


@contextlib.contextmanager
def marked(token: str) -> Iterator[None]:
    """The environment a launch starts with carries the token (the launcher copies os.environ)."""
    old = os.environ.get(ENV)
    os.environ[ENV] = token
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, session) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except OSError:
        return None
    return fields[0], int(fields[2]), int(fields[3])


def _carries(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return needle in fh.read().split(b"\0")
    except OSError:  # another user's process, or gone
        return False


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200] or f"pid {pid}"
    except OSError:
        return f"pid {pid}"


def find(token: str, leader: int) -> list[Leftover]:
    """Live processes of the launch: carrying its token, or in the leader's session or group."""
    if not os.path.isdir("/proc/self"):
        return []
    needle = f"{ENV}={token}".encode()
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        st = _stat(pid)
        if st is None or st[0] in "ZX":
            continue
        if st[1] == leader or st[2] == leader or _carries(pid, needle):
            out.append(Leftover(pid, _command(pid)))
    return out


def stop(found: list[Leftover], grace: float) -> list[Leftover]:
    """SIGTERM each, SIGKILL what is left after `grace`; returns those still alive after that."""

    def alive(p: Leftover) -> bool:
        st = _stat(p.pid)
        return st is not None and st[0] not in "ZX"

    def send(ps: list[Leftover], sig: int) -> None:
        for p in ps:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p.pid, sig)

    def wait(ps: list[Leftover], seconds: float) -> list[Leftover]:
        end = time.monotonic() + seconds
        while True:
            left = [p for p in ps if alive(p)]
            if not left or time.monotonic() >= end:
                return left
            time.sleep(0.02)

    send(found, signal.SIGTERM)
    left = wait(found, grace)
    if left:
        send(left, signal.SIGKILL)
        left = wait(left, 5.0)
    return left
