"""The run rung on CPU: the rank driver, the verdicts it leads to, and the record it leaves.

Three layers, cheapest first: verdicts judged from plain data (no process); the driver with a
torch-free fake check under this interpreter (exits, noise on stdout, a hang that must take the
rank's own children with it, a SIGTERM to the probe); and the whole rung through `check_run` and
`probe_kernel` with a fake kernel that "all-reduces" over gloo in two CPU processes of the spec
venv's torch (right numbers, garbage, NaN, a rank killed in the kernel, a hang, too few GPUs).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sm120patch.arch import parse_arch
from sm120patch.catalogue.kernels import RUN_CHECKS, load_kernels
from sm120patch.probes import ProbeCache, probe_kernel
from sm120patch.probes.environment.flashinfer import FlashInferEnv, from_tree
from sm120patch.probes.run import ranks
from sm120patch.probes.run import rung as run_mod
from sm120patch.probes.run.ranks import Child, Run
from sm120patch.probes.run.rung import CHECKS, CHECKS_ENV, check_run
from sm120patch.probes.run.verdict import judge_prepare, judge_ranks
from tests.integration.fi_releases import spec_venv
from tests.unit.fi_fakes import make_tree

SM90, SM120 = parse_arch("sm_90"), parse_arch("sm_120")
FAKES = Path(__file__).resolve().parent / "run_fakes"
PLAIN = FAKES / "plain.py"
AR = CHECKS["allreduce_fusion"]
MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie still answers kill(0): it is dead if /proc says so
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def _wait_for(path: Path, limit: float = 120.0) -> str:
    """Wait for a file a child writes when it is where the test wants it (a bound, not a timing claim)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if path.is_file() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


# ---------------------------------------------------------------- verdicts from plain data


def _prep(devices: list[tuple[int, int]], name: str = "NVIDIA H200") -> Run:
    found = [{"index": i, "name": name, "capability": list(c)} for i, c in enumerate(devices)]
    matching = [d["index"] for d in found if d["capability"] == [9, 0]]
    return Run([Child("prepare", "build", result={"devices": found, "matching": matching, "build_s": 1.0})], 1.0)


def _case(name: str, ok: bool = True, err: float = 0.01) -> dict:
    return {
        "name": name,
        "ok": ok,
        "numel": 64,
        "n_bad": 0 if ok else 64,
        "n_nonfinite": 0,
        "max_abs_err": err,
        "atol": 0.05,
        "rtol": 0.02,
        "shape": [16, 4096],
        "dtype": "bfloat16",
        "mode": "oneshot",
    }


def _ranks(*children: Child, timed_out: bool = False) -> Run:
    return Run(list(children), 5.0, timed_out)


def test_verdict_names_what_ran_and_the_error() -> None:
    cases = [_case("oneshot-16 norm_out", err=0.04), _case("twoshot-1024 norm_out", err=0.07)]
    run = _ranks(
        *(
            Child(
                f"rank {r}",
                "teardown",
                result={"api": "trtllm_allreduce_fusion", "cases": cases},
                returncode=0,
                ended_s=4.0,
            )
            for r in range(2)
        )
    )
    step = judge_ranks(AR, SM90, _prep([(9, 0), (9, 0)]), run)
    assert step.result == "pass", step.reason
    assert "2x NVIDIA H200 (sm_90)" in step.reason and "max abs error 0.07" in step.reason
    assert "0.05+0.02|ref|" in step.reason and "16x4096" in step.reason
    rec = step.evidence["run"]
    assert rec["world_size"] == 2 and [g["index"] for g in rec["gpus"]] == [0, 1]
    assert len(rec["cases"]) == 4 and {c["rank"] for c in rec["cases"]} == {0, 1}
    assert rec["dtypes"] == ["bfloat16"] and rec["elapsed_s"] == 6.0


def test_a_mismatch_is_a_fail_that_says_where() -> None:
    good = [_case("a"), _case("b")]
    bad = [_case("a"), {**_case("b", ok=False, err=9.0), "n_nonfinite": 3}]
    run = _ranks(
        Child("rank 0", result={"cases": good}, returncode=0, ended_s=1.0),
        Child("rank 1", result={"cases": bad}, returncode=0, ended_s=1.0),
    )
    step = judge_ranks(AR, SM90, _prep([(9, 0), (9, 0)]), run)
    assert step.result == "fail"
    assert "wrong numbers in 1 of 4 checks" in step.reason
    assert "b rank 1: 64 of 64 elements off, 3 not finite, max abs error 9" in step.reason


