"""verify and guard --canary against a fake OpenAI server: a real process over HTTP on 127.0.0.1,
whose speed and answers come from bytes the test recipes write into a fake tree.

The fake's speeds differ 3x and 4x (10 ms a token against 3 or 40 ms), so decisions hold on a loaded
box; the tests assert decisions, tree bytes and which processes are left, never timings.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sm120patch.cli import main
from tests.unit.sglang_fakes import GIT_ENV, snapshot
from tests.unit.verify_fakes import free_port, knob_rel, make_recipes, make_tree, server_command

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="process checks read /proc (Linux)")

REPO = Path(__file__).resolve().parents[2]


class Box:
    """A fake tree, the test catalogue, a free port and the fake server's command."""

    def __init__(self, tmp: Path) -> None:
        self.site = tmp / "site"
        self.pkg = make_tree(self.site)
        self.recipes = make_recipes(tmp / "recipes")
        self.state = tmp / "state"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out = tmp / "report"
        self.start = snapshot(self.site)

    def command(self, *extra: str) -> list[str]:
        return server_command(self.pkg, self.port, self.state, *extra)

    def verify_args(self, *recipes: str, extra: tuple[str, ...] = ()) -> list[str]:
        args = ["verify", str(self.site), "--recipes", str(self.recipes), "--probe", "none", "--arch", "sm_120"]
        for r in recipes:
            args += ["--recipe", r]
        args += ["--concurrency", "4", "--output-len", "20", "--requests", "8", "--warmup", "0", "--grace", "2"]
        args += ["--ready-timeout", "20", "--url", self.url, "--out", str(self.out), *extra, "--json", "--"]
        return args + self.command()

    def launches(self) -> list[str]:
        p = self.state / "launches"
        return p.read_text().splitlines() if p.exists() else []

    def pids(self) -> list[int]:
        return [int(line.split()[0]) for line in self.launches()]

    def knob(self, name: str) -> bytes:
        return (self.pkg / knob_rel(name)).read_bytes()

    def changed(self) -> dict[str, bytes]:
        """Files whose bytes differ from the tree as the test made it."""
        now = snapshot(self.site)
        return {k: v for k, v in now.items() if self.start.get(k) != v} | {k: b"" for k in self.start if k not in now}


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in "ZX"


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Box:
    b = Box(tmp_path)
    for k, v in GIT_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SM120PATCH_RECIPES", str(b.recipes))
    monkeypatch.delenv("SM120PATCH_DEBUG", raising=False)
    return b


@pytest.fixture
def sm(capsys: pytest.CaptureFixture[str]):  # noqa: ANN201
    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as ei:
            main([str(a) for a in args])
        out, err = capsys.readouterr()
        code = ei.value.code
        return (code if isinstance(code, int) else 0), out, err

    return run


def verify(sm: Any, box: Box, *recipes: str, extra: tuple[str, ...] = ()) -> tuple[int, dict[str, Any], str]:
    code, out, err = sm(*box.verify_args(*recipes, extra=extra))
    assert all(gone(p) for p in box.pids()), "a server process outlived verify"
    return code, (json.loads(out) if out.strip() else {}), err


def test_faster_recipe_is_kept(sm: Any, box: Box) -> None:
    code, data, err = verify(sm, box, "fake-fast", extra=("--warmup", "2"))
    assert code == 0, err
    (d,) = data["decisions"]
    assert d["keep"] and d["recipes"] == ["fake-fast"] and d["reasons"] == []
    assert d["answers"]["agree"] == d["answers"]["compared"] > 0 and not d["answers"]["collapses"]
    assert data["final"] == ["fake-fast"]
    assert box.changed() == {f"sglang/{knob_rel('delay')}": b"VALUE = 0.003\n"}
    # A B A: baseline, candidate, baseline, each its own launch of the server
    assert [line.split()[1] for line in box.launches()] == ["delay=0.01", "delay=0.003", "delay=0.01"]
    requests = (box.state / "requests").read_text().splitlines()
    assert requests and not [r for r in requests if r.endswith("early")]  # none before /health said ready
    assert {Path(p).name for p in data["report"].values()} >= {"report.json", "report.md"}
    assert "fake-fast" in (box.out / "report.md").read_text()
    code, out, _ = sm("status", box.site, "--probe", "none")
    assert "verified fake-fast: kept:" in out and "output tok/s at c=4" in out
    code, out, _ = sm("status", box.site, "--probe", "none", "--json")
    assert json.loads(out)["targets"][0]["verify"]["fake-fast"]["kept"] is True


