"""Run an inference server under watch: pass its output through, and if it crashes on startup
with a recipe's known signature, roll that recipe back and (optionally) start it once more.

Why a supervisor: an opened gate fails at server start (JIT build, CUDA-graph capture), long
after `apply` returned. Guard closes that loop without an operator, and only for what it can
name: a fatal signature seen *before* the server is ready, implicating recipes the journal
shows as applied. After the server is ready, guard reports a crash and the command to run,
but changes nothing: a server that has served traffic is the operator's to touch.

Process rules: the server runs in its own session/process group; SIGINT/SIGTERM sent to guard
go to that whole group, escalated to SIGKILL after a grace period (a second signal escalates
at once); every exit path stops what is left of the group, so no orphans. Exit status: the
server's own (128+N when a signal N killed it); 1 when guard stopped it (fatal signature
before ready, or not ready in time); 2 for bad usage.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sm120patch.catalogue.recipes import Recipe
from sm120patch.errors import EXIT_FAILED, UserError
from sm120patch.triage.advice import add_advice
from sm120patch.triage.diagnose import Diagnoser, Diagnosis, read_lines, rollback_command
from sm120patch.triage.signatures import Signature
from sm120patch.visible import visible

PREFIX = "[sm120patch guard]"
DEFAULT_READY = re.escape("The server is fired up and ready to roll!")
DEFAULT_TIMEOUT = 1800.0  # big models take many minutes to load, autotune and capture
DEFAULT_GRACE = 10.0
EOF_AFTER_EXIT = 2.0  # seconds to wait for output after the server exits
URL_INTERVAL = 0.5

RollbackFn = Callable[[Path, list[str]], list[str]]
AppliedFn = Callable[[Path], set[str]]
PutBackFn = Callable[[Path, list[str], list[str]], list[str]]  # (target, ids, archs) -> ids applied again


@dataclass
class GuardOptions:
    command: list[str]
    target: Path | None = None
    ready_pattern: str = DEFAULT_READY
    ready_url: str | None = None
    timeout: float = DEFAULT_TIMEOUT  # seconds to become ready; 0 = no limit
    restart: bool = False
    grace: float = DEFAULT_GRACE
    canary: Any = None  # verify.canary.Canary: start(events) once ready, stop() when the launch ends


class GuardLog:
    """Guard's own account of what it did: stderr, prefixed, and optionally a file (the text as shown: the log
    lines it quotes have their control characters written as escapes, as on the terminal)."""

    def __init__(self, stream: IO[str] | None = None, path: Path | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.lines: list[str] = []
        self._file: IO[str] | None = None
        if path is not None:
            try:
                self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            except OSError as e:
                raise UserError(f"{path}: cannot open guard log ({e.strerror}); check the path") from None

    def __call__(self, message: str) -> None:
        for line in message.splitlines() or [""]:
            text = f"{PREFIX} {line}"
            self.lines.append(text)
            print(text, file=self.stream, flush=True)
            if self._file:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
                self._file.write(f"{stamp} {visible(text)}\n")  # what the user reads: no raw control chars
                self._file.flush()

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None


@dataclass
class Attempt:
    """What one launch of the server came to."""

    returncode: int | None = None  # the server's, 128+N when killed by signal N
    ready: bool = False
    stopped_by_guard: str | None = None  # "fatal" | "timeout" | "canary" | None
    signalled: int | None = None  # signal guard received and forwarded
    diagnosis: Diagnosis | None = None
    late_fatal: list[str] = field(default_factory=list)


def exit_status(returncode: int) -> int:
    """Shell convention: a process killed by signal N reports 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def _proc_stat(pid: str) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[0], int(fields[2])  # state, process group


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`."""
    if os.path.isdir("/proc/self"):
        pids = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                st = _proc_stat(name)
                if st and st[1] == pgid and st[0] not in "ZX":
                    pids.append(int(name))
        return pids
    try:  # pragma: no cover - non-Linux fallback, counts zombies too
        os.killpg(pgid, 0)
        return [pgid]
    except (ProcessLookupError, PermissionError):
        return []


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class _Server:
    """One launch: the process, its output pump, and how to stop its whole group."""

    def __init__(self, opts: GuardOptions, diagnoser: Diagnoser, out: IO[str], log: GuardLog):
        self.opts, self.diagnoser, self.out, self.log = opts, diagnoser, out, log
        self.events: queue.Queue[tuple[str, object]] = queue.Queue()
        self.ready_re = re.compile(opts.ready_pattern)
        self.lock = threading.Lock()  # the pump feeds the diagnoser while guard may read it
        try:
            self.proc = subprocess.Popen(
                opts.command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            raise UserError(f"{opts.command[0]}: cannot start the server ({e.strerror}); check the command") from None
        self.pgid = self.proc.pid  # session leader: its pid is the group id
        self.pump = threading.Thread(target=self._pump, name="guard-pump", daemon=True)
        self.pump.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        passing = True
        try:
            for line in read_lines(self.proc.stdout):
                if passing:
                    try:
                        self.out.write(line if line.endswith("\n") else line + "\n")
                        self.out.flush()
                    except (OSError, ValueError) as e:  # our stdout went away: keep draining the server
                        passing = False
                        self.events.put(("pump-error", str(e)))
                with self.lock:
                    findings = self.diagnoser.feed(line)
                    n = self.diagnoser.lines_read
                for finding in findings:
                    if finding.fatal:
                        self.events.put(("fatal", finding))
                if self.ready_re.search(line):
                    self.events.put(("ready", n))
        except OSError as e:  # the server's pipe broke
            self.events.put(("pump-error", str(e)))
        finally:
            self.events.put(("eof", None))

    def diagnosis(self) -> Diagnosis:
        with self.lock:
            return self.diagnoser.result()

    def stop(self, sig: int = signal.SIGTERM, send: bool = True) -> None:
        """Signal the whole group (unless already sent), wait `grace`, then SIGKILL the rest."""
        name = signal.Signals(sig).name
        if send:
            _killpg(self.pgid, sig)
        if self._wait_gone(self.opts.grace):
            return
        left = group_members(self.pgid)
        self.log(f"{len(left)} process(es) still alive {self.opts.grace:g}s after {name}; sending SIGKILL")
        _killpg(self.pgid, signal.SIGKILL)
        if not self._wait_gone(5.0):
            self.log(f"processes {group_members(self.pgid)} survived SIGKILL (uninterruptible?)")

    def _wait_gone(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            self.proc.poll()
            if self.proc.returncode is not None and not group_members(self.pgid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def cleanup(self) -> None:
        """After the leader is gone: stop leftovers of its group, reap, drain the pump."""
        left = group_members(self.pgid)
        if left:
            self.log(f"stopping {len(left)} leftover process(es) of the server's group: {left}")
            self.stop(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5.0)
        self.pump.join(timeout=EOF_AFTER_EXIT)


Server = _Server  # verify launches its servers the same way (sm120patch/verify/runner.py)


def _url_ready(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
    try:
        with opener.open(url, timeout=1.0) as resp:
            return 200 <= resp.status < 400
    except (urllib.error.URLError, OSError, ValueError):
        return False


class _Signals:
    """Forward SIGINT/SIGTERM to the current server group; a second signal means SIGKILL."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.forwarded = False
        self.count = 0
        self.pgid: int | None = None
        self._old: dict[int, object] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: object) -> None:
        self.received = self.received or signum
        self.count += 1
        if self.pgid is not None:
            _killpg(self.pgid, signal.SIGKILL if self.count > 1 else signum)
            self.forwarded = True


def _watch(opts: GuardOptions, server: _Server, signals: _Signals, log: GuardLog) -> Attempt:
    """Follow one launch until it exits, is stopped, or guard is signalled."""
    att = Attempt()
    start = time.monotonic()
    deadline = start + opts.timeout if opts.timeout > 0 else None
    next_url = start
    exited_at: float | None = None
    eof = False
    while True:
        try:
            kind, payload = server.events.get(timeout=0.05)
        except queue.Empty:
            kind, payload = "", None
        now = time.monotonic()
        if kind == "ready" and not att.ready:
            att.ready = True
            log(f"server is ready (output line {payload}) after {now - start:.1f}s")
            _start_canary(opts, server, log)
        elif kind.startswith("canary-"):
            if kind == "canary-bad":
                log(f"canary: {payload}; stopping the server")
                att.stopped_by_guard = "canary"
                server.stop()
                break
            if kind == "canary-seen":
                log(f"canary: {payload}; watching only, the server keeps running")
            else:
                log(f"canary: {'answer as expected' if kind == 'canary-ok' else 'request failed'}: {payload}")
        elif kind == "fatal":
            f = payload
            where = f"line {f.line_no}: {f.signature}"  # type: ignore[attr-defined]
            if not att.ready:
                if server.proc.poll() is None:
                    log(f"fatal signature before the server was ready ({where}); stopping it")
                    att.stopped_by_guard = "fatal"
                    server.stop()
                else:
                    log(f"fatal signature before the server was ready ({where})")
                break
            att.late_fatal.append(where)
            log(f"fatal signature after the server was ready ({where})")
        elif kind == "eof":
            eof = True
        elif kind == "pump-error":
            log(f"cannot pass the server's output through ({payload}); still watching it")
        if signals.received is not None:
            name = signal.Signals(signals.received).name
            log(f"received {name}; forwarded it to the server's process group")
            att.signalled = signals.received
            server.stop(signals.received, send=not signals.forwarded)
            break
        if server.proc.poll() is not None:
            exited_at = exited_at or now
            if eof or now - exited_at > EOF_AFTER_EXIT:
                break
        if not att.ready and opts.ready_url and now >= next_url:
            if _url_ready(opts.ready_url):
                att.ready = True
                log(f"server is ready ({opts.ready_url} answered) after {now - start:.1f}s")
                _start_canary(opts, server, log)
            next_url = time.monotonic() + URL_INTERVAL
        if not att.ready and deadline is not None and now > deadline and exited_at is None:
            log(f"server not ready after {opts.timeout:g}s; stopping it")
            att.stopped_by_guard = "timeout"
            server.stop()
            break
    if opts.canary is not None:
        opts.canary.stop()
    server.cleanup()
    att.returncode = exit_status(server.proc.returncode) if server.proc.returncode is not None else None
    att.diagnosis = server.diagnosis()
    return att


def _start_canary(opts: GuardOptions, server: _Server, log: GuardLog) -> None:
    if opts.canary is not None:
        log(f"canary: the canary prompt (greedy) every {opts.canary.interval:g}s, against the server's first answer")
        opts.canary.start(server.events)


def _marked_applied(opts: GuardOptions, recipes: Sequence[Recipe], applied: AppliedFn, log: GuardLog) -> list[str]:
    """The applied recipes the catalogue marks as able to change outputs (what the canary may undo)."""
    now = _applied_or_none(applied, opts.target, log) or set()
    return [r.id for r in recipes if r.changes_outputs and r.id in now]


def _roll_back_outputs(
    opts: GuardOptions,
    recipes: Sequence[Recipe],
    applied: AppliedFn,
    rollback: RollbackFn,
    log: GuardLog,
    archs: dict[str, list[str]],
) -> list[str]:
    """After a canary failure: the applied recipes that can change outputs, one kind at a time
    (autotune and tactic choices before other kernels), rolled back; `archs` gets the archs each
    was applied for, so that they can be put back."""
    if opts.target is None:
        log("without --target, guard cannot roll back the recipes that changed the answers")
        return []
    now = _applied_or_none(applied, opts.target, log)
    if not now:
        return []
    from sm120patch.catalogue.recipes import CHANGES_OUTPUTS

    for kind in CHANGES_OUTPUTS:
        ids = [r.id for r in recipes if r.changes_outputs == kind and r.id in now]
        if not ids:
            continue
        with contextlib.suppress(Exception):  # the journal's archs; without them, put_back says why
            from sm120patch.engine.reapply import archs_of

            archs[",".join(ids)] = archs_of(opts.target, ids)
        log(f"rolling back the recipes marked changes_outputs = {kind!r}: {', '.join(ids)}")
        try:
            done = list(rollback(opts.target, ids))  # type: ignore[arg-type]
        except Exception as e:
            log(f"rollback failed: {e}")
            return []
        log(f"rolled back: {', '.join(done) if done else 'nothing'}")
        return done
    return []


def _engine_put_back(recipes: Sequence[Recipe]) -> PutBackFn:
    def put_back(target: Path, ids: list[str], archs: list[str]) -> list[str]:
        from sm120patch.engine.reapply import put_back as apply_again

        return apply_again(target, ids, recipes, archs)

    return put_back


def _put_back_outputs(
    opts: GuardOptions, rolled: list[str], archs: dict[str, list[str]], put_back: PutBackFn, log: GuardLog
) -> None:
    """The bad output outlived every rollback: the recipes were not its cause; apply them again."""
    assert opts.target is not None
    log(
        f"the canary's bad output outlived the rollback of {', '.join(rolled)}: those recipes were not its "
        "cause; putting them back and keeping the server running (the canary now only reports)"
    )
    want = sorted({a for v in archs.values() for a in v}) or ["sm_120"]
    try:
        done = put_back(opts.target, rolled, want)
    except Exception as e:
        log(f"could not put them back ({type(e).__name__}: {e}); apply them again with sm120patch apply --recipe ID")
        return
    log(f"applied again: {', '.join(done) if done else 'nothing'}")
    for r in [r for r in rolled if r not in done]:
        log(f"not applied again: {r}; run: sm120patch apply {opts.target} --recipe {r}")


def _applied_or_none(applied: AppliedFn, target: Path | None, log: GuardLog) -> set[str] | None:
    if target is None:
        return None
    try:
        return set(applied(target))
    except Exception as e:  # the journal is the engine's; guard must keep running without it
        log(f"cannot read the journal of {target} ({e}); recipes will be reported, not rolled back")
        return None


def _report(att: Attempt, log: GuardLog, recipes: Sequence[Recipe], target: Path | None) -> None:
    """The causes with the advice `sm120patch diagnose` gives (advice.add_advice: the same path)."""
    diag = att.diagnosis
    assert diag is not None
    add_advice(diag, recipes, target, warn=lambda message: log(f"warning: {message}"))
    for f in diag.causes:
        ids = f" (recipes: {', '.join(f.recipe_ids)}, journal {f.journal})" if f.recipe_ids else ""
        log(f"cause: {f.signature} at line {f.line_no}{ids}")
        log(f"  meaning: {f.meaning}")
        log(f"  next: {f.next_step}")
        for note in f.notes:
            log(f"  note: {note}")
    if not diag.cause_found:
        if diag.unnamed_errors:
            last = diag.unnamed_errors[-1]
            log(f"no known signature names the failure; last error line {last.line_no}: {last.line}")
        else:
            log("no known signature and no error lines in the server's output")


def _roll_back(opts: GuardOptions, att: Attempt, rollback: RollbackFn, log: GuardLog) -> list[str]:
    diag = att.diagnosis
    assert diag is not None
    unknown = sorted({r for f in diag.causes if f.journal == "unknown" for r in f.recipe_ids})
    if unknown:
        log(
            f"recipes {', '.join(unknown)} match the crash but the journal is unknown; not rolling "
            f"back. To do it yourself: {rollback_command(opts.target, unknown)}"
        )
    ids = diag.implicated_recipes
    last = diag.last_taken_before_crash  # the `sm120patch: <id> taken` line (sm120patch/taken_line.py)
    if last is not None:
        where = f"its taken line {last[0]}, the crash line {diag.crash_line}"
        log(f"the last gate taken before the crash: {last[1]} ({where})")
    if not ids or opts.target is None:
        return []
    log(f"rolling back {', '.join(ids)} in {opts.target}")
    try:
        result = rollback(opts.target, ids)
    except Exception as e:  # report, never crash the supervisor
        log(f"rollback failed: {e}")
        return []
    done = list(result)
    log(f"rolled back: {', '.join(done) if done else 'nothing'}")
    reasons: dict[str, str] = getattr(result, "reasons", {})  # the engine says why it left one
    for r in [r for r in ids if r not in done]:
        log(f"not rolled back: {r}: {reasons.get(r, 'no reason given')}; run: {rollback_command(opts.target, [r])}")
    return done


def run_guard(
    opts: GuardOptions,
    *,
    recipes: Sequence[Recipe],
    rollback: RollbackFn,
    applied: AppliedFn,
    signatures: Sequence[Signature] | None = None,
    out: IO[str] | None = None,
    log: GuardLog | None = None,
    put_back: PutBackFn | None = None,
) -> int:
    """Launch, watch, diagnose, roll back, maybe relaunch once; returns guard's exit status."""
    if not opts.command:
        raise UserError("guard: no server command; give it after --, e.g. guard -- python -m sglang.launch_server ...")
    try:
        re.compile(opts.ready_pattern)
    except re.error as e:
        raise UserError(f"--ready-pattern: bad regex ({e}); fix the pattern") from None
    if opts.ready_url and not opts.ready_url.startswith(("http://", "https://")):
        raise UserError(f"--ready-url: {opts.ready_url!r} is not an http(s) URL; e.g. http://127.0.0.1:30000/health")
    out = out if out is not None else sys.stdout
    log = log or GuardLog()
    launches = 0
    canary_rolled: list[str] = []  # what the canary's failures rolled back, in order
    canary_archs: dict[str, list[str]] = {}
    if opts.canary is not None and opts.target is None:
        log("canary: without --target guard cannot roll anything back: the canary only reports")
        opts.canary.watch_only()
    elif opts.canary is not None and not _marked_applied(opts, recipes, applied, log):
        log("canary: no applied recipe is marked changes_outputs, so none can be blamed: it only reports")
        opts.canary.watch_only()
    with _Signals() as signals:
        while True:
            launches += 1
            journal = _applied_or_none(applied, opts.target, log)
            diagnoser = Diagnoser(recipes, journal, signatures, opts.target)
            log(f"launch {launches}: {' '.join(opts.command)}")
            server = _Server(opts, diagnoser, out, log)
            signals.pgid = server.pgid
            try:
                att = _watch(opts, server, signals, log)
            finally:
                signals.pgid = None
                if server.proc.poll() is None or group_members(server.pgid):
                    server.stop(signal.SIGKILL)
            by = f" (stopped by guard: {att.stopped_by_guard})" if att.stopped_by_guard else ""
            log(f"server exited with status {att.returncode}{by}")
            if att.signalled is not None:
                return att.returncode if att.returncode is not None else 128 + att.signalled
            if att.stopped_by_guard == "canary":
                done = _roll_back_outputs(opts, recipes, applied, rollback, log, canary_archs)
                if done:
                    canary_rolled += done
                    log(f"relaunching the server without {', '.join(done)} (the canary saw bad output)")
                    continue
                if canary_rolled:
                    _put_back_outputs(opts, canary_rolled, canary_archs, put_back or _engine_put_back(recipes), log)
                    opts.canary.watch_only()
                    canary_rolled = []
                    log("relaunching the server with the recipes as they were")
                    continue
                log("no applied recipe is marked as able to change outputs; not relaunching")
                return EXIT_FAILED
            if att.ready:
                if att.late_fatal or att.returncode:
                    log("the server crashed after it was ready; guard changes nothing then")
                    _report(att, log, recipes, opts.target)
                return att.returncode or 0
            if att.returncode == 0 and att.stopped_by_guard is None:
                log("the server exited cleanly before it was ready")
                return 0
            _report(att, log, recipes, opts.target)
            done = _roll_back(opts, att, rollback, log)
            if opts.restart and launches == 1 and done:
                log("restarting the server once, without the rolled-back recipes")
                continue
            if opts.restart and launches == 1:
                log("nothing was rolled back, so a restart would crash the same way; not restarting")
            if att.stopped_by_guard:
                return EXIT_FAILED
            return att.returncode if att.returncode else EXIT_FAILED
