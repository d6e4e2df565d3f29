"""Throughput and latency of one load, defined as SGLang's `python -m sglang.bench_serving` defines them.

From `calculate_metrics` in sglang/bench_serving.py (SGLang 0.5.9), for the successful requests:

- output throughput = sum of output lengths / dur_s, where dur_s runs from before the first request
  to after the last (`benchmark_duration`), and an output length is `usage.completion_tokens`
  (else max_tokens);
- TTFT = time from sending a request to its first streamed chunk with text;
- TPOT = (latency - TTFT) / (output_len - 1), for requests with output_len > 1;
- ITL = every gap between consecutive chunks with text, over all requests (not retokenized:
  bench_serving retokenizes only with speculative decoding's accept length);
- E2E latency = time from sending to the stream's last line.

Statistics as there: mean, median, population standard deviation (`np.std` is `statistics.pstdev`)
and percentiles by linear interpolation (`np.percentile`'s default is `statistics.quantiles`
with method="inclusive"). Times are reported in milliseconds, as bench_serving prints them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from sm120patch.verify.workload import Load


def percentile(values: Sequence[float], p: int) -> float:
    """`np.percentile(values, p)` (linear interpolation between closest ranks)."""
    if not values:
        return 0.0
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def _stats(values: Sequence[float], ps: Sequence[int]) -> dict[str, float]:
    ms = [v * 1000.0 for v in values]
    out = {
        "mean": statistics.fmean(ms) if ms else 0.0,
        "median": statistics.median(ms) if ms else 0.0,
        "std": statistics.pstdev(ms) if ms else 0.0,
    }
    out.update({f"p{p}": percentile(ms, p) for p in ps})
    return out


def summarize(load: Load) -> dict[str, Any]:
    """bench_serving's figures for one load (ms for times, tokens/s for throughput)."""
    ok = [r for r in load.results if r.success]
    tpots = [(r.latency - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1]
    itls = [x for r in ok for x in r.itl]
    dur = load.duration if load.duration > 0 else float("inf")
    out_tokens = sum(r.output_len for r in ok)
    return {
        "concurrency": load.concurrency,
        "completed": len(ok),
        "failed": len(load.results) - len(ok),
        "duration_s": load.duration,
        "output_tokens": out_tokens,
        "output_throughput": out_tokens / dur,
        "request_throughput": len(ok) / dur,
        "ttft_ms": _stats([r.ttft for r in ok], (99,)),
        "tpot_ms": _stats(tpots, (99,)),
        "itl_ms": _stats(itls, (95, 99)),
        "e2e_ms": _stats([r.latency for r in ok], (90, 99)),
        "errors": sorted({r.error for r in load.results if not r.success})[:5],
    }