def test_slower_recipe_is_rolled_back(sm: Any, box: Box) -> None:
    code, data, err = verify(sm, box, "fake-slow")
    assert code == 1, err
    (d,) = data["decisions"]
    assert not d["keep"] and any(r.startswith("slower:") for r in d["reasons"])
    assert d["answers"]["agree"] == d["answers"]["compared"]  # slower, not wrong
    assert data["final"] == [] and box.changed() == {}
    code, out, _ = sm("status", box.site, "--probe", "none")
    assert "verified fake-slow: rolled back: slower:" in out


def test_recipe_that_corrupts_answers_is_rolled_back(sm: Any, box: Box) -> None:
    code, data, err = verify(sm, box, "fake-corrupt")
    assert code == 1, err
    (d,) = data["decisions"]
    assert not d["keep"] and d["answers"]["collapses"]
    assert any("collapsed output" in r for r in d["reasons"]) and any("known answers" in r for r in d["reasons"])
    assert data["final"] == [] and box.changed() == {}


def test_late_divergence_is_within_tolerance(sm: Any, box: Box) -> None:
    # the fake's speed does not change here; a loaded box may still move it a few %: the floor keeps
    # this test about answers
    code, data, err = verify(sm, box, "fake-late", extra=("--noise-floor", "0.5", "--min-effect", "0.6"))
    (d,) = data["decisions"]
    assert code == 0 and d["keep"], d["reasons"]
    assert d["answers"]["exact"] == 0 and d["answers"]["agree"] == d["answers"]["compared"]
    assert d["answers"]["by"] == "by characters" and "by characters" in d["summary"]  # no tokens asked for
    assert box.changed() == {f"sglang/{knob_rel('mode')}": b'VALUE = "late"\n'}


def test_with_logprobs_answers_are_compared_by_tokens(sm: Any, box: Box) -> None:
    loose = ("--noise-floor", "0.5", "--min-effect", "0.6", "--logprobs")
    code, data, err = verify(sm, box, "fake-late", extra=loose)
    (d,) = data["decisions"]
    assert code == 0 and d["keep"], d["reasons"]
    assert d["answers"]["by"] == "by tokens" and "answers agree 8/8 by tokens" in d["summary"]
    # the fake streams one token a chunk; "late" changes the last quarter of 20 tokens: from token 15 on
    assert {x["at_token"] for x in d["answers"]["divergences"]} == {15}
    runs = json.loads((box.out / "report.json").read_text())["runs"]
    base_tokens = runs["baseline"][0]["4"]["tokens"]
    assert base_tokens and all(len(t) == 20 for t in base_tokens.values())
    assert data["options"]["logprobs"] is True
    md = (box.out / "report.md").read_text()
    assert "agree 8/8 by tokens" in md and "first differs at token 15 (tokens agree 75%)" in md


def test_the_native_backend_compares_by_output_ids(sm: Any, box: Box) -> None:
    loose = ("--noise-floor", "0.5", "--min-effect", "0.6", "--backend", "sglang")
    code, data, err = verify(sm, box, "fake-late", extra=loose)
    (d,) = data["decisions"]
    assert code == 0 and d["keep"], d["reasons"]
    assert d["answers"]["by"] == "by tokens" and {x["at_token"] for x in d["answers"]["divergences"]} == {15}
    runs = json.loads((box.out / "report.json").read_text())["runs"]
    ids = runs["baseline"][0]["4"]["tokens"]
    assert ids and all(len(t) == 20 and all(isinstance(i, int) for i in t) for t in ids.values())
    assert data["options"]["backend"] == "sglang"