def test_the_first_rank_to_fail_is_blamed_not_the_peer_we_killed() -> None:
    died = Child(
        "rank 1", "kernel", {"case": "oneshot-16"}, returncode=-9, stderr_tail="illegal instruction", ended_s=2.0
    )
    waiting = Child(
        "rank 0", "compare", {"case": "oneshot-16"}, returncode=-9, killed="rank 1 failed 20 s earlier", ended_s=22.0
    )
    step = judge_ranks(AR, SM90, _prep([(9, 0), (9, 0)]), _ranks(waiting, died))
    assert step.result == "fail"
    assert "rank 1 died on SIGKILL (kernel phase, case oneshot-16): illegal instruction" in step.reason
    assert step.evidence["run"]["ranks"][0]["killed"].startswith("rank 1 failed")


def test_a_signal_death_outranks_the_peer_that_raised_a_moment_before_it() -> None:
    """The peer of a killed rank raises as its socket closes; our threads may stamp that first."""
    raised = Child(
        "rank 0",
        "kernel",
        error={"error": "RuntimeError: Connection closed by peer"},
        returncode=1,
        ended_s=2.1,
        error_s=2.0,
    )
    died = Child("rank 1", "kernel", {"case": "c"}, returncode=-9, ended_s=2.05)
    assert _ranks(raised, died).first_failure() is died
    later = dataclasses.replace(died, ended_s=2.0 + ranks.SIGNAL_FIRST_S + 0.5)  # too late to be the cause
    assert _ranks(raised, later).first_failure() is raised
    exited = dataclasses.replace(died, returncode=3)  # an exit, not a signal: the first to fail is blamed
    assert _ranks(raised, exited).first_failure() is raised


@pytest.mark.parametrize(("phase", "result"), [("kernel", "fail"), ("setup", "unknown"), ("workspace", "unknown")])
def test_a_hang_is_a_fail_only_inside_the_kernel(phase: str, result: str) -> None:
    stuck = [Child(f"rank {r}", phase, returncode=-9, killed="no answer within 30 s", ended_s=30.0) for r in range(2)]
    step = judge_ranks(AR, SM90, _prep([(9, 0), (9, 0)]), _ranks(*stuck, timed_out=True))
    assert step.result == result and "no answer within" in step.reason and f"{phase} phase" in step.reason


def test_errors_before_the_kernel_are_unknown() -> None:
    err = Child("rank 0", "setup", error={"error": "DistBackendError: NCCL error"}, returncode=1, ended_s=1.0)
    step = judge_ranks(AR, SM90, _prep([(9, 0), (9, 0)]), _ranks(err, Child("rank 1", returncode=0, result={})))
    assert step.result == "unknown" and "rank 0 raised (setup phase): DistBackendError" in step.reason


def test_ranks_that_compared_nothing_prove_nothing() -> None:
    run = _ranks(
        Child("rank 0", result={"cases": [_case("a")]}, returncode=0, ended_s=1.0),
        Child("rank 1", result={"cases": []}, returncode=0, ended_s=1.0),
    )
    assert judge_ranks(AR, SM90, _prep([(9, 0), (9, 0)]), run).result == "unknown"


@pytest.mark.parametrize(
    ("devices", "words"),
    [
        ([], ["needs 2 GPU(s) of sm_90", "torch sees no CUDA GPU"]),
        ([(9, 0)], ["visible: 1x NVIDIA H200 (9.0)"]),
        ([(12, 0), (12, 0)], ["compute capability 9.0", "visible: 2x NVIDIA H200 (12.0)"]),
    ],
)
def test_too_few_gpus_of_the_arch_is_unknown(devices: list[tuple[int, int]], words: list[str]) -> None:
    step = judge_prepare(AR, SM90, _prep(devices), 60.0)
    assert step is not None and step.result == "unknown"
    assert all(w in step.reason for w in words), step.reason


