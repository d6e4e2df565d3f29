"""diagnose --target on real releases: the seed's crash on SGLang 0.5.9 with the FlashInfer it pins
(0.6.3) is answered with sm120patch's own fix, the exact `apply` of the FlashInfer backport and the
allreduce recipe for these two trees, not with "run diagnose again" (issue 23, item 4)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import fetch_or_skip

pytestmark = pytest.mark.releases

CLI = [sys.executable, "-m", "sm120patch"]
SEED = (
    "[2026-11-29 03:00:00] Capture cuda graph begin. This can take up to several minutes.\n"
    '  File "/usr/lib/python3/site-packages/flashinfer/jit/comm.py", line 61, in gen_trtllm_comm_module\n'
    "RuntimeError: No supported CUDA architectures found for major versions [9, 10].\n"
)
AR, FIX = "sglang-allreduce-fusion-sm120", "flashinfer-trtllm-comm-sm120"


def diagnose(log: Path, target: Path) -> dict:
    r = subprocess.run([*CLI, "diagnose", str(log), "--target", str(target), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_seed_crash_on_site_packages_names_the_backport_apply(tmp_path: Path) -> None:
    site = tmp_path / "site"
    fetch_or_skip("sglang", "0.5.9", site)
    fetch_or_skip("flashinfer", "0.6.3", site)
    log = tmp_path / "server.log"
    log.write_text(SEED, encoding="utf-8")
    (f,) = diagnose(log, site)["findings"]
    assert f["signature"] == "flashinfer-jit-arch-excluded" and f["recipe_ids"] == []
    want = f"sm120patch apply {shlex.quote(str(site.resolve()))} --recipe {FIX} --recipe {AR}"
    assert want in f["next_step"], f["next_step"]
    assert "diagnose" not in f["next_step"]

    # the command it gives is one that works on these trees: both recipes are applied
    args = [*CLI, *shlex.split(want)[1:], "--arch", "sm_120", "--probe", "static", "--json"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=900)
    out = {x["id"]: x["status"] for x in json.loads(r.stdout)["recipes"]}
    assert out[FIX] == "applied" and out[AR] == "applied", out
    # applied now: the crash again means the gate is open; rollback is the next step, not apply
    (f,) = diagnose(log, site)["findings"]
    assert f["journal"] == "applied" and "sm120patch rollback" in f["next_step"]


def test_sglang_tree_alone_finds_the_flashinfer_beside_it_and_a_fixed_flashinfer_gets_no_backport(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site"
    sg = fetch_or_skip("sglang", "0.5.9", site)
    fetch_or_skip("flashinfer", "0.6.3", site)
    log = tmp_path / "server.log"
    log.write_text(SEED, encoding="utf-8")
    (f,) = diagnose(log, sg / "sglang")["findings"]
    assert f"--recipe {FIX}" in f["next_step"]
    # the command names a path that holds the FlashInfer beside it: the site-packages itself (one
    # journal per install root), or the FlashInfer package folder
    cmd = shlex.split(f["next_step"].split(": ", 1)[1])
    paths = [Path(a) for a in cmd[2 : cmd.index("--recipe")]]
    assert any(p.resolve() in (site.resolve(), (site / "flashinfer").resolve()) for p in paths), cmd

    fixed = tmp_path / "fixed"
    fetch_or_skip("sglang", "0.5.23", fixed)
    fetch_or_skip("flashinfer", "0.6.17", fixed)
    (f,) = diagnose(log, fixed)["findings"]
    assert f"--recipe {FIX}" not in f["next_step"]  # 0.6.17 has PR 3903 already: nothing to backport


def test_a_signature_names_the_recipe_whose_gate_it_is(tmp_path: Path) -> None:
    """trtllm-gen MoE has no SM12x kernels: on 0.5.9 the fix is the recipe that routes NVFP4 MoE to
    flashinfer_cutlass; 0.5.23 does that itself (since 0.5.13), so it gets no apply advice."""
    log = tmp_path / "server.log"
    log.write_text("RuntimeError: TrtllmGenBatchedGemmRunner: No kernel found for the given options\n")
    old = fetch_or_skip("sglang", "0.5.9", tmp_path / "old")
    (f,) = diagnose(log, old)["findings"]
    assert f["signature"] == "trtllm-gen-moe-no-kernel"
    assert f"sm120patch apply {shlex.quote(str(old.resolve()))} --recipe sglang-moe-backend-sm120" in f["next_step"]
    new = fetch_or_skip("sglang", "0.5.23", tmp_path / "new")
    (f,) = diagnose(log, new)["findings"]
    assert "sm120patch apply" not in f["next_step"] and "flashinfer_cutlass" in f["next_step"]