@pytest.mark.parametrize("stream", ["whole", "ids-delta", "delta"])
def test_generate_streams_read_alike_whatever_the_server_sends(box: Box, stream: str) -> None:
    # SGLang's /generate sends the whole text and ids so far (the default), the new ids only
    # (0.5.9 --stream-output), or both new only (0.5.23 incremental streaming): one answer each time
    from sm120patch.verify import workload

    server = subprocess.Popen(box.command("--native-stream", stream), stdout=subprocess.DEVNULL)
    try:
        for _ in range(400):  # up to about 20 s on a loaded box
            if workload.ready(box.url, timeout=1.0) is not None:
                break
            assert server.poll() is None, "the fake server exited"
            time.sleep(0.05)
        else:
            pytest.fail("the fake server did not become ready")
        prompts = workload.load_prompts()[:3]
        oai = workload.run_load(box.url, "fake-model", prompts, 3, 3, 12, logprobs=True)
        native = workload.run_load(box.url, "fake-model", prompts, 3, 3, 12, backend="sglang")
    finally:
        server.terminate()
        server.wait(10)
    for a, b in zip(oai.results, native.results, strict=True):
        assert a.success and b.success, (a.error, b.error)
        assert b.text == a.text and b.output_len == 12 and len(b.tokens or []) == 12
        assert len(b.itl) == 11 and b.ttft > 0  # one gap per token after the first, as bench_serving counts


def test_one_at_a_time_keeps_the_fast_and_drops_the_crashing(sm: Any, box: Box) -> None:
    code, data, err = verify(sm, box, "fake-fast", "fake-crash", extra=("--one-at-a-time",))
    assert code == 1, err
    by = {d["name"]: d for d in data["decisions"]}
    assert by["fake-fast"]["keep"] and not by["fake-crash"]["keep"]
    launch = by["fake-crash"]["launch"]
    assert launch["outcome"] in ("fatal", "crashed") and "fake-crash" in launch["cause"]
    assert any(f["recipe_ids"] == ["fake-crash"] for f in launch["diagnosis"]["findings"])  # diagnose named it
    assert "FakeKernelError" in Path(launch["log"]).read_text()
    assert data["final"] == ["fake-fast"]
    assert box.changed() == {f"sglang/{knob_rel('delay')}": b"VALUE = 0.003\n"}


def test_server_that_never_becomes_ready(sm: Any, box: Box) -> None:
    # the baseline must become ready within the same limit, interpreter start-up included: 8 s, not 2
    code, data, err = verify(sm, box, "fake-hang", extra=("--ready-timeout", "8"))
    assert code == 1, err
    (d,) = data["decisions"]
    assert not d["keep"] and d["launch"]["outcome"] == "not ready"
    assert data["final"] == [] and box.changed() == {}


def test_a_server_that_hangs_after_it_was_ready(sm: Any, box: Box) -> None:
    # the baseline streams a token every 10 ms; 2 s without one is a stall even on a starved box
    code, data, err = verify(sm, box, "fake-stall", extra=("--request-timeout", "2"))
    assert code == 1, err
    (d,) = data["decisions"]
    assert not d["keep"] and d["reasons"][0] == "8 requests failed at c=4 (baseline: 0)"
    assert data["final"] == [] and box.changed() == {}


def test_a_candidate_apply_refuses_is_rolled_back_unlaunched(sm: Any, box: Box) -> None:
    code, data, err = verify(sm, box, "fake-misfit")
    assert code == 1, err
    (d,) = data["decisions"]
    assert not d["keep"] and d["summary"].startswith("not applied: fake-misfit:")
    assert len(box.launches()) == 1 and data["final"] == [] and box.changed() == {}


def test_a_baseline_that_will_not_serve_decides_nothing(sm: Any, box: Box) -> None:
    code, _, err = sm("apply", box.site, "--recipe", "fake-crash", "--probe", "none", "--arch", "sm_120")
    assert code == 0, err
    started = snapshot(box.site)
    code, out, err = sm(*box.verify_args("fake-fast"))
    assert code == 1 and out == ""
    assert "the baseline server" in err and "fake-crash" in err and "the tree is as it was, nothing decided" in err
    assert snapshot(box.site) == started and len(box.launches()) == 1
    assert all(gone(p) for p in box.pids())


