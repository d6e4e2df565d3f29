"""The report a person reads at a glance: report.json (everything), report.md (the summary), and
throughput.png (output tok/s per concurrency, baseline against each candidate) when matplotlib is
installed (`pip install 'sm120patch[plot]'`); without it the JSON and the text say the same.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from sm120patch.engine.journal import atomic_write


def _median(runs: list[dict[str, Any]], c: str, *keys: str) -> float | None:
    vals = []
    for r in runs:
        if c in r:
            v: Any = r[c]["summary"]
            for k in keys:
                v = v[k]
            vals.append(v)
    return statistics.median(vals) if vals else None


def _mean(runs: list[dict[str, Any]], c: str, key: str) -> float | None:
    vals = [r[c]["summary"][key] for r in runs if c in r]
    return statistics.fmean(vals) if vals else None


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


_TAG = {
    "kept": "KEEP    ",
    "rolled back": "ROLLBACK",
    "left as it was": "UNJUDGED",
    "inconclusive, kept": "INCONCLUSIVE (kept)",
    "inconclusive, rolled back": "INCONCLUSIVE (rolled back)",
    "not exercised by this workload": "NOT EXERCISED (kept)",
}


def lines(result: dict[str, Any]) -> list[str]:
    """One line per candidate: kept or rolled back, and the figures or the reasons."""
    out = [f"together: {rid}: {why}" for rid, why in (result.get("together") or {}).items()]
    for d in result["decisions"]:
        out.append(f"{_TAG.get(d['verdict'], d['verdict'])} {d['name']} ({', '.join(d['recipes'])}): {d['summary']}")
    for x in result.get("leftovers") or []:
        pids = ", ".join(str(p["pid"]) for p in x["processes"])
        alive = f"still running: {', '.join(map(str, x['survived']))}" if x["survived"] else "stopped"
        out.append(f"launch {x['launch']} left processes outside its group (setsid): {pids}; {alive}")
    return out


def markdown(result: dict[str, Any]) -> str:
    opts = result["options"]
    runs = result["runs"]
    md = ["# sm120patch verify", ""]
    md.append(f"Server: `{' '.join(opts['command'])}` at {opts['url']}")
    names = list(dict.fromkeys(s["arm"] for s in result["schedule"] if s["arm"] != "baseline"))
    tag = {n: "B" if len(names) == 1 else f"B{i + 1}" for i, n in enumerate(names)}
    order = " ".join("A" if s["arm"] == "baseline" else tag[s["arm"]] for s in result["schedule"])
    legend = ", ".join(f"{t} = {n}" for n, t in tag.items())
    md.append(
        f"Workload: concurrency {', '.join(map(str, opts['concurrencies']))}; {opts['output_len']} output tokens a "
        f"request, greedy; {opts['repeats']} repeat(s), launches in the order {order} (A = baseline, {legend})"
    )
    md += [
        "",
        "## Decisions",
        "",
        "| candidate | recipes | verdict | figures or reasons |",
        "| --- | --- | --- | --- |",
    ]
    for d in result["decisions"]:
        md.append(f"| {d['name']} | {', '.join(d['recipes'])} | {d['verdict']} | {d['summary']} |")
    together = result.get("together") or {}
    if together:
        md += ["", "Judged together (the dependency graph):", ""]
        md += [f"- {rid}: {why}" for rid, why in together.items()]
    md += ["", "## Throughput (mean over runs) and latency (median over runs)", ""]
    md.append(
        "| arm | c | output tok/s | change | noise | TTFT median / p99 ms | TPOT median / p99 ms | ITL median ms |"
    )
    md.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for c in map(str, opts["concurrencies"]):
        for arm, rs in runs.items():
            if not rs:
                continue
            d = next((x for x in result["decisions"] if x["name"] == arm), None)
            t = (d or {}).get("throughput", {}).get(c) or {}
            change = "" if t.get("delta") is None else f"{t['delta'] * 100:+.1f}%"
            noise = "" if t.get("noise") is None else f"+-{t['noise'] * 100:.1f}%"
            md.append(
                f"| {arm} | {c} | {_fmt(_mean(rs, c, 'output_throughput'))} | {change} | {noise} | "
                f"{_fmt(_median(rs, c, 'ttft_ms', 'median'))} / {_fmt(_median(rs, c, 'ttft_ms', 'p99'))} | "
                f"{_fmt(_median(rs, c, 'tpot_ms', 'median'), '.2f')} / "
                f"{_fmt(_median(rs, c, 'tpot_ms', 'p99'), '.2f')} | "
                f"{_fmt(_median(rs, c, 'itl_ms', 'median'), '.2f')} |"
            )
    md += ["", "## Answers", ""]
    for d in result["decisions"]:
        a = d.get("answers") or {}
        if not a:
            continue
        md.append(
            f"- {d['name']}: agree {a['agree']}/{a['compared']} {a.get('by', 'by characters')} (exact {a['exact']}), "
            f"known answers {a['correct_cand']}/{a['known']} (baseline {a['correct_base']}), "
            f"collapses {len(a['collapses'])}"
        )
        for x in a["divergences"][:10]:
            where = f"character {x['at_char']}"
            if x.get("at_token") is not None:
                where = f"token {x['at_token']} (tokens agree {x['token_agreement']:.0%}), {where}"
            md.append(f"  - {x['prompt']} at c={x['concurrency']}: first differs at {where}")
    fails = [x for x in result["launches"] if x["outcome"] != "ready"]
    if fails:
        md += ["", "## Launches that did not serve", ""]
        md += [f"- {x['arm']}: {x['outcome']}: {x['cause']} (log `{x['log']}`)" for x in fails]
    left = result.get("leftovers") or []
    if left:
        md += ["", "## Processes a launch left outside its group", ""]
        for x in left:
            procs = ", ".join(f"{p['pid']} (`{p['command']}`)" for p in x["processes"])
            alive = f"; still running: {', '.join(map(str, x['survived']))}" if x["survived"] else "; stopped"
            md.append(f"- launch {x['launch']}: {procs}{alive}")
    md += ["", "How to read this: docs/verify.md.", ""]
    return "\n".join(md)


def plot(result: dict[str, Any], path: Path) -> bool:
    """throughput.png, or False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cs = [str(c) for c in result["options"]["concurrencies"]]
    verdict = {d["name"]: "kept" if d["keep"] else "rolled back" for d in result["decisions"]}
    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, rs in result["runs"].items():
        if not rs:
            continue
        med = [_mean(rs, c, "output_throughput") or 0.0 for c in cs]
        lo = [min(r[c]["summary"]["output_throughput"] for r in rs if c in r) for c in cs]
        hi = [max(r[c]["summary"]["output_throughput"] for r in rs if c in r) for c in cs]
        ax.errorbar(
            [int(c) for c in cs],
            med,
            yerr=[[m - a for m, a in zip(med, lo, strict=True)], [b - m for m, b in zip(med, hi, strict=True)]],
            marker="o",
            capsize=4,
            label=arm if arm == "baseline" else f"{arm} ({verdict.get(arm, 'no verdict')})",
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks([int(c) for c in cs], cs)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tok/s (mean, min-max)")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write(result: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """report.json, report.md and (with matplotlib) throughput.png in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "report.json", "markdown": out_dir / "report.md"}
    atomic_write(paths["json"], json.dumps(result, indent=2, default=str).encode() + b"\n", mode=0o644)
    atomic_write(paths["markdown"], markdown(result).encode(), mode=0o644)
    png = out_dir / "throughput.png"
    if plot(result, png):
        paths["plot"] = png
    return {k: str(v) for k, v in paths.items()}
