"""guard against fake servers: small Python scripts that crash, hang, ignore SIGTERM or fork."""

from __future__ import annotations

import http.server
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from packaging.specifiers import SpecifierSet

from sm120patch.catalogue.recipes import Recipe
from sm120patch.cli import triage as commands_triage
from sm120patch.errors import UserError
from sm120patch.triage.guard import GuardLog, GuardOptions, exit_status, run_guard
from sm120patch.triage.signatures import load_signatures
from tests.unit.cli_entry import SM120PATCH

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="process checks read /proc (Linux)")

AR = "sglang-allreduce-fusion-sm120"
# https://github.com/sgl-project/sglang/issues/15650
CRASH = "RuntimeError: No supported CUDA architectures found for major versions [9, 10]."
READY = "The server is fired up and ready to roll!"
SIGS = load_signatures()

PRELUDE = """\
import os, signal, subprocess, sys, time
from pathlib import Path
HERE = Path(__file__).parent
with open(HERE / "launches", "a") as fh:
    fh.write(f"{os.getpid()}\\n")
LAUNCH = len((HERE / "launches").read_text().split())
def spawn_children(n=2):
    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(n)]
    with open(HERE / "children", "a") as fh:
        fh.write("".join(f"{k.pid}\\n" for k in kids))
"""


def recipe() -> Recipe:
    return Recipe(
        id=AR,
        package="sglang",
        title="allreduce fusion",
        why="t",
        versions=SpecifierSet(">=0"),
        arch=(),
        edits=(),
        path=Path("r.toml"),
        sha256="0",
        crash_signatures=("No supported CUDA architectures found for major versions [9, 10]",),
    )


