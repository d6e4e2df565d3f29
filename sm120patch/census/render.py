"""The census part of preflight's text: a table per distribution and GPU, then each problem."""

from __future__ import annotations

import os
from typing import Any

_STATUS = {
    "ok": "ok",
    "jit": "ok (JIT)",
    "lto": "ok (LTO)",
    "unknown": "?",
    "partial": "partial",
    "some": "SOME",
    "none": "NO",
}


def _span(names: list[str]) -> str:
    return " ".join(names) if len(names) <= 6 else f"{names[0]} .. {names[-1]} ({len(names)})"


def _modules(mods: list[str]) -> str:
    """A few modules by name; many (thousands of loose cubins) by count and common folder."""
    if len(mods) <= 4:
        return ", ".join(mods)
    common = os.path.commonpath(mods)
    return (
        f"{len(mods)} files under {common}/ (e.g. {os.path.basename(mods[0])})"
        if common
        else (", ".join(mods[:3]) + f" and {len(mods) - 3} more")
    )


def render_lines(report: dict[str, Any]) -> list[str]:
    """The census part of preflight's text: a table, then per problem what you will see and the fix."""
    rows = report["distributions"]
    where = ", ".join(report["site_packages"]) or "no site-packages found"
    out = [
        f"census: {len(rows)} distributions with CUDA code in {where} "
        f"({report['files_read']} files read, {report['files_cached']} from cache, {report['elapsed_s']:.2f} s)"
    ]
    pt = report.get("ptxas")
    if pt:
        targets = ", ".join(
            f"{a} {'yes' if t['ok'] else 'no (' + t['why'] + ')'}" for a, t in (pt.get("targets") or {}).items()
        )
        out.append(f"  Triton's ptxas: {pt['path']} ({pt['source']}; CUDA {pt['cuda'] or '?'}) {targets}".rstrip())
        if pt.get("error"):
            out.append(f"    {pt['error']}")
    else:
        out.append("  Triton's ptxas: triton not installed and TRITON_PTXAS_PATH not set")
    if rows:
        w = max(len(r["name"]) for r in rows)
        archs = report["archs"]
        out.append(f"  {'package':<{w}}  {'version':<14} " + " ".join(f"{a:<8}" for a in archs) + "  SASS / PTX")
        for r in rows:
            cells = " ".join(f"{_STATUS[r['gpus'][a]['status']]:<8}" for a in archs)
            ptx = _span(r["ptx"]) + (f" (ISA {', '.join(r['ptx_isa'])})" if r["ptx_isa"] else "") if r["ptx"] else "-"
            lto = f" / LTO {_span(r['lto'])}" if r.get("lto") else ""
            out.append(f"  {r['name']:<{w}}  {r['version'][:14]:<14} {cells}  {_span(r['sass']) or '-'} / {ptx}{lto}")
    for p in report["problems"]:
        shown = _modules(p["modules"])
        what = "have no image for" if p["status"] in ("none", "some") else "lack code in some translation units for"
        out.append(f"  {p['package']} {p['version']} on {p['gpu']}: {shown} {what} {p['gpu']}")
        for e in p["you_will_see"]:
            out.append(f"    you will see: {e}")
        if p["fix"]:
            out.append(f"    fix: {p['fix']}")
        if p.get("note"):
            out.append(f"    note: {p['note']}")
    for r in rows:
        other = []  # one line per distribution for units kept for other GPUs: a fact, not an alarm
        unknown: dict[tuple[str, str], list[str]] = {}  # (module, why) -> GPUs
        for gpu, g in r["gpus"].items():
            mods = [v for v in g["modules"].values() if v.get("other_arch_units")]
            if mods:
                n, units = sum(v["other_arch_units"] for v in mods), sum(v["units"] for v in mods)
                other.append(f"{gpu} {n} of {units} units in {len(mods)} module{'s' if len(mods) > 1 else ''}")
            for p in g.get("unknown", []):
                unknown.setdefault((p, g["modules"][p]["why"]), []).append(gpu)
        for (p, why), gpus in unknown.items():
            out.append(f"  note: {r['name']} {r['version']} on {', '.join(gpus)}: {p}: {why}")
        if other:
            out.append(
                f"  note: {r['name']} {r['version']}: units built only for other architectures (kernels the "
                f"library picks on those GPUs, never launched here; not counted as missing): {'; '.join(other)}"
            )
        for u in r["unreadable"]:
            out.append(f"  note: {r['name']}: {u['path']} could not be read ({u['error']}); not judged")
        for c in r.get("cut_short", []):
            out.append(f"  note: {r['name']}: {c['path']}: fatbin {c['note']}; judged on what was read")
    for n in report["notes"]:
        out.append(f"  note: {n}")
    return out


def _md(text: str) -> str:
    """A table cell: pipes escaped, one line."""
    return " ".join(str(text).split()).replace("|", "\\|")


def render_markdown(machine: dict[str, Any], report: dict[str, Any]) -> str:
    """The census for pasting into an upstream bug report (as `python -m sglang.check_env` and
    vLLM's collect_env do): GPU, driver, CUDA, torch, then every distribution's verdict per GPU."""
    gpus = machine.get("gpus") or []
    cuda = machine.get("cuda") or {}
    torch = machine.get("torch") or {}
    out = ["### Environment (sm120patch census)", "", "| | |", "|---|---|"]
    gpu_line = "; ".join(f"{g['name']} ({g['arch']})" for g in gpus) or "none detected"
    if machine.get("overridden"):
        gpu_line = f"none asked (judged for {', '.join(report['archs'])}, from --arch)"
    out.append(f"| GPU | {_md(gpu_line)} |")
    out.append(f"| driver | {_md(machine.get('driver') or '-')} |")
    out.append(f"| CUDA toolkit | {_md(cuda.get('version') or 'not found')} |")
    if torch:
        version, tcuda = _md(torch.get("version") or "not importable"), _md(torch.get("cuda") or "-")
        out.append(f"| torch | {version} (CUDA {tcuda}; {_md(' '.join(torch.get('arch_list') or []) or '-')}) |")
    else:
        out.append("| torch | not asked |")
    out.append(f"| site-packages | {_md(', '.join(report['site_packages']) or '-')} |")
    archs = report["archs"]
    out += ["", "| distribution | version | " + " | ".join(archs) + " | SASS / PTX / LTO |"]
    out.append("|---|---|" + "---|" * len(archs) + "---|")
    for r in report["distributions"]:
        cells = " | ".join(_STATUS[r["gpus"][a]["status"]] for a in archs)
        code = f"{_span(r['sass']) or '-'} / {_span(r['ptx']) or '-'} / {_span(r.get('lto') or []) or '-'}"
        out.append(f"| {_md(r['name'])} | {_md(r['version'])} | {cells} | {_md(code)} |")
    problems = report["problems"]
    if problems:
        out += ["", "Problems:"]
        for p in problems:
            see = "; ".join(p["you_will_see"])
            out.append(f"- {p['package']} {p['version']} on {p['gpu']}: {_md(_modules(p['modules']))} ({see})")
    notes = [n for r in report["distributions"] for g in r["gpus"].values() for n in g.get("unknown", [])]
    if notes:
        out += ["", "Cannot tell from the headers: " + _md(", ".join(sorted(set(notes))))]
    out += ["", f"(sm120patch census: {report['files_read'] + report['files_cached']} files)"]
    return "\n".join(out)