def test_busy_port_is_refused_before_anything_changes(sm: Any, box: Box) -> None:
    proc = subprocess.Popen(box.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        for _ in range(200):  # bounded: the fake prints its ready line within a second or two
            if b"ready to roll" in proc.stdout.readline():
                break
        code, out, err = sm(*box.verify_args("fake-fast"))
    finally:
        proc.kill()
        proc.wait()
    assert code == 2 and "something already listens there" in err and "\n" not in err.strip()
    assert box.changed() == {}


def test_ctrl_c_twice_in_the_middle_leaves_the_tree_as_it_started(sm: Any, box: Box) -> None:
    code, _, err = sm("apply", box.site, "--recipe", "fake-fast", "--probe", "none", "--arch", "sm_120")
    assert code == 0, err
    started = snapshot(box.site)
    # the slow candidate comes first (A B1 ...) and its load takes 2 x 200 x 40 ms = 16 s at least:
    # a wide window for the Ctrl-C, however slow the box; it ends the load long before that
    args = box.verify_args("fake-slow", "fake-fast", extra=("--one-at-a-time", "--output-len", "200"))
    args += ["--slow-stop", "0.6"]  # the server takes a while to stop: the second Ctrl-C lands then
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "sm120patch", *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait for the slow candidate's server to take requests
            slow = [int(x.split()[0]) for x in box.launches() if "delay=0.04" in x]
            reqs = (box.state / "requests").read_text().split() if (box.state / "requests").exists() else []
            assert proc.poll() is None, f"verify ended before the candidate ran: {proc.communicate()}"
            if slow and str(slow[0]) in reqs[::2]:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the slow candidate never served")
        assert proc.poll() is None, "verify ended before the Ctrl-C"
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        if proc.poll() is None:  # an impatient second Ctrl-C, while the server stops and the tree goes back
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert snapshot(box.site) == started
    code, out, _ = sm("status", box.site, "--probe", "none", "--json")
    assert [a["id"] for a in json.loads(out)["targets"][0]["applied"]] == ["fake-fast"]
    assert [p for p in box.pids() if not gone(p)] == [], err


def test_canary_catches_a_collapse_and_guard_rolls_back(sm: Any, box: Box) -> None:
    for rid in ("fake-corrupt", "fake-fast"):
        code, _, err = sm("apply", box.site, "--recipe", rid, "--probe", "none", "--arch", "sm_120")
        assert code == 0, err
    args = ["guard", "--target", box.site, "--recipes", box.recipes, "--timeout", "20", "--grace", "2"]
    args += ["--canary", "0.2", "--canary-url", box.url, "--canary-tokens", "40", "--"]
    # the healthy relaunch exits after three canary answers, however long the box takes to send them
    code, out, err = sm(*args, *box.command("--serve-requests", "3"))
    assert code == 0, err
    assert "canary: collapse:" in err and "changes_outputs = 'tactics': fake-corrupt" in err
    assert "relaunching the server without fake-corrupt" in err
    modes = [line.split()[2] for line in box.launches()]
    assert modes == ["mode=collapse", "mode=ok"]
    # the recipe not marked as changing outputs stays
    assert box.changed() == {f"sglang/{knob_rel('delay')}": b"VALUE = 0.003\n"}
    assert all(gone(p) for p in box.pids())


def canary_args(box: Box) -> list[str]:
    args = ["guard", "--target", box.site, "--recipes", box.recipes, "--timeout", "20", "--grace", "2"]
    return [*args, "--canary", "0.2", "--canary-url", box.url, "--canary-tokens", "40", "--"]


def test_canary_takes_the_servers_own_answer_as_its_reference(sm: Any, box: Box) -> None:
    # the model answers "count from 1 to 30" in its own words, with no recipe involved (issue 35.8)
    for rid in ("fake-late", "fake-fast"):
        code, _, err = sm("apply", box.site, "--recipe", rid, "--probe", "none", "--arch", "sm_120")
        assert code == 0, err
    applied = snapshot(box.site)
    code, out, err = sm(*canary_args(box), *box.command("--own-words", "--serve-requests", "4"))
    assert code == 0, err
    assert "canary: answer as expected: reference recorded: ' Sure! Here is the count:" in err
    assert "rolling back" not in err and len(box.launches()) == 1
    assert snapshot(box.site) == applied
    assert all(gone(p) for p in box.pids())


def test_canary_sees_an_answer_change_from_its_reference(sm: Any, box: Box) -> None:
    code, _, err = sm("apply", box.site, "--recipe", "fake-drift", "--probe", "none", "--arch", "sm_120")
    assert code == 0, err
    # two answers as at first, then another one: the canary's reference is the first
    code, out, err = sm(*canary_args(box), *box.command("--serve-requests", "4"))
    assert code == 0, err
    assert "answer changed from the server's own first answer at character 0" in err
    assert "changes_outputs = 'tactics': fake-drift" in err and "relaunching the server without fake-drift" in err
    assert [line.split()[2] for line in box.launches()] == ["mode=drift", "mode=ok"]
    assert box.changed() == {}
    assert all(gone(p) for p in box.pids())


def test_bad_output_that_outlives_every_rollback_puts_the_recipes_back(sm: Any, box: Box) -> None:
    # the server collapses whatever the tree holds: the recipes are not the cause
    for rid in ("fake-retune", "fake-late"):
        code, _, err = sm("apply", box.site, "--recipe", rid, "--probe", "none", "--arch", "sm_120")
        assert code == 0, err
    applied = snapshot(box.site)
    assert box.changed().keys() == {f"sglang/{knob_rel('delay')}", f"sglang/{knob_rel('mode')}"}
    code, out, err = sm(*canary_args(box), *box.command("--mode", "collapse", "--serve-requests", "3"))
    assert code == 0, err
    assert "rolled back: fake-retune" in err and "rolled back: fake-late" in err, err
    assert "outlived the rollback of fake-retune, fake-late: those recipes were not its cause" in err
    assert "applied again: fake-retune, fake-late" in err
    assert "watching only, the server keeps running" in err
    assert len(box.launches()) == 4  # with both, without the tactics, without either, with both again
    assert snapshot(box.site) == applied
    code, out, _ = sm("status", box.site, "--probe", "none", "--json")
    assert sorted(a["id"] for a in json.loads(out)["targets"][0]["applied"]) == ["fake-late", "fake-retune"]
    assert all(gone(p) for p in box.pids())


def test_a_crash_of_verify_itself_puts_the_tree_back(sm: Any, box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    from sm120patch.verify import metrics

    real, calls = metrics.summarize, []

    def summarize(load: Any) -> dict[str, Any]:
        calls.append(load)
        if len(calls) == 2:  # the candidate's load: verify breaks with the candidate applied
            raise RuntimeError("a bug in verify")
        return real(load)

    monkeypatch.setattr(metrics, "summarize", summarize)
    code, out, err = sm(*box.verify_args("fake-fast"))
    assert code == 3 and "internal error: RuntimeError: a bug in verify" in err
    assert len(box.launches()) == 2 and box.changed() == {}
    assert all(gone(p) for p in box.pids())


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((), "no server command; give it after --"),
        (("--recipe", "nope", "--", "true"), "--recipe nope: no such recipe"),
        (("--url", "ftp://x", "--", "true"), "is not an http(s) URL"),
        (("--", "true"), "nothing to verify; apply recipes first"),
        (("--concurrency", "0", "--", "true"), "0 is not in the range"),
        (("--logprobs", "--backend", "sglang", "--", "true"), "--backend sglang has them already"),
        (("--backend", "openai", "--", "true"), "'openai' is not one of"),
    ],
)
def test_bad_usage_is_one_line_and_changes_nothing(sm: Any, box: Box, args: tuple[str, ...], fragment: str) -> None:
    code, out, err = sm("verify", box.site, "--probe", "none", "--arch", "sm_120", *args)
    assert code == 2 and fragment in err and "Traceback" not in err
    assert box.changed() == {} and box.launches() == []