def server(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "server.py"
    script.write_text(PRELUDE + textwrap.dedent(body), encoding="utf-8")
    return [sys.executable, "-u", str(script)]


def pids(tmp_path: Path, name: str) -> list[int]:
    p = tmp_path / name
    return [int(x) for x in p.read_text().split()] if p.exists() else []


def gone(pid: int) -> bool:
    """Exited (a zombie left to a non-reaping init counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in "ZX"


class Run:
    def __init__(self, tmp_path: Path, cmd: list[str], applied: set[str] | None = None, **opts) -> None:
        self.calls: list[tuple[Path, list[str]]] = []
        self.out, self.err = io.StringIO(), io.StringIO()
        self.log_path = tmp_path / "guard.log"
        log = GuardLog(stream=self.err, path=self.log_path)
        options = GuardOptions(command=cmd, target=tmp_path, **{"timeout": 5.0, "grace": 1.0, **opts})
        start = time.monotonic()
        try:
            self.code = run_guard(
                options,
                recipes=[recipe()],
                rollback=self.rollback,
                applied=lambda p: {AR} if applied is None else applied,
                signatures=SIGS,
                out=self.out,
                log=log,
            )
        finally:
            log.close()
        self.seconds = time.monotonic() - start
        self.launches = pids(tmp_path, "launches")

    def rollback(self, target: Path, ids: list[str]) -> list[str]:
        self.calls.append((target, list(ids)))
        return list(ids)

    @property
    def log(self) -> str:
        return self.err.getvalue()


def test_startup_crash_rolls_back_the_implicated_recipe(tmp_path: Path) -> None:
    cmd = server(tmp_path, f"print('loading weights'); print({CRASH!r}); sys.exit(1)\n")
    r = Run(tmp_path, cmd)
    assert r.calls == [(tmp_path, [AR])]
    assert r.code == 1 and len(r.launches) == 1
    assert "loading weights" in r.out.getvalue() and CRASH in r.out.getvalue()
    assert f"rolled back: {AR}" in r.log and "cause: flashinfer-jit-arch-excluded" in r.log
    assert all(line.startswith("[sm120patch guard] ") for line in r.log.splitlines())
    assert "rolled back:" in r.log_path.read_text()
    assert all(gone(p) for p in r.launches)


def test_restart_relaunches_once_after_rollback(tmp_path: Path) -> None:
    body = f"""
    if LAUNCH == 1:
        print({CRASH!r}); sys.exit(1)
    print({READY!r}); time.sleep(0.1); sys.exit(0)
    """
    r = Run(tmp_path, server(tmp_path, body), restart=True)
    assert len(r.launches) == 2 and r.calls == [(tmp_path, [AR])]
    assert r.code == 0
    assert "restarting the server once" in r.log and "server is ready" in r.log


def test_restart_happens_at_most_once(tmp_path: Path) -> None:
    r = Run(tmp_path, server(tmp_path, f"print({CRASH!r}); sys.exit(1)\n"), restart=True)
    assert len(r.launches) == 2 and len(r.calls) == 2 and r.code == 1


def test_no_restart_when_nothing_was_rolled_back(tmp_path: Path) -> None:
    r = Run(tmp_path, server(tmp_path, f"print({CRASH!r}); sys.exit(1)\n"), applied=set(), restart=True)
    assert r.calls == [] and len(r.launches) == 1 and r.code == 1
    assert "not restarting" in r.log


def test_crash_after_ready_is_reported_not_rolled_back(tmp_path: Path) -> None:
    body = f"print({READY!r}); time.sleep(0.2); print({CRASH!r}); sys.exit(3)\n"
    r = Run(tmp_path, server(tmp_path, body), restart=True)
    assert r.code == 3 and r.calls == [] and len(r.launches) == 1
    assert "after it was ready" in r.log and f"sm120patch rollback {tmp_path} --recipe {AR}" in r.log


def test_hang_times_out_and_is_stopped(tmp_path: Path) -> None:
    body = "print('loading'); spawn_children(); time.sleep(60); (HERE / 'slept').touch()\n"
    r = Run(tmp_path, server(tmp_path, body), timeout=0.5)
    assert r.code == 1 and r.calls == []
    assert "not ready after 0.5s" in r.log
    assert all(gone(p) for p in r.launches + pids(tmp_path, "children"))
    assert not (tmp_path / "slept").exists()  # stopped by guard, not by the server's own sleep ending


def test_sigterm_ignored_escalates_to_sigkill(tmp_path: Path) -> None:
    body = "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('stubborn')\n"
    body += "time.sleep(60); (HERE / 'slept').touch()\n"
    r = Run(tmp_path, server(tmp_path, body), timeout=0.5, grace=0.5)
    assert r.code == 1 and "sending SIGKILL" in r.log
    assert all(gone(p) for p in r.launches)
    assert not (tmp_path / "slept").exists()  # killed, not left to finish its sleep


def test_children_of_a_crashed_server_are_not_orphaned(tmp_path: Path) -> None:
    body = f"spawn_children(); print({CRASH!r}); sys.exit(1)\n"
    r = Run(tmp_path, server(tmp_path, body))
    kids = pids(tmp_path, "children")
    assert len(kids) == 2 and all(gone(p) for p in kids)
    assert r.calls == [(tmp_path, [AR])]


def test_exit_code_of_a_signal_killed_server(tmp_path: Path) -> None:
    body = f"print({READY!r}); time.sleep(0.1); os.kill(os.getpid(), signal.SIGKILL)\n"
    r = Run(tmp_path, server(tmp_path, body))
    assert r.code == 128 + signal.SIGKILL and r.calls == []


def test_clean_exit_before_ready_is_zero(tmp_path: Path) -> None:
    r = Run(tmp_path, server(tmp_path, "print('usage: server [--help]'); sys.exit(0)\n"))
    assert r.code == 0 and "exited cleanly before it was ready" in r.log


def test_unnamed_crash_is_reported_with_its_last_error_line(tmp_path: Path) -> None:
    r = Run(tmp_path, server(tmp_path, "print('KeyError: qkv_proj'); sys.exit(7)\n"))
    assert r.code == 7 and r.calls == []
    assert "no known signature names the failure" in r.log and "KeyError: qkv_proj" in r.log


@pytest.fixture
def health_url():
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/health"
    httpd.shutdown()
    httpd.server_close()


def test_ready_url_counts_as_ready(tmp_path: Path, health_url: str) -> None:
    body = f"time.sleep(0.6); print({CRASH!r}); sys.exit(1)\n"
    r = Run(tmp_path, server(tmp_path, body), ready_url=health_url)
    assert f"{health_url} answered" in r.log
    assert r.calls == [] and r.code == 1


def test_ready_url_unreachable_falls_back_to_timeout(tmp_path: Path) -> None:
    r = Run(tmp_path, server(tmp_path, "time.sleep(60)\n"), ready_url="http://127.0.0.1:9/health", timeout=0.6)
    assert r.code == 1 and "not ready after" in r.log


DRIVER = """\
import sys
from pathlib import Path
from sm120patch.triage.guard import GuardOptions, run_guard
from sm120patch.triage.signatures import load_signatures
opts = GuardOptions(command=[sys.executable, "-u", sys.argv[1]], target=Path(sys.argv[2]), timeout=30, grace=15)
sys.exit(run_guard(opts, recipes=[], rollback=lambda t, ids: ids, applied=lambda t: set(),
                   signatures=load_signatures()))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_to_guard_reach_the_whole_group(tmp_path: Path, sig: signal.Signals) -> None:
    cmd = server(tmp_path, f"spawn_children(); print({READY!r}); time.sleep(60)\n")
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER, encoding="utf-8")
    guard = subprocess.Popen(
        [sys.executable, str(driver), cmd[-1], str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # generous: on a loaded 2-core box the driver's start alone can take seconds, and a
        # signal sent before guard installs its handlers would test Python, not guard
        deadline = time.monotonic() + 60
        assert guard.stdout is not None
        seen = False
        while not seen and time.monotonic() < deadline:
            line = guard.stdout.readline()
            seen = READY in line
            if not line and guard.poll() is not None:
                break
        assert seen, "the server never became ready under guard"
        guard.send_signal(sig)
        code = guard.wait(timeout=30)
    finally:
        if guard.poll() is None:
            guard.kill()
            guard.wait()
    err = guard.stderr.read() if guard.stderr else ""
    assert code == 128 + sig, err
    assert f"received {sig.name}" in err
    assert all(gone(p) for p in pids(tmp_path, "launches") + pids(tmp_path, "children"))


def test_cli_guard_rolls_back_through_the_engine_hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Path, list[str]]] = []
    monkeypatch.setattr(
        commands_triage,
        "engine_hooks",
        lambda: (lambda p: {AR}, lambda p, ids: calls.append((p, ids)) or ids),
    )
    monkeypatch.setattr(commands_triage, "load_recipes", lambda directory=None: [recipe()])
    cmd = server(tmp_path, f"print({CRASH!r}); sys.exit(1)\n")
    log = tmp_path / "g.log"
    args = ["guard", "--target", str(tmp_path), "--timeout", "5", "--log", str(log), "--", *cmd]
    res = CliRunner().invoke(SM120PATCH, args)
    assert res.exit_code == 1, res.output
    assert calls == [(tmp_path, [AR])]
    assert "[sm120patch guard] rolled back" in log.read_text()


