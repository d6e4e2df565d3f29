#!/usr/bin/env python3
"""What `sm120patch verify`'s own client costs per request, against a bare httpx loop (issue 20).

Both send the same streamed greedy requests to the same server in the same run: the fake
OpenAI server of the tests (tests/unit/fake_openai_server.py) with no per-token delay, so the
client side is as large a share of the time as it can be. The bare loop posts, reads the SSE
lines and keeps the text; the harness is what verify runs per load (workload.run_load: bench_serving's
per-chunk timing, then metrics.summarize and answers.compare_sets). Rounds alternate which of
the two goes first; the table gives the medians, the ratio and the overhead per request, in
wall time and in this process's CPU time (the client's own work: the server is another process).

    python benchmarks/verify_overhead.py [--requests 256] [--concurrency 16] [--tokens 64] [--reps 5] [--json F]
    python benchmarks/verify_overhead.py --launches-only

It also prints what a verify costs in server launches (issue 31.2): judged together first, the
culprits by halving the set when that fails, the kept set confirmed (verify/groups.py, the code
verify runs), for 0, 1 and 2 arms that break the rule among N, against one at a time
(1 + 2*N*R). Counts, not times: every placement of the bad arms is tried (mean and worst).
benchmarks/verify_launches.py counts the launches of real verify runs on the test server against
this model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sm120patch.verify import answers, metrics, workload  # noqa: E402
from tests.unit.verify_fakes import free_port, make_tree, server_command  # noqa: E402


async def bare(url: str, prompts: list[workload.Prompt], concurrency: int, n: int, tokens: int) -> list[str]:
    """The least a client can do: post, read the stream's lines, keep the text."""
    import httpx

    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits, trust_env=False) as http:

        async def one(p: workload.Prompt) -> str:
            async with gate:
                text = []
                body = workload.payload("fake-model", p.text, tokens)
                async with http.stream("POST", url + workload.COMPLETIONS, json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            choices = json.loads(line[6:]).get("choices") or [{}]
                            text.append(choices[0].get("text") or "")
                return "".join(text)

        return await asyncio.gather(*(one(prompts[i % len(prompts)]) for i in range(n)))


def harness(url: str, prompts: list[workload.Prompt], concurrency: int, n: int, tokens: int) -> None:
    load = workload.run_load(url, "fake-model", prompts, concurrency, n, tokens)
    metrics.summarize(load)
    texts = {r.prompt_id: r.text for r in load.results if r.success}
    answers.compare_sets(prompts, texts, texts)
    assert len(texts) == min(n, len(prompts)), "the harness lost requests"


def launch_table(sizes: tuple[int, ...] = (2, 3, 5, 8, 16), repeats: tuple[int, ...] = (1, 2)) -> list[dict[str, Any]]:
    """Launches per outcome: together-then-split against one at a time, over every placement."""
    from itertools import combinations

    from sm120patch.verify import groups

    rows = []
    for r in repeats:
        for n in sizes:
            row: dict[str, Any] = {"arms": n, "repeats": r, "one_at_a_time": groups.one_at_a_time_launches(n, r)}
            for k in (0, 1, 2):
                counts = [groups.launches(n, set(bad), r) for bad in combinations(range(n), k)] if k <= n else []
                if counts:
                    row[f"bad_{k}"] = {"mean": round(statistics.fmean(counts), 1), "max": max(counts)}
            rows.append(row)
    return rows


def print_launches(rows: list[dict[str, Any]]) -> None:
    print("server launches: together first, culprits by halving, the kept set confirmed; vs one at a time")
    print("| arms | repeats | 0 bad | 1 bad (mean / worst) | 2 bad (mean / worst) | one at a time (1 + 2NR) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for x in rows:
        b1, b2 = x.get("bad_1"), x.get("bad_2")
        one = f"{b1['mean']} / {b1['max']}" if b1 else "-"
        two = f"{b2['mean']} / {b2['max']}" if b2 else "-"
        print(f"| {x['arms']} | {x['repeats']} | {x['bad_0']['max']} | {one} | {two} | {x['one_at_a_time']} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--launches-only", action="store_true", help="only the launch-count table (no server)")
    a = ap.parse_args()
    launches = launch_table()
    print_launches(launches)
    if a.launches_only:
        return
    prompts = workload.load_prompts()
    with tempfile.TemporaryDirectory(prefix="sm120patch-bench-verify-") as tmp:
        pkg = make_tree(Path(tmp) / "site")
        (pkg / "srt" / "verify_knobs" / "delay.py").write_text("VALUE = 0.0\n")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen(server_command(pkg, port, Path(tmp) / "state"), stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            for _ in range(50):
                if "ready to roll" in proc.stdout.readline():
                    break
            while workload.model_name(url) is None:
                time.sleep(0.05)
            rounds: dict[str, list[float]] = {"bare": [], "harness": []}
            cpu: dict[str, list[float]] = {"bare": [], "harness": []}  # this process only: the client's own cost
            runs = {
                "bare": lambda: asyncio.run(bare(url, prompts, a.concurrency, a.requests, a.tokens)),
                "harness": lambda: harness(url, prompts, a.concurrency, a.requests, a.tokens),
            }
            for rep in range(a.reps + 1):  # the first round warms both up, unrecorded
                order = ["bare", "harness"] if rep % 2 else ["harness", "bare"]  # neither always goes first
                for name in order:
                    t0, c0 = time.perf_counter(), time.process_time()
                    runs[name]()
                    if rep:
                        rounds[name].append(time.perf_counter() - t0)
                        cpu[name].append(time.process_time() - c0)
        finally:
            proc.kill()
            proc.wait()
    b, h = statistics.median(rounds["bare"]), statistics.median(rounds["harness"])
    ratios = [y / x for x, y in zip(rounds["bare"], rounds["harness"], strict=True)]
    res: dict[str, Any] = {
        "requests": a.requests,
        "concurrency": a.concurrency,
        "tokens": a.tokens,
        "reps": a.reps,
        "bare_s": rounds["bare"],
        "harness_s": rounds["harness"],
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "overhead_ms_per_request": (h - b) / a.requests * 1000,
        "cpu_bare_s": cpu["bare"],
        "cpu_harness_s": cpu["harness"],
        "cpu_ratio_median": statistics.median(y / x for x, y in zip(cpu["bare"], cpu["harness"], strict=True)),
        "cpu_ms_per_request": (statistics.median(cpu["harness"]) - statistics.median(cpu["bare"])) / a.requests * 1000,
        "cpus": os.cpu_count(),
        "load": [round(x, 2) for x in os.getloadavg()],
        "launches": launches,
    }
    print(
        f"verify client vs bare httpx loop, {a.requests} requests x {a.tokens} tokens at c={a.concurrency}, "
        f"{a.reps} rounds: bare {b:.3f} s, harness {h:.3f} s; ratio {res['ratio_median']:.3f} "
        f"(min {res['ratio_min']:.3f}, max {res['ratio_max']:.3f}); "
        f"{res['overhead_ms_per_request']:+.3f} ms per request (load {res['load'][0]})\n"
        f"client CPU time: ratio {res['cpu_ratio_median']:.3f}, {res['cpu_ms_per_request']:+.3f} ms per request"
    )
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
