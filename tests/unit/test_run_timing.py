"""The run rung's kernel timings: the statistics, the words, and a whole timed run over gloo on CPU.

The arithmetic is checked against hand-worked numbers; the words (verdict clause, probe table)
from plain records; then two CPU ranks of the spec venv's torch time, through the shipped
kernel_timing.py, fakes whose costs differ by 3x either way (one sleeps three times as long as the
baseline, one a third as long). Asserted is the side each lands on, with its spread: a behaviour
of fakes 9x apart from each other, never a bound on how long anything took.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from sm120patch.arch import parse_arch
from sm120patch.catalogue.kernels import load_kernels
from sm120patch.probes import ProbeCache, probe_kernel
from sm120patch.probes.environment.device import detect
from sm120patch.probes.environment.flashinfer import from_python, from_tree
from sm120patch.probes.run import ranks
from sm120patch.probes.run import timing as run_timing
from sm120patch.probes.run.ranks import Child, Run
from sm120patch.probes.run.rung import CHECKS, CHECKS_DIR, CHECKS_ENV, check_run, run_fingerprint
from sm120patch.probes.run.verdict import judge_ranks
from tests.conftest import needs_tool, pristine_or_skip, requires
from tests.integration.fi_releases import spec_venv
from tests.integration.test_run_gpu import reached_the_run_rung
from tests.unit.cli_entry import SM120PATCH
from tests.unit.fi_fakes import make_tree

SM90 = parse_arch("sm_90")
FAKES = Path(__file__).resolve().parent / "run_fakes"
AR = CHECKS["allreduce_fusion"]
# `nvidia-smi topo -m` as it printed on the 2x H200 of 2026-11-30 (docs/gpu-validation-2026-11-30.log)
TOPO = (
    "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV18\t0-31\t0\t\tN/A\n"
    "GPU1\tNV18\t X \t0-31\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n"
)


def _lib():
    spec = importlib.util.spec_from_file_location("kernel_timing", CHECKS_DIR / "kernel_timing.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # no torch at import: its torch-free parts run here
    return mod


# ---------------------------------------------------------------- the statistics, by hand


def test_quartiles_and_stats_match_hand_worked_numbers() -> None:
    kt = _lib()
    xs = [4.0, 1.0, 3.0, 2.0]  # sorted 1 2 3 4: linear interpolation between closest ranks
    assert (kt.quantile(xs, 0.25), kt.quantile(xs, 0.5), kt.quantile(xs, 0.75)) == (1.75, 2.5, 3.25)
    assert kt.stats(xs) == {"median": 2.5, "q1": 1.75, "q3": 3.25, "min": 1.0, "max": 4.0, "n": 4}
    assert kt.quantile([], 0.5) is None


def test_a_row_pairs_the_samples_and_takes_the_spread_into_account() -> None:
    kt = _lib()
    base = [1.0, 2.0, 1.0, 2.0, 1.0]
    slow = kt.compare({"c": [3.0, 6.0, 3.0, 6.0, 3.0], "b": base}, "c", "b")
    assert slow["ratio"] == 3.0 and (slow["ratio_q1"], slow["ratio_q3"]) == (3.0, 3.0) and slow["side"] == "slower"
    assert slow["candidate_ms"]["median"] == 3.0 and slow["baseline_ms"]["median"] == 1.0
    fast = kt.compare({"c": [0.5, 1.0, 0.5, 1.0, 0.5], "b": base}, "c", "b")
    assert fast["ratio"] == 0.5 and fast["side"] == "faster"
    # paired ratios 0.5, 2, 0.5, 2, 1: spread across 1, so neither side
    mixed = kt.compare({"c": [0.5, 4.0, 0.5, 4.0, 1.0], "b": base}, "c", "b")
    assert (mixed["ratio_q1"], mixed["ratio_q3"], mixed["side"]) == (0.5, 2.0, "level")


def test_the_link_between_two_gpus_is_read_from_nvidia_smi() -> None:
    kt = _lib()
    assert kt._topo_cell(TOPO, 0, 1) == "NV18" and kt._topo_cell(TOPO, 1, 0) == "NV18"
    pcie = TOPO.replace("NV18", "PHB")
    assert kt._topo_cell(pcie, 0, 1) == "PHB" and kt._topo_cell(TOPO, 0, 7) is None


# ---------------------------------------------------------------- the words, from plain records


def _row(cand: str, tokens: int, ratio: float, q1: float, q3: float, side: str) -> dict:
    return {"shape": [tokens, 4096], "dtype": "bfloat16", "candidate": cand, "baseline": "nccl+rmsnorm",
            "candidate_ms": {"median": ratio * 0.02}, "baseline_ms": {"median": 0.02},
            "ratio": ratio, "ratio_q1": q1, "ratio_q3": q3, "side": side}  # fmt: skip


TIMING = {
    "what": "fusion against NCCL + RMSNorm",
    "baseline": "nccl+rmsnorm",
    "timer": "cuda-events",
    "repeats": 30,
    "inner": 10,
    "world_size": 2,
    "sglang_max_tokens": 2048,
    "topology": {"p2p": {"0->1": True, "1->0": True}, "links": {"0-1": "NV18"}},
    "rows": [
        _row("oneshot", 16, 0.45, 0.43, 0.47, "faster"),
        _row("oneshot", 8192, 1.8, 1.7, 1.9, "slower"),
        _row("twoshot", 8192, 1.01, 0.97, 1.04, "level"),
    ],
}


def test_the_verdict_clause_names_where_the_candidate_is_slower() -> None:
    text = run_timing.summary(TIMING)
    assert "2 ranks, 0-1 NV18, P2P yes" in text and "0.45x to 1.80x in 3 comparison(s) (path x shape)" in text
    assert "slower at oneshot 8192x4096 1.80x (1.70-1.90)" in text and "twoshot 8192" not in text
    assert text.endswith(f"({run_timing.NO_DECISION})")
    assert "slower at no shape" in run_timing.summary({**TIMING, "rows": TIMING["rows"][:1]})
    assert run_timing.summary(None) == ""
    assert run_timing.summary({"skipped": "wrong"}) == "not timed (wrong)"


def test_the_probe_table_has_a_row_per_shape_and_a_column_per_candidate() -> None:
    lines = run_timing.table(TIMING)
    assert "cuda-events, median of 30 x 10 calls" in lines[0] and "0-1 NV18" in lines[0]
    assert lines[1].split() == ["tokens", "x", "hidden", "oneshot", "twoshot", "nccl+rmsnorm", "ms"]
    assert lines[2].split() == ["16x4096", "0.45x", "(0.43-0.47)", "-", "0.02"]
    assert lines[3].split() == ["8192x4096", "1.80x", "(1.70-1.90)", "*", "1.01x", "(0.97-1.04)", "0.02"]
    assert "(1 of 3)" in lines[4] and "2048 tokens" in lines[5]


def test_the_markdown_table_and_the_saved_verdict_reader(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    md = run_timing.markdown(TIMING)
    assert md[0].count("|") == 7 and md[1] == "|" + " --- |" * 6
    assert md[3] == "| 8192x4096 | 1.80x (1.70-1.90) **slower** | 1.01x (0.97-1.04) | 0.036 | 0.0202 | 0.02 |"
    run_only = tmp_path / "timing.json"  # what tools/run_only.py writes: a Step with its evidence
    run_only.write_text(json.dumps({"result": "pass", "evidence": {"run": {"timing": TIMING}}}))
    probe = tmp_path / "probe.json"  # what `probe --json` writes
    probe.write_text(json.dumps({"verdicts": [{"evidence": {"run": {"timing": TIMING}}}]}))
    for f in (run_only, probe):
        assert run_timing.main([str(f)]) == 0
        assert capsys.readouterr().out.splitlines() == run_timing.table(TIMING)
    assert run_timing.main([str(probe), "--markdown"]) == 0 and capsys.readouterr().out.splitlines() == md
    assert run_timing.main([str(tmp_path / "none.json")]) == 2 and "none.json" in capsys.readouterr().err
    assert run_timing.main([]) == 2


def test_a_pass_carries_its_timing_and_no_timing_turns_it() -> None:
    found = [{"index": i, "name": "NVIDIA H200", "capability": [9, 0]} for i in range(2)]
    prep = Run([Child("prepare", "build", result={"devices": found, "matching": [0, 1]})], 1.0)
    case = {"name": "a", "ok": True, "numel": 4, "n_bad": 0, "max_abs_err": 0.01, "atol": 0.05, "rtol": 0.02,
            "shape": [16, 4096], "dtype": "bfloat16"}  # fmt: skip
    kids = [Child(f"rank {r}", result={"cases": [case], "timing": TIMING}, returncode=0, ended_s=1.0) for r in (0, 1)]
    step = judge_ranks(AR, SM90, prep, Run(kids, 2.0))
    assert step.result == "pass" and "slower at oneshot 8192x4096" in step.reason, step.reason
    assert step.evidence["run"]["timing"] == TIMING


def test_the_timing_library_is_part_of_the_run_cache_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = load_kernels()["flashinfer:trtllm_comm"]
    before = run_fingerprint(kernel)
    copy = tmp_path / "kernel_timing.py"
    copy.write_text(ranks.TIMING_LIB.read_text() + "\n# changed\n")
    monkeypatch.setattr(ranks, "TIMING_LIB", copy)
    assert run_fingerprint(kernel) != before


# ---------------------------------------------------------------- a timed run: two gloo ranks on CPU


@pytest.fixture(scope="module")
def target() -> str:
    return str(spec_venv())


@pytest.fixture
def timed(tmp_path: Path, target: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(CHECKS_ENV, str(FAKES))
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "fi-home"))
    monkeypatch.setenv("FAKE_GPUS", "9.0,9.0")
    monkeypatch.setenv("FAKE_TIMING", "1")
    return from_tree(make_tree(tmp_path / "tree", gate="[9, 10, 12]"), python=target)


@pytest.mark.network
def test_gloo_the_ratios_land_on_the_side_of_the_known_costs(
    timed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_RUN", "ok")
    step = check_run(load_kernels()["flashinfer:trtllm_comm"], SM90, timed, tmp_path / "cache")
    assert step.result == "pass", step.reason
    timing = step.evidence["run"]["timing"]
    assert timing["timer"] == "perf_counter" and timing["topology"]["links"] == {"0-1": "FAKE"}
    rows = {(r["candidate"], r["shape"][0]): r for r in timing["rows"]}
    assert set(rows) == {("oneshot", 1), ("oneshot", 64), ("twoshot", 64)}  # no two-shot for 1 token on 2 ranks
    for key in (("oneshot", 1), ("oneshot", 64)):  # costs 3x the baseline
        r = rows[key]
        assert r["side"] == "slower" and r["ratio_q1"] > 1.0 and r["ratio"] > 1.0, r
        assert r["candidate_ms"]["n"] == r["baseline_ms"]["n"] == 7
        assert r["candidate_ms"]["median"] > r["baseline_ms"]["median"]
    fast = rows[("twoshot", 64)]  # costs a third of the baseline
    assert fast["side"] == "faster" and fast["ratio_q3"] < 1.0 and fast["ratio"] < 1.0, fast
    assert "the candidate is slower at oneshot 1x64" in step.reason and "oneshot 64x64" in step.reason
    assert "twoshot" not in step.reason.split("slower at", 1)[1] and run_timing.NO_DECISION in step.reason


@pytest.mark.network
def test_gloo_a_wrong_kernel_is_not_timed_on_any_rank(timed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_RUN", "garbage")  # rank 1 wrong, rank 0 right: both must skip the collectives
    step = check_run(load_kernels()["flashinfer:trtllm_comm"], SM90, timed, tmp_path / "cache", timeout=120.0)
    assert step.result == "fail" and "wrong numbers" in step.reason, step.reason
    assert [r["how"] for r in step.evidence["run"]["ranks"]] == ["finished", "finished"]
    assert step.evidence["run"]["timing"] == {
        "skipped": "the numbers were wrong on a rank: a wrong kernel is not timed"
    }


@pytest.mark.network
def test_gloo_probe_prints_the_ratio_per_shape_and_json_carries_it(
    timed, tmp_path: Path, target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_RUN", "ok")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cold = probe_kernel("flashinfer:trtllm_comm", SM90, timed, "run", ProbeCache())
    assert (cold.result, cold.rung) == ("pass", "run"), cold.reason
    args = ["probe", "flashinfer:trtllm_comm", "--arch", "sm_90", "--probe", "run",
            "--flashinfer", str(tmp_path / "tree"), "--python", target]  # fmt: skip
    out = CliRunner().invoke(SM120PATCH, args)  # answered from the cache the cold probe filled
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    head = next(i for i, line in enumerate(lines) if "timing: fake fusion" in line)
    first = lines[head + 2].split()  # 1x64: one-shot (3x the cost, marked slower), no two-shot, baseline ms
    assert first[0] == "1x64" and first[3] == "*" and first[4] == "-"
    assert lines[head + 3].split()[0] == "64x64" and "(2 of 3)" in lines[head + 4]
    js = CliRunner().invoke(SM120PATCH, [*args, "--json"])
    verdict = json.loads(js.output)["verdicts"][0]
    assert verdict["cached"] and run_timing.of_verdict(verdict) == cold.evidence["run"]["timing"]


# ---------------------------------------------------------------- on two real GPUs


def _two_gpus() -> tuple:
    """An arch with 2 GPUs here and a FlashInfer to run them with, or a skip saying what is missing."""
    gpus = detect(with_torch=False).gpus
    requires(len(gpus) >= 2, f"needs 2 NVIDIA GPUs of one arch; NVML/nvidia-smi found {len(gpus)}")
    needs_tool("nvcc", "FlashInfer's JIT on the GPUs")
    arch = gpus[0].arch
    requires(sum(g.arch == arch for g in gpus) >= 2, "needs 2 GPUs of one arch")
    fi = from_python(os.environ.get("SM120PATCH_GPU_PYTHON") or shutil.which("python3") or "python3")
    requires(fi.found, f"cannot import flashinfer ({fi.error}); set SM120PATCH_GPU_PYTHON")
    return arch, fi


def _timed_on_gpus(kernel: str, tmp_path: Path) -> dict:
    arch, fi = _two_gpus()
    v = probe_kernel(kernel, arch, fi, "run", ProbeCache(tmp_path))
    reached_the_run_rung(v)  # below `run` with the GPUs here: a failure, unless FlashInfer lacks the kernel
    assert v.result == "pass", v.reason
    timing = v.evidence["run"]["timing"]
    assert timing["timer"] == "cuda-events" and timing["topology"]["p2p"]
    assert all(r["ratio"] and r["candidate_ms"]["n"] == 30 for r in timing["rows"])
    return timing


@pytest.mark.gpu
def test_fusion_timing_on_two_gpus(tmp_path: Path) -> None:
    shapes = {(r["candidate"], tuple(r["shape"])) for r in _timed_on_gpus("flashinfer:trtllm_comm", tmp_path)["rows"]}
    for hidden in (4096, 6144, 7168):
        assert all(("oneshot", (t, hidden)) in shapes for t in (1, 16, 128, 1024, 8192))
        assert all(("twoshot", (t, hidden)) in shapes for t in (16, 128, 1024, 8192))


@pytest.mark.gpu
def test_pcie_ipc_timing_on_two_gpus(tmp_path: Path) -> None:
    """FlashInfer >= 0.7.0 only: on 0.6.x the static rung fails (no pcie_ipc_comm), a skip naming it."""
    timing = _timed_on_gpus("flashinfer:pcie_ipc_comm", tmp_path)
    assert {r["candidate"] for r in timing["rows"]} == {"pcie_ipc"} and len(timing["workspaces"]) == 3


# ---------------------------------------------------------------- the shipped check's timing code, on CPU

REAL_CHECK = textwrap.dedent(
    """
    import importlib.util, json, os, sys, types
    import torch, torch.distributed as dist

    checks, sigs, store = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    sys.path.insert(0, checks)  # as harness.py runs: kernel_timing beside it
    calls = {"fusion": [], "workspace": [], "destroy": 0, "norm": 0}

    def bind(name, args, kwargs):
        sig = sigs[name]
        given = set(sig["params"][: len(args)]) | set(kwargs)
        assert given <= set(sig["params"]), (name, sorted(given - set(sig["params"])))
        assert set(sig["required"]) <= given, (name, sorted(set(sig["required"]) - given))
        return dict(zip(sig["params"], args), **kwargs)

    def fusion(*a, **k):
        calls["fusion"].append({n: v for n, v in bind("trtllm_allreduce_fusion", a, k).items()
                                if n in ("token_num", "hidden_dim", "use_oneshot", "launch_with_pdl", "fp32_acc")})

    def workspace(*a, **k):
        calls["workspace"].append(bind("trtllm_create_ipc_workspace_for_all_reduce_fusion", a, k))
        return [[0, 0]], torch.zeros(1)

    def destroy(handles, group):
        calls["destroy"] += 1

    def norm(*a, **k):
        bind("fused_add_rmsnorm", a, k)
        calls["norm"] += 1

    # FlashInfer 0.6.1's shapes of these, from its source (sigs); the bodies are stand-ins
    fi, comm, ar, fnorm = (types.ModuleType(n) for n in ("flashinfer", "flashinfer.comm",
                                                          "flashinfer.comm.trtllm_ar", "flashinfer.norm"))
    comm.trtllm_allreduce_fusion, comm.trtllm_destroy_ipc_workspace_for_all_reduce_fusion = fusion, destroy
    exec("def trtllm_create_ipc_workspace_for_all_reduce_fusion(" + sigs["ws_def"] + "): pass", ar.__dict__)
    real_ws_sig = ar.trtllm_create_ipc_workspace_for_all_reduce_fusion
    comm.trtllm_create_ipc_workspace_for_all_reduce_fusion = workspace
    comm.AllReduceFusionPattern = types.SimpleNamespace(kARResidualRMSNorm=1)
    ar._should_use_oneshot = lambda t, h, dtype, ws: t * h * 2 * ws * dtype.itemsize / 2**20 <= 512
    fnorm.fused_add_rmsnorm = norm
    fi.comm, fi.norm, comm.trtllm_ar = comm, fnorm, ar
    sys.modules.update({"flashinfer": fi, "flashinfer.comm": comm, "flashinfer.comm.trtllm_ar": ar,
                        "flashinfer.norm": fnorm})
    import inspect
    inspect_signature = inspect.signature
    inspect.signature = lambda f: inspect_signature(real_ws_sig if f is workspace else f)

    # no GPU: CUDA events read the wall clock, synchronize does nothing, the peers are reachable
    import time
    class Event:
        def __init__(self, enable_timing=False): self.t = None
        def record(self): self.t = time.perf_counter()
        def synchronize(self): pass
        def elapsed_time(self, end): return (end.t - self.t) * 1e3
    torch.cuda.Event, torch.cuda.synchronize = Event, lambda *a: None
    torch.cuda.can_device_access_peer = lambda a, b: True

    spec = importlib.util.spec_from_file_location("allreduce_fusion", f"{checks}/allreduce_fusion.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    check.TIMING_TOKENS, check.SGLANG_MAX_TOKENS = (1, 16, 1024), 16  # CPU-sized; the real hidden sizes
    check.TIMING.update(warmup=1, repeats=3, inner=2)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)

    class Ctx:
        rank, world_size, group, devices, phases = 0, 2, dist.group.WORLD, [0, 1], []
        def phase(self, name, **info): self.phases.append(name)

    timing = check._timing(Ctx(), comm, torch.device("cpu"), True)
    skipped = check._timing(Ctx(), comm, torch.device("cpu"), False)
    print(json.dumps({"timing": timing, "skipped": skipped, "calls": calls, "phases": Ctx.phases}, default=str))
    """
)


def _real_signatures(py: Path) -> dict:
    """Parameter names (and the required ones) of the FlashInfer 0.6.1 functions the check calls, from its source."""
    site = next(py.parent.parent.glob("lib/python*/site-packages/flashinfer"))
    out = {}
    for rel, fn in (("comm/trtllm_ar.py", "trtllm_allreduce_fusion"),
                    ("comm/trtllm_ar.py", "trtllm_create_ipc_workspace_for_all_reduce_fusion"),
                    ("norm.py", "fused_add_rmsnorm")):  # fmt: skip
        tree = ast.parse((site / rel).read_text())
        node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == fn)
        params = [a.arg for a in node.args.args]
        out[fn] = {"params": params, "required": params[: len(params) - len(node.args.defaults)]}
        if fn.startswith("trtllm_create"):
            args = [
                a.arg + (f"={ast.unparse(d)}" if d is not None else "")
                for a, d in zip(
                    node.args.args, [None] * (len(params) - len(node.args.defaults)) + node.args.defaults, strict=True
                )
            ]
            out["ws_def"] = ", ".join(a.replace("torch.", "") for a in args)  # fmt: skip
    return out


@pytest.mark.network
def test_the_shipped_check_times_every_shape_with_flashinfer_061_calls(tmp_path: Path, target: str) -> None:
    py = Path(target)
    sigs = _real_signatures(py)
    p = subprocess.run([target, "-c", REAL_CHECK, str(CHECKS_DIR), json.dumps(sigs), str(tmp_path / "store")],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    timing, calls = got["timing"], got["calls"]
    assert got["skipped"] == {"skipped": "the numbers were wrong on a rank: a wrong kernel is not timed"}
    # one IPC workspace per hidden size, sized for the most tokens, plain IPC (no symmetric memory), destroyed
    assert [(w["max_token_num"], w["hidden_dim"], w["use_symm_dev_mem"]) for w in calls["workspace"]] == [
        (1024, 4096, False), (1024, 6144, False), (1024, 7168, False)]  # fmt: skip
    assert calls["destroy"] == 3
    rows = {(r["candidate"], tuple(r["shape"])) for r in timing["rows"]}
    want = {("oneshot", (t, h)) for t in (1, 16, 1024) for h in (4096, 6144, 7168)}
    want |= {("twoshot", (t, h)) for t in (16, 1024) for h in (4096, 6144, 7168)}  # 1 token: no two-shot at 2 ranks
    assert rows == want
    assert all(r["candidate_ms"]["n"] == r["baseline_ms"]["n"] == 3 and r["baseline"] == "nccl+rmsnorm"
               for r in timing["rows"])  # fmt: skip
    # each contender: 1 warm-up call + 3 samples x 2 calls, per shape
    assert calls["norm"] == 9 * 7 and len(calls["fusion"]) == 15 * 7
    assert {(c["launch_with_pdl"], c["fp32_acc"]) for c in calls["fusion"]} == {(True, False)}  # as SGLang calls it
    assert {(c["token_num"], c["use_oneshot"]) for c in calls["fusion"] if c["hidden_dim"] == 4096} == {
        (1, True), (16, True), (16, False), (1024, True), (1024, False)}  # fmt: skip
    by = {(r["candidate"], r["shape"][0], r["shape"][1]): r for r in timing["rows"]}
    assert by[("oneshot", 16, 4096)]["sglang_fuses"] and not by[("oneshot", 1024, 4096)]["sglang_fuses"]
    # the stand-in heuristic (0.6.1's formula: one-shot up to 512 MB at 2 ranks) picks one-shot for 1024x7168
    assert by[("oneshot", 1024, 7168)]["flashinfer_picks"] is True
    assert by[("twoshot", 1024, 7168)]["flashinfer_picks"] is False
    assert timing["timer"] == "cuda-events" and timing["topology"]["p2p"] == {"0->1": True, "1->0": True}
    assert "kernel" in got["phases"] and got["phases"].count("timing-teardown") == 3


PCIE_CHECK = textwrap.dedent(
    """
    import importlib.util, inspect, json, sys, time, types
    import torch, torch.distributed as dist

    checks, sigs, store, mode = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
    sys.path.insert(0, checks)
    calls = {"init": [], "all_reduce": 0, "destroy": 0}

    def bind(name, args, kwargs):
        sig = sigs[name]
        given = set(sig["params"][: len(args)]) | set(kwargs)
        assert given <= set(sig["params"]), (name, sorted(given - set(sig["params"])))
        assert set(sig["required"]) <= given, (name, sorted(set(sig["required"]) - given))
        return dict(zip(sig["params"], args), **kwargs)

    class Workspace:  # FlashInfer 0.7.4's PcieIpcAllReduceWorkspace, its signatures (sigs) over a stand-in body
        def __init__(self, *a, **k):
            got = bind("__init__", ("self", *a), k)
            calls["init"].append({n: got[n] for n in ("max_numel", "dtype") if n in got})
            self.max_numel, self.profile = got["max_numel"], "rootcplx-noswitch"

        def supports(self, *a, **k):
            inp = bind("supports", ("self", *a), k)["inp"]
            return inp.numel() <= self.max_numel and inp.numel() >= 8192  # stand-in: a floor, to see declines

        def all_reduce(self, *a, **k):
            got = bind("all_reduce", ("self", *a), k)
            calls["all_reduce"] += 1
            if mode == "ok":
                s = got["inp"].float()
                dist.all_reduce(s)
                got["out"].copy_(s)
            return got["out"]  # "empty": writes nothing, the NaN poison stays

        def destroy(self):
            calls["destroy"] += 1

    comm = types.SimpleNamespace(PcieIpcAllReduceWorkspace=Workspace)

    class Event:
        def __init__(self, enable_timing=False): self.t = None
        def record(self): self.t = time.perf_counter()
        def synchronize(self): pass
        def elapsed_time(self, end): return (end.t - self.t) * 1e3
    torch.cuda.Event, torch.cuda.synchronize = Event, lambda *a: None
    torch.cuda.can_device_access_peer = lambda a, b: True

    harness_spec = importlib.util.spec_from_file_location("harness", f"{checks}/harness.py")
    harness = importlib.util.module_from_spec(harness_spec)
    harness_spec.loader.exec_module(harness)
    spec = importlib.util.spec_from_file_location("pcie_ipc_allreduce", f"{checks}/pcie_ipc_allreduce.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    check.TIMING.update(warmup=1, repeats=3, inner=2)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    ctx = harness.Ctx("rank", {"devices": [0, 1]})
    ctx.group, ctx.world_size, ctx.phase = dist.group.WORLD, 2, lambda name, **info: None
    print(json.dumps({"out": check._run(ctx, comm, torch.device("cpu")), "calls": calls}, default=str))
    """
)


def _pcie_signatures() -> dict:
    """FlashInfer 0.7.4's PcieIpcAllReduceWorkspace methods the check calls, from its source."""
    src = pristine_or_skip("flashinfer", "0.7.4") / "flashinfer" / "comm" / "pcie_ipc_ar.py"
    cls = next(n for n in ast.walk(ast.parse(src.read_text())) if isinstance(n, ast.ClassDef)
               and n.name == "PcieIpcAllReduceWorkspace")  # fmt: skip
    out = {}
    for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
        params = [a.arg for a in fn.args.args] + [a.arg for a in fn.args.kwonlyargs]
        required = [a.arg for a in fn.args.args][: len(fn.args.args) - len(fn.args.defaults)]
        out[fn.name] = {"params": params, "required": required}
    return out


@pytest.mark.network
@pytest.mark.parametrize("mode", ["ok", "empty"])
def test_the_pcie_ipc_check_on_flashinfer_074_calls(tmp_path: Path, target: str, mode: str) -> None:
    args = [target, "-c", PCIE_CHECK, str(CHECKS_DIR), json.dumps(_pcie_signatures()), str(tmp_path / "s"), mode]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    out, calls = got["out"], got["calls"]
    # one decode-sized workspace per hidden size, bf16, destroyed
    assert calls["init"] == [{"max_numel": 256 * h, "dtype": "torch.bfloat16"} for h in (4096, 6144, 7168)]
    assert calls["destroy"] == 3
    assert out["declined"] == [[1, 4096], [1, 6144], [1, 7168]]  # what supports() declined is not a case
    names = [c["name"] for c in out["cases"]]
    assert names == [f"{t}x{h}" for h in (4096, 6144, 7168) for t in (16, 128, 256)]
    if mode == "ok":
        assert all(c["ok"] for c in out["cases"])
        rows = out["timing"]["rows"]
        assert [tuple(r["shape"]) for r in rows] == [(t, h) for h in (4096, 6144, 7168) for t in (16, 128, 256)]
        assert all(r["candidate"] == "pcie_ipc" and r["baseline"] == "nccl" and r["candidate_ms"]["n"] == 3
                   for r in rows)  # fmt: skip
        assert calls["all_reduce"] == 9 + 9 * (1 + 3 * 2)  # the checks, then warm-up + samples x calls
        assert out["timing"]["workspaces"][0]["profile"] == "rootcplx-noswitch"
    else:  # a kernel that writes nothing: every element still NaN, and nothing timed
        assert not any(c["ok"] for c in out["cases"]) and all(c["n_nonfinite"] == c["numel"] for c in out["cases"])
        assert out["timing"] == {"skipped": "the numbers were wrong on a rank: a wrong kernel is not timed"}
        assert calls["all_reduce"] == 9  # every case checked, none timed


def test_a_gpu_run_that_stops_below_the_run_rung_fails_unless_flashinfer_lacks_the_kernel() -> None:
    """The GPU tests' rule (tests/integration/test_run_gpu.py): with the GPUs here, a ladder that
    stopped at the spec rung is a regression, not a skip; a static fail is FlashInfer's, a skip."""
    from dataclasses import replace

    from sm120patch.probes import Verdict

    v = Verdict("flashinfer:trtllm_comm", "sm_90", "pass", "spec", "spec passed; run: could not start", 0.1)
    with pytest.raises(pytest.fail.Exception, match="stopped at the spec rung"):
        reached_the_run_rung(v)
    with pytest.raises(pytest.fail.Exception, match="stopped at the static rung"):
        reached_the_run_rung(replace(v, rung="static", result="unknown"))
    with pytest.raises(pytest.skip.Exception, match="has no flashinfer:trtllm_comm"):
        reached_the_run_rung(replace(v, rung="static", result="fail"))
    assert reached_the_run_rung(replace(v, rung="run")) is None
