"""verify against servers that answer badly (issue 35, item 2; issue 36, item 5).

A fake OpenAI server (tests/unit/fake_openai_server.py) that lists a model at /v1/models but
whose completions are broken: chunks that are not JSON, a stream that stops after one token, a
stream of blank lines and SSE comments that never sends a token, a stream without end; one that
starts a worker in a session of its own; and a port where another kind of server already listens.
Each case: verify's exit status, the tree's bytes, which processes are left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.conftest import count
from tests.unit.sglang_fakes import GIT_ENV, snapshot
from tests.unit.test_verify import REPO, Box, gone
from tests.unit.verify_fakes import release_port

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="process checks read /proc (Linux)")


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Box:
    b = Box(tmp_path)
    for k, v in GIT_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SM120PATCH_RECIPES", str(b.recipes))
    return b


def verify_proc(box: Box, args: list[str], timeout: float = 240) -> tuple[int, Any, str]:
    """verify as a user runs it, in its own process, with a bound on how long it may take (a
    hang fails the test instead of hanging it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SM120PATCH_DEBUG", None)
    cmd = [sys.executable, "-m", "sm120patch", *args]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"verify did not end within {timeout}s: {e.stderr!r}")
    count("verify_hostile_cases")
    data = json.loads(r.stdout) if r.stdout.strip() else None
    return r.returncode, data, r.stderr


def server_args(box: Box, *recipes: str, extra: tuple[str, ...] = (), server: tuple[str, ...] = ()) -> list[str]:
    return box.verify_args(*recipes, extra=extra) + list(server)


def apply(box: Box, rid: str) -> None:
    from sm120patch.cli import main

    with pytest.raises(SystemExit) as ei:
        main(["apply", str(box.site), "--recipe", rid, "--probe", "none", "--arch", "sm_120"])
    assert ei.value.code in (0, None)


@pytest.mark.parametrize(
    ("wire", "extra", "error"),
    [
        ("badjson", (), "JSONDecodeError"),
        ("stall", ("--request-timeout", "1"), "no data from the server for 1s"),
        ("blank", ("--request-timeout", "1"), "no data from the server for 1s"),
        ("endless", ("--load-timeout", "3"), "ran past its deadline"),
    ],
)
def test_a_baseline_without_valid_answers_would_not_serve(
    box: Box, wire: str, extra: tuple[str, ...], error: str
) -> None:
    apply(box, "fake-fast")
    started = snapshot(box.site)
    code, data, err = verify_proc(box, server_args(box, "fake-fast", extra=extra, server=("--wire", wire)))
    assert code == 1 and data is None, err
    assert "the baseline server would not serve: only 0 of 8 requests at c=4 gave a valid answer" in err, err
    assert error in err and "the tree is as it was, nothing decided" in err
    assert snapshot(box.site) == started and len(box.launches()) == 1
    assert all(gone(p) for p in box.pids())


def test_a_candidate_without_valid_answers_is_rolled_back_with_the_reason(box: Box) -> None:
    code, data, err = verify_proc(box, server_args(box, "fake-badjson"))
    assert code == 1, err
    (d,) = data["decisions"]
    assert not d["keep"] and "not enough valid answers: 0 of 8 at c=4 (first error: JSONDecodeError" in d["summary"]
    assert "no answers to compare" in d["summary"]
    assert data["final"] == [] and box.changed() == {}


def test_workers_started_in_a_session_of_their_own_are_stopped_and_named(box: Box) -> None:
    code, data, err = verify_proc(box, server_args(box, "fake-fast", server=("--spawn-daemon",)))
    assert code == 0, err
    daemons = [int(x) for x in (box.state / "daemons").read_text().split()]
    assert len(daemons) == 3  # one a launch: A B A
    deadline = time.monotonic() + 10  # SIGTERM was sent and waited for; a zombie may need its reaper
    while not all(gone(p) for p in daemons) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(p) for p in daemons), "a setsid worker outlived verify"
    named = {p["pid"] for x in data["leftovers"] for p in x["processes"]}
    assert set(daemons) <= named and all(x["survived"] == [] for x in data["leftovers"])
    assert "outlived its group" in err
    assert all(gone(p) for p in box.pids())


def test_another_kind_of_server_on_the_port_is_refused_before_launching(box: Box) -> None:
    # python -m http.server: it answers GET /v1/models with 404, not a model list
    release_port(box.port)
    http = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(box.port), "--bind", "127.0.0.1"],
        cwd=box.site,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        from sm120patch.verify.workload import listening

        for _ in range(600):  # bounded: http.server listens within a second or two
            if listening(box.url) is not None or http.poll() is not None:
                break
            time.sleep(0.1)
        assert listening(box.url) is not None, "http.server did not start"
        code, data, err = verify_proc(box, server_args(box, "fake-fast"))
    finally:
        http.kill()
        http.wait()
    assert code == 2 and data is None, err
    assert "something already listens there" in err and "HTTP 404" in err and len(err.strip().splitlines()) == 1
    assert box.launches() == [] and box.changed() == {}