def test_prepare_failures() -> None:
    def one(child: Child, timed_out: bool = False):
        return judge_prepare(AR, SM120, Run([child], 1.0, timed_out), 60.0)

    noarch = {"error": "RuntimeError: No supported CUDA architectures found for major versions [9, 10]."}
    step = one(Child("prepare", "build", error=noarch, returncode=1, ended_s=1.0))
    assert step is not None and step.result == "fail" and "building for sm_120" in step.reason
    step = one(Child("prepare", "build", error={"error": "nvcc: out of memory"}, returncode=1, ended_s=1.0))
    assert step is not None and step.result == "unknown" and "could not prepare (build phase" in step.reason
    step = one(Child("prepare", "build", killed="no answer", returncode=-9), timed_out=True)
    assert step is not None and step.result == "unknown" and "did not finish within 60 s" in step.reason
    assert judge_prepare(AR, SM90, _prep([(9, 0), (9, 0)]), 60.0) is None


def test_every_catalogue_run_value_has_a_check() -> None:
    assert set(RUN_CHECKS) - {""} == set(CHECKS)
    assert all((run_mod.CHECKS_DIR / c.file).is_file() for c in CHECKS.values())
    k = load_kernels()
    assert k["flashinfer:trtllm_comm"].run == "allreduce_fusion" and CHECKS["allreduce_fusion"].world_size == 2
    for moe in ("cutlass_fused_moe_sm120", "cutlass_fused_moe_sm90", "cutlass_fused_moe_sm100"):
        assert k[f"flashinfer:{moe}"].run == "fused_moe"
    assert k["flashinfer:cutlass_fused_moe_sm90"].absent_on(SM120)