def test_usage_errors(tmp_path: Path) -> None:
    kw = {"recipes": [], "rollback": lambda t, i: i, "applied": lambda t: set(), "signatures": SIGS}
    with pytest.raises(UserError, match="--ready-pattern"):
        run_guard(GuardOptions(command=["true"], ready_pattern="("), **kw)
    with pytest.raises(UserError, match="--ready-url"):
        run_guard(GuardOptions(command=["true"], ready_url="ftp://x"), **kw)
    with pytest.raises(UserError, match="cannot start the server"):
        run_guard(GuardOptions(command=[str(tmp_path / "no-such-server")]), log=GuardLog(io.StringIO()), **kw)
    res = CliRunner().invoke(SM120PATCH, ["guard", "--ready-pattern", "(", "--", "true"])
    assert res.exit_code == 2


def test_canary_help_names_its_reference() -> None:
    # the canary compares with the server's own first valid answer, not with a fixed known answer
    text = " ".join(CliRunner().invoke(SM120PATCH, ["guard", "--help"], terminal_width=200).output.split())
    assert "compare each answer with the server's own first valid one" in text and "known-answer" not in text


def test_exit_status_convention() -> None:
    assert exit_status(0) == 0 and exit_status(3) == 3 and exit_status(-15) == 143


class BrokenOut(io.StringIO):
    def write(self, s: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_closed_stdout_does_not_stall_the_server(tmp_path: Path) -> None:
    # 2 MB of output would block the server on a full pipe if guard stopped reading.
    body = f"for _ in range(2000): print('x' * 1000)\nprint({READY!r}); sys.exit(0)\n"
    err = io.StringIO()
    opts = GuardOptions(command=server(tmp_path, body), target=tmp_path, timeout=5, grace=1)
    code = run_guard(
        opts,
        recipes=[],
        rollback=lambda t, i: i,
        applied=lambda t: set(),
        signatures=SIGS,
        out=BrokenOut(),
        log=GuardLog(err),
    )
    assert code == 0 and "still watching" in err.getvalue() and "server is ready" in err.getvalue()


def _argv_server(tmp_path: Path) -> list[str]:
    """A server that writes the arguments it was started with, then exits cleanly before ready."""
    return server(tmp_path, "Path(HERE / 'argv').write_text(' '.join(sys.argv[1:]))\nsys.exit(0)\n")


def test_cli_guard_json_before_the_dashes_is_guards_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands_triage, "load_recipes", lambda directory=None: [])
    cmd = _argv_server(tmp_path)
    res = CliRunner().invoke(SM120PATCH, ["guard", "--json", "--timeout", "5", "--", *cmd, "--port", "1"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "argv").read_text() == "--port 1"  # the server ran, not a command named --json
    events = [json.loads(line) for line in res.stderr.splitlines()]
    assert events[-1] == {"event": "exit", "exit_code": 0}
    messages = [e["message"] for e in events if e["event"] == "log"]
    assert messages[0].startswith("launch 1: ") and "exited cleanly before it was ready" in messages[-1]


def test_cli_guard_options_after_the_command_are_the_servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands_triage, "load_recipes", lambda directory=None: [])
    cmd = _argv_server(tmp_path)
    res = CliRunner().invoke(SM120PATCH, ["guard", "--timeout", "5", *cmd, "--json", "--timeout", "9"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "argv").read_text() == "--json --timeout 9"
    assert "[sm120patch guard] launch 1" in res.stderr


def test_cli_guard_unknown_option_is_a_usage_error_not_the_server(tmp_path: Path) -> None:
    res = CliRunner().invoke(SM120PATCH, ["guard", "--jsno", "--", *_argv_server(tmp_path)])
    assert res.exit_code == 2, res.output
    assert "No such option" in res.output and "--jsno" in res.output and "launch 1" not in res.output


def test_cli_guard_shows_control_characters_of_the_log_as_escapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commands_triage, "load_recipes", lambda directory=None: [])
    osc52 = "\x1b]52;c;cm0gLXJmIH4=\x07"
    cmd = server(tmp_path, f"print({('ValueError: broken ' + osc52 + chr(0x9B) + '2J').__repr__()}); sys.exit(1)\n")
    res = CliRunner().invoke(SM120PATCH, ["guard", "--timeout", "5", "--", *cmd])
    assert res.exit_code == 1, res.output
    assert "ValueError: broken \\x1b]52;c;cm0gLXJmIH4=\\x07\\x9b2J" in res.stderr, res.stderr
    assert [c for c in res.stderr if c != "\n" and not c.isprintable()] == []
