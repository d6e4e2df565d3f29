#!/usr/bin/env python3
"""How fast `sm120patch diagnose` reads a big log, as a ratio against `grep -c` over the same file.

A generated server log (SGLang decode-progress lines, INFO chatter, tracebacks of handled
warnings, and the seed's crash at the very end) of --mb megabytes is written to a temp file.
Then, each --reps times, whole processes as a user runs them:

  grep     `grep -c Error FILE` (the floor: one pass over the bytes, no Python)
  diagnose `python -m sm120patch diagnose FILE --json` (must name the crash at the end)
  before   optionally the same command from another checkout (--before /work/main)

The table shows the median wall time and diagnose/grep. A script, not a test.

    python benchmarks/triage_bench.py                 # 50 MB
    python benchmarks/triage_bench.py --mb 5 --before /work/main
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

DECODE = (
    "[2026-01-02 10:{m:02d}:{s:02d} TP{tp}] Decode batch. #running-req: {r}, #token: {t}, token usage: 0.{u:02d}, "
    "cuda graph: True, gen throughput (token/s): {g}.{u:02d}, #queue-req: 0, \n"
)
CHATTER = (
    '[2026-01-02 10:00:00 TP0] INFO:     127.0.0.1:{p} - "POST /v1/chat/completions HTTP/1.1" 200 OK\n',
    "[2026-01-02 10:00:00 TP0] Prefill batch. #new-seq: 1, #new-token: 512, #cached-token: 0, token usage: 0.01\n",
)
CRASH = (
    "[2026-01-02 11:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/lib/python3/site-packages/flashinfer/jit/comm.py", line 61, in gen_trtllm_comm_module\n'
    "RuntimeError: No supported CUDA architectures found for major versions [9, 10].\n"
)


def write_log(path: Path, mb: int) -> int:
    """A log of about `mb` MB; returns its line count."""
    target = mb * 1024 * 1024
    n = size = 0
    with path.open("w", encoding="utf-8") as f:
        while size < target:
            block = []
            for i in range(1000):
                k = n + i
                if k % 50 == 0:
                    block.append(CHATTER[k % 2].format(p=40000 + k % 20000))
                else:
                    block.append(
                        DECODE.format(m=k // 60 % 60, s=k % 60, tp=k % 8, r=k % 64, t=k % 9000, u=k % 100, g=k % 900)
                    )
            text = "".join(block)
            f.write(text)
            size += len(text)
            n += 1000
        f.write(CRASH)
    return n + CRASH.count("\n")


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    """One whole process, run from / so `python -m` imports the checkout PYTHONPATH names."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/")
    return time.perf_counter() - t0, r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--before", type=Path, help="also time the diagnose of this checkout (e.g. /work/main)")
    ap.add_argument("--json", type=Path, help="write the raw figures here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sm120patch-triage-bench-") as tmp:
        log = Path(tmp) / "server.log"
        lines = write_log(log, a.mb)
        cmds: dict[str, tuple[list[str], dict[str, str] | None]] = {
            "grep": (["grep", "-c", "Error", str(log)], None),
            "diagnose": (
                [sys.executable, "-m", "sm120patch", "diagnose", str(log), "--json"],
                dict(os.environ, PYTHONPATH=str(REPO)),
            ),
        }
        if a.before:
            env = dict(os.environ, PYTHONPATH=str(a.before), SM120PATCH_RECIPES=str(a.before / "patches"))
            cmds["before"] = ([sys.executable, "-m", "sm120patch", "diagnose", str(log), "--json"], env)
        times: dict[str, list[float]] = {}
        for name, (cmd, env) in cmds.items():
            timed(cmd, env)  # warm the page cache
            for _ in range(a.reps if name != "before" else 1):
                dt, r = timed(cmd, env)
                if name != "grep":
                    if not r.stdout.strip():
                        print(f"triage_bench: {name} printed nothing: {r.stderr.strip()[-400:]}", file=sys.stderr)
                        return 1
                    data = json.loads(r.stdout)
                    named = [f["signature"] for f in data["findings"] if f["fatal"]]
                    if "flashinfer-jit-arch-excluded" not in named or data["lines_read"] != lines:
                        print(f"triage_bench: {name} did not name the crash: {named}", file=sys.stderr)
                        return 1
                times.setdefault(name, []).append(dt)
    med = {k: statistics.median(v) for k, v in times.items()}
    size = log_mb = a.mb
    print(f"log: {size} MB, {lines} lines (generated SGLang decode log, the seed's crash at the end)")
    print("| command | median s | runs | x grep -c |")
    print("| --- | --- | --- | --- |")
    for k, v in times.items():
        print(f"| {k} | {med[k]:.2f} | {len(v)} | {med[k] / med['grep']:.1f} |")
    if a.json:
        a.json.write_text(json.dumps({"mb": log_mb, "lines": lines, "times": times}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