def test_child_environment_always_forbids_multicast() -> None:
    env = ranks.child_environment({"NCCL_NVLS_ENABLE": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0", "KEEP": "x"})
    assert {k: env[k] for k in MULTICAST} == MULTICAST
    assert env["KEEP"] == "x" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_run_workspace_is_per_flashinfer_and_arch(tmp_path: Path) -> None:
    """One JIT build per FlashInfer (version, place, interpreter) and arch, found again next time."""
    kernel = load_kernels()["flashinfer:trtllm_comm"]
    a = FlashInferEnv(Path("/site-a/flashinfer"), "0.6.1", python="/venv/bin/python")
    b = FlashInferEnv(Path("/site-b/flashinfer"), "0.6.1", python="/venv/bin/python")
    first = run_mod.workspace(kernel, SM90, a, tmp_path)
    assert first.is_dir() and run_mod.workspace(kernel, SM90, a, tmp_path) == first
    others = {run_mod.workspace(kernel, SM90, b, tmp_path), run_mod.workspace(kernel, SM120, a, tmp_path)}
    assert len({first, *others}) == 3


# ---------------------------------------------------------------- the driver, torch-free


def _plain(mode: str, tmp_path: Path, timeout: float = 60.0, grace: float = 20.0) -> Run:
    env = {**os.environ, "PLAIN_RUN": mode, "PLAIN_PIDFILE": str(tmp_path / "pids")}
    return ranks.run_ranks(sys.executable, PLAIN, {"devices": [0, 1]}, 2, env, timeout, grace)


def test_ranks_finish_and_see_no_multicast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    run = _plain("stdout-noise", tmp_path)
    assert not run.timed_out and [c.how for c in run.children] == ["finished", "finished"]
    assert all(
        c.result and c.result["env"] == {"NCCL_NVLS_ENABLE": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        for c in run.children
    )


def test_a_rank_that_exits_without_a_word(tmp_path: Path) -> None:
    run = _plain("exit", tmp_path)
    bad = run.first_failure()
    assert bad is not None and bad.name == "rank 0" and bad.how == "exited 3 without a result"
    assert (bad.phase, bad.info) == ("kernel", {"case": "plain"})
    assert run.children[1].how == "finished"  # its peer was not waiting on it: it finished by itself


def test_timeout_kills_a_hung_rank_and_what_it_started(tmp_path: Path) -> None:
    run = _plain("hang", tmp_path, timeout=15.0)
    rank_pid, grandchild = (int(x) for x in (tmp_path / "pids").read_text().split())
    assert run.timed_out
    hung = run.children[1]
    assert hung.killed.startswith("no answer within 15 s") and hung.phase == "kernel"
    assert _gone(rank_pid) and _gone(grandchild)


def test_sigterm_to_the_probe_takes_its_ranks_down(tmp_path: Path) -> None:
    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from sm120patch.probes.run import ranks\n"
        f"env = {{**os.environ, 'PLAIN_RUN': 'hang', 'PLAIN_PIDFILE': {str(tmp_path / 'pids')!r}}}\n"
        f"ranks.run_ranks(sys.executable, Path({str(PLAIN)!r}), {{'devices': [0, 1]}}, 2, env, 600.0,\n"
        f"                scratch=Path({str(tmp_path / 'scratch')!r}))\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    probe = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": root})
    try:
        rank_pid, grandchild = (int(x) for x in _wait_for(tmp_path / "pids").split())
        probe.send_signal(signal.SIGTERM)
        assert probe.wait(timeout=60) == -signal.SIGTERM
    finally:
        probe.kill()
    end = time.monotonic() + 30
    while time.monotonic() < end and not (_gone(rank_pid) and _gone(grandchild)):
        time.sleep(0.05)
    assert _gone(rank_pid) and _gone(grandchild)
    # the killed probe could not remove its rendezvous folder; the next run in that workspace does
    left = sorted(p.name for p in (tmp_path / "scratch").iterdir())
    assert left and all(n.startswith(f"ranks-{probe.pid}-") for n in left)
    env = {**os.environ, "PLAIN_RUN": "stdout-noise", "PLAIN_PIDFILE": str(tmp_path / "pids2")}
    run = ranks.run_ranks(sys.executable, PLAIN, {"devices": [0, 1]}, 2, env, 60.0, scratch=tmp_path / "scratch")
    assert [c.how for c in run.children] == ["finished", "finished"]
    assert list((tmp_path / "scratch").iterdir()) == []


# ---------------------------------------------------------------- the whole rung: gloo on CPU


@pytest.fixture(scope="module")
def target() -> str:
    """The spec venv's python: CPU torch with gloo, the 'server interpreter' the checks run under."""
    return str(spec_venv())


@pytest.fixture
def fake(tmp_path: Path, target: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(CHECKS_ENV, str(FAKES))
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "fi-home"))
    fi = from_tree(make_tree(tmp_path / "tree", gate="[9, 10, 12]"), python=target)
    kernel = load_kernels()["flashinfer:trtllm_comm"]

    def run(mode: str, gpus: str = "9.0,9.0", timeout: float | None = None):
        monkeypatch.setenv("FAKE_RUN", mode)
        monkeypatch.setenv("FAKE_GPUS", gpus)
        return check_run(kernel, SM90, fi, tmp_path / "cache", timeout=timeout)

    return run


@pytest.mark.network
def test_gloo_right_numbers_pass_and_the_record_says_what_ran(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # the driver must override what the caller had
    step = fake("ok")
    assert step.result == "pass", step.reason
    assert "fake_allreduce_fusion on 2x Fake GPU (sm_90)" in step.reason and CHECKS_ENV in step.reason
    rec = step.evidence["run"]
    assert rec["world_size"] == 2 and rec["kernel"] == "flashinfer:trtllm_comm"
    assert rec["check_file"] == str(FAKES / "allreduce_fusion.py") and len(rec["check_sha256"]) == 64
    assert {c["rank"] for c in rec["cases"]} == {0, 1} and all(c["max_abs_err"] < 1e-3 for c in rec["cases"])
    assert [r["how"] for r in rec["ranks"]] == ["finished", "finished"]


@pytest.mark.network
def test_gloo_ranks_run_with_multicast_off(tmp_path: Path, target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0")
    monkeypatch.setenv("FAKE_RUN", "ok")
    args = {"devices": [0, 1], "capability": [9, 0]}
    run = ranks.run_ranks(target, FAKES / "allreduce_fusion.py", args, 2, dict(os.environ), 120.0)
    assert [c.how for c in run.children] == ["finished", "finished"], [c.to_dict() for c in run.children]
    assert all(c.result and c.result["env"] == MULTICAST for c in run.children)
    assert len({c.result["pid"] for c in run.children if c.result}) == 2  # one process per rank


@pytest.mark.network
@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("garbage", ["wrong numbers in 2 of 4 checks", "rank 1: 256 of 256 elements off"]),
        ("nan", ["rank 0: 256 of 256 elements off, 256 not finite"]),
        ("raise", ["rank 0 raised (kernel phase, case fake-4x64)", "cluster misconfiguration"]),
        ("die", ["rank 1 died on SIGKILL (kernel phase, case fake-4x64)", "illegal instruction in the fused kernel"]),
    ],
)
def test_gloo_broken_kernels_fail_with_the_reason(fake, mode: str, words: list[str]) -> None:
    step = fake(mode)
    assert step.result == "fail", step.reason
    assert all(w in step.reason for w in words), step.reason


