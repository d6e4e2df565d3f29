"""verify and guard --canary on a real SGLang release with the real catalogue: the fake OpenAI
server's speed or answers follow the real autotune gate in the tree (FlashInfer autotune for the
flashinfer_cutlass MoE backend, commented out in 0.5.9's model_runner.py), as a GLM-5-NVFP4
server's did on 8x RTX PRO 6000 (faster; and with flashinfer#4841, collapsing outputs).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sm120patch.engine.journal import Journal
from tests.conftest import fetch_or_skip
from tests.unit.sglang_fakes import snapshot
from tests.unit.verify_fakes import free_port, server_command

pytestmark = pytest.mark.releases

AUTOTUNE = "sglang-autotune-flashinfer-cutlass"
RUNNER = "srt/model_executor/model_runner.py"
OPENED = r'^\s*"flashinfer_cutlass",'  # the list item uncommented: autotune runs for that backend
CLI = [sys.executable, "-m", "sm120patch"]


def sm(*args: object, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SM120PATCH_RECIPES"}
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


def test_verify_keeps_the_autotune_recipe_where_it_pays(tmp_path: Path) -> None:
    site = fetch_or_skip("sglang", "0.5.9", tmp_path / "site")
    pristine = snapshot(site)
    port = free_port()
    fake = server_command(site / "sglang", port, tmp_path / "state", "--knob-if", f"delay=0.003:{RUNNER}:{OPENED}")
    r = sm(
        "verify", site, "--recipe", AUTOTUNE, "--probe", "none", "--arch", "sm_120",
        "--concurrency", "4", "--output-len", "20", "--requests", "8", "--warmup", "2", "--grace", "2",
        "--ready-timeout", "30", "--url", f"http://127.0.0.1:{port}", "--out", tmp_path / "report", "--json",
        "--", *fake,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (d,) = json.loads(r.stdout)["decisions"]
    assert d["keep"] and d["recipes"] == [AUTOTUNE]
    assert Journal.open(site).applied_ids() == [AUTOTUNE]
    now = snapshot(site)
    assert [k for k in now if now[k] != pristine.get(k)] == [f"sglang/{RUNNER}"]
    assert re.search(OPENED, now[f"sglang/{RUNNER}"].decode(), re.M)
    assert "verified sglang-autotune-flashinfer-cutlass: kept:" in sm("status", site, "--probe", "none").stdout
    assert sm("rollback", site).returncode == 0 and snapshot(site) == pristine


def test_canary_takes_back_the_tactics_recipe_first(tmp_path: Path) -> None:
    site = fetch_or_skip("sglang", "0.5.9", tmp_path / "site")
    pristine = snapshot(site)
    # the tactic choice and two recipes that route to other kernels (changes_outputs = "kernels")
    picked = [AUTOTUNE, "sglang-moe-backend-sm120", "sglang-fp4-gemm-b12x-sm120"]
    r = sm("apply", site, "--arch", "sm_120", "--probe", "none", "--no-diff", *(f"--recipe={i}" for i in picked))
    assert r.returncode == 0, r.stderr
    before = Journal.open(site).applied_ids()
    assert sorted(before) == sorted(picked)
    port = free_port()
    fake = server_command(site / "sglang", port, tmp_path / "state", "--serve-requests", "3")
    fake += ["--knob-if", f"mode=collapse:{RUNNER}:{OPENED}"]
    r = sm(
        "guard", "--target", site, "--timeout", "30", "--grace", "2", "--canary", "0.2",
        "--canary-url", f"http://127.0.0.1:{port}", "--canary-tokens", "40", "--", *fake,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "canary: collapse:" in r.stderr and f"relaunching the server without {AUTOTUNE}" in r.stderr
    modes = [line.split()[2] for line in (tmp_path / "state" / "launches").read_text().splitlines()]
    assert modes == ["mode=collapse", "mode=ok"]
    # the recipes that route to other kernels stay: only the tactic choice went
    assert Journal.open(site).applied_ids() == [i for i in before if i != AUTOTUNE]
    assert sm("rollback", site).returncode == 0 and snapshot(site) == pristine


AR, FIX = "sglang-allreduce-fusion-sm120", "flashinfer-trtllm-comm-sm120"
COMMUNICATOR = "srt/layers/communicator.py"
# 0.5.9's fusion gate, as the recipe widens it (the SM12x test wrapped by its taken line, or not)
AR_OPENED = r"_is_sm100_supported or (_sm120patch_taken\(\"sglang-allreduce-fusion-sm120\", )?_is_sm120_supported"


def test_one_at_a_time_measures_the_gate_with_the_backport_it_stands_on(tmp_path: Path) -> None:
    """Issue 31.1, the real case: SGLang 0.5.9 and FlashInfer 0.6.3 in one site-packages after
    `apply --arch sm_120`. The fused all-reduce gate opens only on the backported FlashInfer; the
    fake server is faster where the gate is open (the host where the fusion pays)."""
    site = tmp_path / "site"
    fetch_or_skip("sglang", "0.5.9", site)
    fetch_or_skip("flashinfer", "0.6.3", site)
    pristine = snapshot(site)
    r = sm("apply", site, "--arch", "sm_120", "--probe", "static", "--no-diff", timeout=900)
    assert r.returncode in (0, 1), r.stderr  # 1: b12x is blocked on 0.6.3
    applied = sorted(Journal.open(site).applied_ids())
    assert {AR, FIX} <= set(applied), applied
    after_apply = snapshot(site)
    port = free_port()
    fake = server_command(
        site / "sglang", port, tmp_path / "state", "--knob-if", f"delay=0.003:{COMMUNICATOR}:{AR_OPENED}"
    )
    r = sm(
        "verify", site, "--one-at-a-time", "--probe", "static", "--arch", "sm_120",
        "--concurrency", "4", "--output-len", "20", "--requests", "8", "--warmup", "0", "--grace", "2",
        "--noise-floor", "0.5", "--min-effect", "0.6",  # this test is about arms, not about the box's noise
        "--ready-timeout", "30", "--url", f"http://127.0.0.1:{port}", "--out", tmp_path / "report", "--json",
        "--", *fake, timeout=900,
    )  # fmt: skip
    data = json.loads(r.stdout)
    assert r.returncode == 0, r.stderr
    by = {d["name"]: d for d in data["decisions"]}
    assert FIX not in by and by[AR]["recipes"] == [AR, FIX] and by[AR]["verdict"] == "kept"
    assert "no arm of its own" in data["together"][FIX] and "not applied" not in r.stderr
    assert sorted(by) == sorted(i for i in applied if i != FIX)  # every other recipe: an arm of its own
    # the gate's arm ran with the gate open (fast); every baseline without it
    delays = [line.split()[1] for line in (tmp_path / "state" / "launches").read_text().splitlines()]
    arms = [x["arm"] for x in data["launches"]]
    assert [d for d, a in zip(delays, arms, strict=True) if a == AR] == ["delay=0.003"]
    assert {d for d, a in zip(delays, arms, strict=True) if a != AR} == {"delay=0.01"}
    assert len(arms) == 1 + 2 * len(by)
    assert sorted(Journal.open(site).applied_ids()) == applied and snapshot(site) == after_apply
    assert sm("rollback", site).returncode == 0 and snapshot(site) == pristine
