"""The seed's crash, end to end: allreduce fusion opened on SM12x against a FlashInfer without
SM12x trtllm_comm kernels dies at CUDA-graph capture. `guard` must name it, roll back exactly
that recipe from the journal of a real SGLang tree, and relaunch the server once, in one command.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sm120patch.engine.journal import Journal
from tests.conftest import fetch_or_skip

pytestmark = pytest.mark.releases

# The error as SGLang 0.5.x servers printed it (sglang issue 15650), with the traceback's last frames.
FAKE_SERVER = textwrap.dedent(
    """
    import pathlib, sys, time
    tree, runs = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    runs.write_text(runs.read_text() + "x" if runs.exists() else "x")
    gate = (tree / "sglang/srt/layers/communicator.py").read_text()
    print("[2026-11-29 03:00:00] Capture cuda graph begin. This can take up to several minutes.", flush=True)
    if "_is_sm120_supported" in gate:
        print('  File "/usr/lib/python3/site-packages/flashinfer/jit/comm.py", line 61, in gen_trtllm_comm_module')
        print("RuntimeError: No supported CUDA architectures found for major versions [9, 10].", flush=True)
        sys.exit(1)
    print("The server is fired up and ready to roll!", flush=True)
    time.sleep(0.3)
    """
)


def test_guard_rolls_back_allreduce_and_relaunches(tmp_path: Path) -> None:
    tree = fetch_or_skip("sglang", "0.5.9", tmp_path / "site")
    cli = [sys.executable, "-m", "sm120patch"]
    # the user forced it open (--probe none), as the seed deployment did by hand
    r = subprocess.run(
        [*cli, "apply", str(tree), "--arch", "sm_120", "--probe", "none", "--no-diff"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    applied = set(Journal.open(tree).applied_ids())
    said = {x.split()[1] for x in r.stdout.splitlines() if x.strip().startswith("applied ")}
    assert "sglang-allreduce-fusion-sm120" in applied and applied == said and len(applied) > 1

    server = tmp_path / "server.py"
    server.write_text(FAKE_SERVER)
    runs = tmp_path / "runs"
    r = subprocess.run(
        [
            *cli,
            "guard",
            "--target",
            str(tree),
            "--restart",
            "--timeout",
            "60",
            "--",
            sys.executable,
            str(server),
            str(tree),
            str(runs),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert runs.read_text() == "xx"  # launched, crashed, relaunched once
    assert "ready to roll" in r.stdout
    assert "sglang-allreduce-fusion-sm120" in r.stderr  # guard's own log names what it rolled back
    left = set(Journal.open(tree).applied_ids())
    assert left == applied - {"sglang-allreduce-fusion-sm120"}
    assert "_is_sm120_supported" not in (tree / "sglang/srt/layers/communicator.py").read_text()
