"""What a run check's kernel timings say, in words: per shape, the candidate's time over the baseline's.

The checks measure (checks/kernel_timing.py); this reads their record back in the tool, for the
verdict's reason, the `probe --probe run` table and `verify`. A ratio below 1 is the candidate
faster. `side` is "slower" only where even the lower quartile of the paired ratios is above 1 (the
spread included), "faster" where the upper quartile is below 1, else "level". Kernel timings
never change a verdict: whether an opened gate helps is for the end-to-end A/B to say.
"""

from __future__ import annotations

from typing import Any

from sm120patch.probes.run.ranks import Run

NO_DECISION = "kernel timings decide nothing: the end-to-end A/B is the deciding measure"


def timing_of(run: Run) -> dict[str, Any] | None:
    """The timing record of a run: rank 0's (every rank holds the same slowest-rank samples;
    rank 0 adds the topology), or the first rank's that has one."""
    records = [(c.result or {}).get("timing") for c in run.children]
    return next((r for r in records if isinstance(r, dict)), None)


def of_verdict(verdict: dict[str, Any]) -> dict[str, Any] | None:
    """The timing record in a verdict's dict (`probe --json`, the probe cache): for `verify`."""
    t = ((verdict.get("evidence") or {}).get("run") or {}).get("timing")
    return t if isinstance(t, dict) else None


def _shape(row: dict[str, Any]) -> str:
    return "x".join(str(s) for s in row.get("shape") or [])


def _ratio(row: dict[str, Any]) -> str:
    r, lo, hi = row.get("ratio"), row.get("ratio_q1"), row.get("ratio_q3")
    if r is None:
        return "n/a"
    spread = f" ({lo:.2f}-{hi:.2f})" if lo is not None and hi is not None else ""
    return f"{r:.2f}x{spread}"


def slower(timing: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The rows where the candidate is slower than the baseline beyond the spread."""
    return [r for r in (timing or {}).get("rows") or [] if r.get("side") == "slower"]


def links(timing: dict[str, Any]) -> str:
    """How the GPUs were joined, from the record: `0-1 NV18, P2P yes`."""
    topo = timing.get("topology") or {}
    parts = [f"{pair} {link}" for pair, link in (topo.get("links") or {}).items() if link]
    p2p = topo.get("p2p") or {}
    if p2p:
        parts.append("P2P " + ("yes" if all(p2p.values()) else "no" if not any(p2p.values()) else "partly"))
    return ", ".join(parts) or "topology not recorded"


def summary(timing: dict[str, Any] | None) -> str:
    """One clause for the verdict's reason ("" when nothing was timed)."""
    if not timing:
        return ""
    if timing.get("skipped"):
        return f"not timed ({timing['skipped']})"
    rows = timing.get("rows") or []
    ratios = [r["ratio"] for r in rows if r.get("ratio") is not None]
    if not ratios:
        return ""
    where = f"{timing.get('world_size', '?')} ranks, {links(timing)}"
    head = (
        f"timing against {timing.get('baseline', 'the baseline')} ({where}): candidate/baseline "
        f"{min(ratios):.2f}x to {max(ratios):.2f}x in {len(rows)} comparison(s) (path x shape)"
    )
    slow = slower(timing)
    if slow:
        shown = ", ".join(f"{r['candidate']} {_shape(r)} {_ratio(r)}" for r in slow[:4])
        more = f" and {len(slow) - 4} more" if len(slow) > 4 else ""
        head += f"; the candidate is slower at {shown}{more}"
    else:
        head += "; slower at no shape"
    return f"{head} ({NO_DECISION})"


def table(timing: dict[str, Any] | None) -> list[str]:
    """Lines for `probe --probe run`: one per shape, a column per candidate (ratio and its IQR)."""
    if not timing:
        return []
    if timing.get("skipped"):
        return [f"timing: not timed ({timing['skipped']})"]
    rows = timing.get("rows") or []
    if not rows:
        return []
    cands = list(dict.fromkeys(r["candidate"] for r in rows))
    by_shape: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_shape.setdefault(_shape(r), {})[r["candidate"]] = r
    baseline = timing.get("baseline", "baseline")
    out = [
        f"timing: {timing.get('what', 'candidate against baseline')}; {timing.get('timer', '?')}, median of "
        f"{timing.get('repeats', '?')} x {timing.get('inner', '?')} calls (IQR of the paired ratios); {links(timing)}",
        f"  {'tokens x hidden':<16}" + "".join(f"{c:<22}" for c in cands) + f"{baseline} ms",
    ]
    for shape, got in by_shape.items():
        cells = []
        for c in cands:
            r = got.get(c)
            cell = "-" if r is None else _ratio(r) + (" *" if r.get("side") == "slower" else "")
            cells.append(f"{cell:<22}")
        base = next(iter(got.values())).get("baseline_ms") or {}
        ms = f"{base['median']:.4g}" if base.get("median") is not None else "n/a"
        out.append(f"  {shape:<16}" + "".join(cells) + ms)
    slow = slower(timing)
    out.append(f"  * slower beyond the spread ({len(slow)} of {len(rows)}); {NO_DECISION}")
    if timing.get("sglang_max_tokens"):
        out.append(
            f"  SGLang takes the fused path up to {timing['sglang_max_tokens']} tokens; larger rows are for reference"
        )
    return out


def markdown(timing: dict[str, Any] | None) -> list[str]:
    """The same rows as a Markdown table (docs/gpu-validation.md): ratio (IQR) and median ms per candidate."""
    rows = (timing or {}).get("rows") or []
    if not rows:
        return []
    cands = list(dict.fromkeys(r["candidate"] for r in rows))
    baseline = (timing or {}).get("baseline", "baseline")
    head = ["tokens x hidden", *(f"{c} / {baseline}" for c in cands), *(f"{c} ms" for c in cands), f"{baseline} ms"]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    by_shape: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_shape.setdefault(_shape(r), {})[r["candidate"]] = r
    for shape, got in by_shape.items():
        ratios = [_ratio(got[c]) + (" **slower**" if got[c].get("side") == "slower" else "") if c in got else "-"
                  for c in cands]  # fmt: skip
        ms = [f"{got[c]['candidate_ms']['median']:.4g}" if c in got else "-" for c in cands]
        base = next(iter(got.values()))["baseline_ms"]["median"]
        out.append("| " + " | ".join([shape, *ratios, *ms, f"{base:.4g}"]) + " |")
    return out


def main(argv: list[str]) -> int:
    """`tools/timing_table.py FILE.json [--markdown]`: the table of a saved verdict (`probe --json`
    or tools/run_only.py output); 1 if it holds no timing, 2 for a file it cannot read."""
    import json
    import sys
    from pathlib import Path

    if not argv or argv[0].startswith("-"):
        print("usage: python3 tools/timing_table.py VERDICT.json [--markdown]", file=sys.stderr)
        return 2
    try:
        data = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"timing_table.py: {argv[0]}: {e}; pass the JSON that probe --json or run_only.py wrote", file=sys.stderr)
        return 2
    verdict = (data.get("verdicts") or [data])[0] if isinstance(data, dict) else {}
    timing = of_verdict(verdict)
    lines = markdown(timing) if "--markdown" in argv else table(timing)
    print("\n".join(lines) if lines else "no timing in this verdict")
    return 0 if lines else 1