def test_help_does_not_load_the_http_client() -> None:
    code = "import sys\nfrom sm120patch.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
    code += "print(sorted(m for m in sys.modules if m == 'httpx' or m.startswith('sm120patch.verify.')))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"


def test_an_arm_that_cannot_be_built_leaves_a_recipe_applied_at_start_as_it_was(
    sm: Any, box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fake-slow was applied when verify started; its arm is refused (as a probe that now blocks it
    # would refuse it): it is not judged, and it is applied again at the end, not rolled back
    for rid in ("fake-slow", "fake-corrupt"):
        code, _, err = sm("apply", box.site, "--recipe", rid, "--probe", "none", "--arch", "sm_120")
        assert code == 0, err
    from sm120patch.verify.tree import Switch, Tree

    real, refused = Tree.switch_to, []

    def switch_to(self: Tree, wanted: set[str]) -> Switch:
        if wanted == {"fake-slow"} and not refused:  # its arm; the end state asks for it again
            refused.append(wanted)
            done = real(self, wanted - {"fake-slow"})
            done.refused["fake-slow"] = "blocked: the probe says no (test)"
            return done
        return real(self, wanted)

    monkeypatch.setattr(Tree, "switch_to", switch_to)
    code, data, err = verify(sm, box, "fake-slow", "fake-corrupt", extra=("--one-at-a-time",))
    assert code == 1, err
    by = {d["name"]: d for d in data["decisions"]}
    assert by["fake-slow"]["verdict"] == "left as it was" and "not applied" not in by["fake-slow"]["summary"]
    assert by["fake-slow"]["summary"].startswith("not judged: the arm could not be built (fake-slow: blocked:")
    assert by["fake-corrupt"]["verdict"] == "rolled back"
    assert data["final"] == ["fake-slow"]
    assert box.changed() == {f"sglang/{knob_rel('delay')}": b"VALUE = 0.04\n"}  # fake-corrupt's mode knob back


def test_together_first_then_the_culprit_by_splitting(sm: Any, box: Box) -> None:
    # three arms judged together (the default): the collapse breaks the rule; halving finds it
    # ([fake-corrupt] | [fake-fast, fake-noop]) and the half it cleared is the kept set, measured
    # together already: A, all, A, corrupt, A, fast+noop, A = 7 launches (one at a time: 7 too; 1 + 2 x 3)
    extra = ("--noise-floor", "0.5", "--min-effect", "0.6")  # about answers and launches, not the box's noise
    code, data, err = verify(sm, box, "fake-corrupt", "fake-fast", "fake-noop", extra=extra)
    assert code == 1, err
    by = {d["name"]: d for d in data["decisions"]}
    assert set(by) == {"fake-corrupt", "fake-fast", "fake-noop"}
    assert by["fake-corrupt"]["verdict"] == "rolled back" and "collapsed output" in by["fake-corrupt"]["summary"]
    assert by["fake-fast"]["keep"] and by["fake-noop"]["keep"]
    assert "confirmed with fake-fast, fake-noop" in by["fake-fast"]["summary"]
    assert [x["arm"] for x in data["launches"]] == [
        "baseline", "all", "baseline", "fake-corrupt", "baseline", "fake-fast+fake-noop", "baseline",
    ]  # fmt: skip
    assert "looking for the culprit(s) by splitting the set" in err
    assert data["final"] == ["fake-fast", "fake-noop"]
    assert box.changed() == {
        f"sglang/{knob_rel('delay')}": b"VALUE = 0.003\n",
        f"sglang/{knob_rel('note')}": b'VALUE = "x"\n',
    }


def test_a_crashing_set_costs_one_launch_as_the_launch_model_says(sm: Any, box: Box) -> None:
    # the server's own launch log is the oracle: together crashes (1 launch, nothing to bracket),
    # [fake-crash] crashes (1), [fake-fast, fake-noop] serves (2) and is the kept set already: 1 + 1 + 1 + 2
    from sm120patch.verify import groups

    extra = ("--noise-floor", "0.5", "--min-effect", "0.6")
    code, data, err = verify(sm, box, "fake-crash", "fake-fast", "fake-noop", extra=extra)
    assert code == 1, err
    assert data["arms"]["all"] == ["fake-crash", "fake-fast", "fake-noop"]
    assert len(box.launches()) == len(data["launches"]) == 5
    assert groups.launches(3, {0}, crashing={0}) == 5 and groups.launches(3, {0}) == 7
    assert groups.launches(3, {0}, repeats=2, crashing={0}) == 1 + 1 + 1 + 4
    assert data["final"] == ["fake-fast", "fake-noop"]


def test_together_and_fine_is_three_launches(sm: Any, box: Box) -> None:
    code, data, err = verify(sm, box, "fake-fast", "fake-noop", extra=("--noise-floor", "0.5", "--min-effect", "0.6"))
    assert code == 0, err
    (d,) = data["decisions"]
    assert d["name"] == "all" and d["recipes"] == ["fake-fast", "fake-noop"] and d["verdict"] == "kept"
    assert [x["arm"] for x in data["launches"]] == ["baseline", "all", "baseline"]


def test_ctrl_c_during_the_search_leaves_the_tree_as_it_started(sm: Any, box: Box) -> None:
    for rid in ("fake-fast", "fake-noop"):
        code, _, err = sm("apply", box.site, "--recipe", rid, "--probe", "none", "--arch", "sm_120")
        assert code == 0, err
    started = snapshot(box.site)
    # together (delay 0.003, collapse) breaks the rule; the search's first half is [fake-corrupt]
    # alone (delay 0.01, collapse): the Ctrl-C lands while it serves (2 x 200 tokens x 10 ms a load)
    args = box.verify_args("fake-corrupt", "fake-fast", "fake-noop", extra=("--output-len", "200"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sm120patch", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        for _ in range(2400):  # bounded: 120 s at 50 ms
            assert proc.poll() is None, f"verify ended before the search: {proc.communicate()}"
            half = [x.split()[0] for x in box.launches() if "delay=0.01 mode=collapse" in x]
            reqs = (box.state / "requests").read_text().split() if (box.state / "requests").exists() else []
            if half and half[0] in reqs[::2]:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the search never launched its first half")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "looking for the culprit(s) by splitting the set" in err
    assert snapshot(box.site) == started
    assert [p for p in box.pids() if not gone(p)] == [], err


def test_apply_of_a_recipe_that_conflicts_with_an_applied_one_fails(sm: Any, box: Box) -> None:
    # fake-fast and fake-slow change the same knob file: with one applied, the other cannot be
    flags = ("--probe", "none", "--arch", "sm_120", "--no-diff")
    code, out, err = sm("apply", box.site, "--recipe", "fake-fast", *flags)
    assert code == 0, err
    applied = snapshot(box.site)
    code, out, err = sm("apply", box.site, "--recipe", "fake-slow", *flags)
    assert code == 1, out + err
    line = next(x for x in out.splitlines() if "fake-slow" in x)
    assert line.split()[0] == "failed"
    assert "conflicts with fake-fast, which changed sglang/srt/verify_knobs/delay.py" in line
    assert "sm120patch rollback" in line and "--recipe fake-fast" in line
    assert snapshot(box.site) == applied  # nothing of it written
    # a recipe that fits no release is not a conflict, whatever else is applied
    code, out, err = sm("apply", box.site, "--recipe", "fake-misfit", *flags)
    assert code == 0 and "fake-misfit.diff does not apply to this release" in out
    # both named in one run on the release's bytes: the first is written, the second fails
    code, _, err = sm("rollback", box.site)
    assert code == 0, err
    code, out, err = sm("apply", box.site, "--recipe", "fake-fast", "--recipe", "fake-slow", *flags)
    assert code == 1 and box.changed() == {f"sglang/{knob_rel('delay')}": b"VALUE = 0.003\n"}
    assert "conflicts with fake-fast" in next(x for x in out.splitlines() if "fake-slow" in x)
    # not named: apply everything that fits; the one left out says why, and it is no failure
    code, _, err = sm("rollback", box.site)
    assert code == 0, err
    code, out, err = sm("apply", box.site, *flags)
    assert code == 0, out + err
    line = next(x for x in out.splitlines() if "fake-slow" in x)
    assert line.split()[0] == "not-applicable" and "conflicts with fake-fast" in line


def test_a_recipe_whose_taken_line_never_appears_is_not_exercised_and_kept(sm: Any, box: Box) -> None:
    code, data, err = verify(sm, box, "fake-unreached")
    assert code == 0, err
    (d,) = data["decisions"]
    assert d["verdict"] == "not exercised by this workload" and d["keep"], d
    assert d["not_exercised"] == ["fake-unreached"] and d["taken"] == []
    assert data["not_exercised"] == ["fake-unreached"] and data["taken"] == []
    assert data["final"] == ["fake-unreached"]  # kept as it is, not rolled back
    patched = box.changed()["sglang/srt/verify_gates/unreached.py"].decode()
    assert '_sm120patch_taken("fake-unreached", True)' in patched
    logs = sorted(box.out.glob("launch-*-fake-unreached.log"))
    assert logs and not any("sm120patch: fake-unreached taken" in p.read_text() for p in logs)


def test_a_recipe_the_workload_reaches_logs_its_taken_line_once_and_is_judged(sm: Any, box: Box) -> None:
    code, data, err = verify(sm, box, "fake-reached", "fake-unreached", extra=("--one-at-a-time",))
    by = {d["name"]: d for d in data["decisions"]}
    assert by["fake-reached"]["taken"] == ["fake-reached"] and by["fake-reached"]["not_exercised"] == []
    assert by["fake-reached"]["verdict"] != "not exercised by this workload"
    assert by["fake-unreached"]["verdict"] == "not exercised by this workload"
    assert data["taken"] == ["fake-reached"] and data["not_exercised"] == ["fake-unreached"]
    (log,) = box.out.glob("launch-*-fake-reached.log")
    assert log.read_text().count("sm120patch: fake-reached taken") == 1  # two calls, one line
    assert code == (0 if by["fake-reached"]["verdict"] == "kept" else 1), err