@pytest.mark.network
def test_gloo_a_hung_rank_is_killed_and_fails(fake) -> None:
    step = fake("hang", timeout=45.0)
    assert step.result == "fail", step.reason
    assert "no answer within" in step.reason and "rank 1 in the kernel phase, case fake-4x64" in step.reason
    assert all(r["killed"] for r in step.evidence["run"]["ranks"])


@pytest.mark.network
def test_gloo_setup_errors_and_missing_gpus_are_unknown(fake) -> None:
    step = fake("setup")
    assert step.result == "unknown" and "rank 1 raised (workspace phase): OSError" in step.reason
    step = fake("ok", gpus="9.0,12.0")
    assert step.result == "unknown" and "needs 2 GPU(s) of sm_90" in step.reason
    assert "ranks" not in step.evidence["run"]  # no rank was started for one GPU
    step = fake("noarch")
    assert step.result == "fail" and "No supported CUDA architectures" in step.reason


@pytest.mark.network
def test_run_verdicts_are_cached_with_their_record_and_keyed_by_the_check(
    tmp_path: Path, target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CHECKS_ENV, str(FAKES))
    monkeypatch.setenv("FAKE_RUN", "garbage")
    monkeypatch.setenv("FAKE_GPUS", "9.0,9.0")
    fi = from_tree(make_tree(tmp_path / "tree", gate="[9, 10, 12]"), python=target)
    cache = ProbeCache(tmp_path / "probes")
    cold = probe_kernel("flashinfer:trtllm_comm", SM90, fi, "run", cache)
    assert (cold.result, cold.rung) == ("fail", "run") and not cold.cached
    assert cold.evidence["run"]["world_size"] == 2

    def no_ranks(*a: object, **k: object) -> None:
        raise AssertionError("a cached run verdict started ranks")

    with monkeypatch.context() as m:
        m.setattr(ranks, "run_ranks", no_ranks)
        m.setattr(ranks, "prepare", no_ranks)
        warm = probe_kernel("flashinfer:trtllm_comm", SM90, fi, "run", cache)
    assert warm.cached and warm.reason == cold.reason
    assert json.dumps(warm.evidence["run"], sort_keys=True) == json.dumps(cold.evidence["run"], sort_keys=True)
    other = tmp_path / "other-checks"
    other.mkdir()
    (other / "allreduce_fusion.py").write_text((FAKES / "allreduce_fusion.py").read_text() + "\n# changed\n")
    monkeypatch.setenv(CHECKS_ENV, str(other))
    monkeypatch.setenv("FAKE_RUN", "ok")
    again = probe_kernel("flashinfer:trtllm_comm", SM90, fi, "run", cache)
    assert not again.cached and again.result == "pass", again.reason


def test_no_interpreter_or_no_check_is_unknown(tmp_path: Path) -> None:
    kernel = load_kernels()["flashinfer:trtllm_comm"]
    fi = from_tree(make_tree(tmp_path, gate="[9, 10, 12]"))
    step = check_run(kernel, SM90, fi, tmp_path / "cache")
    assert step.result == "unknown" and "no Python interpreter" in step.reason and "--python EXE" in step.reason
    none = dataclasses.replace(kernel, run="", run_unavailable="nothing to run it on")
    assert check_run(none, SM90, fi, tmp_path / "cache").reason == "run: nothing to run it on"
