#!/usr/bin/env python3
"""How fast `sm120patch diagnose` reads a big log, as a ratio against `grep -c` over the same file.

Two logs of --mb megabytes each, written to a temp file:

  healthy     a generated SGLang server log (decode-progress lines, INFO chatter) with the seed's crash at
              the very end: nearly every line is skipped by the prefilter
  crash-loop  a server in a restart loop: each restart's startup lines (its own timestamps), then the crash
              excerpt of one real SGLang case of the corpus (tests/corpus/triage/), cycling through them: the
              same tracebacks over and over, which per-line memoization reads once

Then, each --reps times, whole processes as a user runs them:

  grep     `grep -c Error FILE` (the floor: one pass over the bytes, no Python)
  diagnose `python -m sm120patch diagnose FILE --json --quiet` (must name the crash at the end, or for the
           crash loop a fatal finding)
  before   optionally the same command from another checkout (--before /work/main)

The table shows the median wall time and diagnose/grep. A script, not a test.

    python benchmarks/triage_bench.py                 # 50 MB each
    python benchmarks/triage_bench.py --mb 5 --before /work/main
    python benchmarks/triage_bench.py --log crash-loop
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


def crash_loop_excerpts() -> list[str]:
    """The crash excerpts of the corpus's SGLang cases (real logs from public threads)."""
    sys.path.insert(0, str(REPO))
    from tools.triage_score import load_corpus

    return [c.excerpt for c in load_corpus() if c.framework == "sglang"]


STARTUP = (
    "[2026-01-02 {h:02d}:{m:02d}:{s:02d}] server_args=ServerArgs(model_path='/models/m', tp_size=2, port=30000)\n"
    "[2026-01-02 {h:02d}:{m:02d}:{s:02d} TP0] Init torch distributed begin.\n"
    "[2026-01-02 {h:02d}:{m:02d}:{s:02d} TP0] Load weight begin. avail mem=93.12 GB\n"
    "[2026-01-02 {h:02d}:{m:02d}:{s:02d} TP0] Load weight end. type=Qwen3ForCausalLM, avail mem=61.02 GB\n"
    "[2026-01-02 {h:02d}:{m:02d}:{s:02d} TP0] Capture cuda graph begin. This can take up to several minutes.\n"
)


def write_crash_loop(path: Path, mb: int) -> int:
    """A restart loop's log of about `mb` MB: startup lines, then one real crash excerpt, again and again."""
    excerpts = crash_loop_excerpts()
    target = mb * 1024 * 1024
    n = size = 0
    with path.open("w", encoding="utf-8") as f:
        while size < target:
            t = n * 7
            text = STARTUP.format(h=t // 3600 % 24, m=t // 60 % 60, s=t % 60) + excerpts[n % len(excerpts)]
            text += "" if text.endswith("\n") else "\n"
            f.write(text)
            size += len(text)
            n += 1
    return sum(1 for _ in path.open("rb"))


LOGS = {"healthy": write_log, "crash-loop": write_crash_loop}


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    """One whole process, run from / so `python -m` imports the checkout PYTHONPATH names."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/")
    return time.perf_counter() - t0, r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--log", choices=sorted(LOGS), action="append", help="only this log (repeatable)")
    ap.add_argument("--before", type=Path, help="also time the diagnose of this checkout (e.g. /work/main)")
    ap.add_argument("--json", type=Path, help="write the raw figures here")
    a = ap.parse_args()
    figures: dict[str, dict[str, object]] = {}
    print("| log | MB | lines | command | median s | runs | x grep -c |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for kind in a.log or list(LOGS):
        with tempfile.TemporaryDirectory(prefix="sm120patch-triage-bench-") as tmp:
            got = bench_one(kind, Path(tmp) / "server.log", a.mb, a.reps, a.before)
        if got is None:
            return 1
        figures[kind] = got
        times: dict[str, list[float]] = got["times"]  # type: ignore[assignment]
        med = {k: statistics.median(v) for k, v in times.items()}
        for k, v in times.items():
            print(f"| {kind} | {a.mb} | {got['lines']} | {k} | {med[k]:.2f} | {len(v)} | {med[k] / med['grep']:.1f} |")
    if a.json:
        a.json.write_text(json.dumps({"mb": a.mb, "logs": figures}, indent=2))
    return 0


def bench_one(kind: str, log: Path, mb: int, reps: int, before: Path | None) -> dict[str, object] | None:
    """Write the log, time grep and diagnose (and the other checkout's) on it; None when diagnose failed."""
    lines = LOGS[kind](log, mb)
    diagnose = [sys.executable, "-m", "sm120patch", "diagnose", str(log), "--json"]
    cmds: dict[str, tuple[list[str], dict[str, str] | None]] = {
        "grep": (["grep", "-c", "Error", str(log)], None),
        "diagnose": ([*diagnose, "--quiet"], dict(os.environ, PYTHONPATH=str(REPO))),
    }
    if before:
        env = dict(os.environ, PYTHONPATH=str(before), SM120PATCH_RECIPES=str(before / "patches"))
        cmds["before"] = (diagnose, env)  # an older checkout may not know --quiet (it showed no progress off a tty)
    times: dict[str, list[float]] = {}
    for name, (cmd, env) in cmds.items():
        timed(cmd, env)  # warm the page cache
        for _ in range(reps if name != "before" else 1):
            dt, r = timed(cmd, env)
            if name != "grep" and not _named(kind, name, r, lines):
                return None
            times.setdefault(name, []).append(dt)
    return {"lines": lines, "times": times}


def _named(kind: str, name: str, r: subprocess.CompletedProcess[str], lines: int) -> bool:
    """diagnose read every line and named the crash (healthy: the seed's; crash loop: a fatal finding)."""
    if not r.stdout.strip():
        print(f"triage_bench: {kind}: {name} printed nothing: {r.stderr.strip()[-400:]}", file=sys.stderr)
        return False
    data = json.loads(r.stdout)
    named = [f["signature"] for f in data["findings"] if f["fatal"]]
    ok = ("flashinfer-jit-arch-excluded" in named) if kind == "healthy" else bool(named)
    if not ok or data["lines_read"] != lines:
        print(f"triage_bench: {kind}: {name} did not name the crash: {named}", file=sys.stderr)
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
