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
