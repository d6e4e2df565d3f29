"""The gate map and the two-release diff as text for people, markdown for a tracking issue, JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sm120patch.gates.site import CANDIDATE, COVERED, OPEN, SHUT, UNKNOWN, Site

if TYPE_CHECKING:
    from sm120patch.gates import GateMap
    from sm120patch.gates.diff import GateDiff

_TITLES = {
    CANDIDATE: "Candidates: shut to SM12x, and FlashInfer has the kernels behind them",
    UNKNOWN: "Unknown: shut or unreadable; nothing says whether the kernels exist",
    COVERED: "Covered by a recipe",
    SHUT: "Shut, and right to stay shut: no SM12x kernels behind them",
    OPEN: "Already open to SM12x",
}


def _one_line(text: str, width: int = 100) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def _archs(names: list[str] | None) -> str:
    if names is None:
        return "unknown"
    return ", ".join(names) if names else "none"


def _tree_line(m: GateMap) -> str:
    t = m.target
    fi = m.flashinfer
    fi_text = f"FlashInfer {fi.version} at {fi.location}" if fi is not None and fi.found else "no FlashInfer"
    return (
        f"{t.package} {t.version or '(version unknown)'} at {t.root}: {len(m.sites)} gated sites "
        f"({m.parsed} of {m.files} files parsed); judged against {fi_text}"
    )


def text(m: GateMap, limit: int | None = None) -> str:
    out = [_tree_line(m), "  " + ", ".join(f"{n} {v}" for v, n in m.counts().items())]
    for verdict in _TITLES:
        group = [s for s in m.sites if s.verdict == verdict]
        if not group:
            continue
        out += ["", f"{_TITLES[verdict]} ({len(group)}):"]
        shown = group if limit is None or verdict in (CANDIDATE, COVERED) else group[:limit]
        for s in shown:
            out.append(f"  {s.file}:{s.line} {s.function}")
            out.append(f"      {_one_line(s.test)}   [runs on: {_archs(s.path)}]")
            if s.reason:
                out.append(f"      {_one_line(s.reason, 140)}")
        if len(shown) < len(group):
            out.append(f"  ... and {len(group) - len(shown)} more (--all, or --json)")
    recipes = [r for r in m.recipes if r.sites or r.locations]
    if recipes:
        out += ["", "Recipes on this tree:"]
        for r in m.recipes:
            where = ", ".join(sorted({f"{s.file}:{s.function}" for s in r.sites})) or "no gated site"
            out.append(f"  {r.status:<14} {r.id}: {where}")
    return "\n".join(out)


def _md_escape(text: str) -> str:
    return _one_line(text, 160).replace("|", "\\|")


def markdown(m: GateMap, header: str = "") -> str:
    t = m.target
    out = [header] if header else []
    out += [
        f"## Gates in {t.package} {t.version or '(version unknown)'}",
        "",
        f"{len(m.sites)} gated sites ({m.parsed} of {m.files} files parsed). "
        + ", ".join(f"{n} {v}" for v, n in m.counts().items())
        + ".",
        "",
    ]
    for verdict in _TITLES:
        group = [s for s in m.sites if s.verdict == verdict]
        if not group:
            continue
        out += [f"### {_TITLES[verdict]} ({len(group)})", ""]
        out += ["| file:line | function | test | runs on | why |", "| --- | --- | --- | --- | --- |"]
        for s in group:
            out.append(
                f"| `{s.file}:{s.line}` | `{s.function}` | `{_md_escape(s.test)}` | {_archs(s.path)} | "
                f"{_md_escape(s.reason)} |"
            )
        out.append("")
    if m.recipes:
        out += ["### Recipes", "", "| recipe | status | sites |", "| --- | --- | --- |"]
        for r in m.recipes:
            where = "<br>".join(sorted({f"`{s.file}:{s.function}`" for s in r.sites})) or "none"
            out.append(f"| `{r.id}` | {r.status} | {where} |")
        out.append("")
    return "\n".join(out)


def _site_line(s: Site) -> str:
    return f"{s.file}:{s.line} {s.function}: {_one_line(s.test, 90)}   [runs on: {_archs(s.path)}]"


def diff_text(old: GateMap, new: GateMap, d: GateDiff) -> str:
    out = [
        f"{old.target.package} {old.target.version} -> {new.target.version}: {len(d.added)} added, "
        f"{len(d.removed)} removed, {len(d.moved)} moved, {len(d.changed)} changed, {d.unchanged} unchanged"
    ]
    for title, sites in (("Added", d.added), ("Removed", d.removed)):
        if sites:
            out += ["", f"{title} ({len(sites)}):"]
            out += [f"  {_site_line(s)}" + (f"  [{s.verdict}]" if title == "Added" else "") for s in sites]
    for title, pairs in (("Moved", d.moved), ("Changed (same place and test, other code behind it)", d.changed)):
        if pairs:
            out += ["", f"{title} ({len(pairs)}):"]
            for p in pairs:
                out.append(f"  {p.old.file}:{p.old.line} {p.old.function}")
                out.append(f"    -> {p.new.file}:{p.new.line} {p.new.function}: {_one_line(p.new.test, 80)}")
    if d.recipes:
        out += ["", "Recipes:"]
        for r in d.recipes:
            out.append(f"  {r['id']}: {r['old_status']} -> {r['new_status']}; sites {r['sites']}")
            if r["sites"] == "moved":
                out.append(f"      was {', '.join(r['old'])}")
                out.append(f"      now {', '.join(r['new'])}")
    return "\n".join(out)


def diff_markdown(old: GateMap, new: GateMap, d: GateDiff) -> str:
    out = [
        f"## Gates: {old.target.package} {old.target.version} -> {new.target.version}",
        "",
        f"{len(d.added)} added, {len(d.removed)} removed, {len(d.moved)} moved, {len(d.changed)} changed, "
        f"{d.unchanged} unchanged.",
        "",
    ]
    for title, sites in (("Added", d.added), ("Removed", d.removed)):
        if sites:
            out += [
                f"### {title}",
                "",
                "| file:line | function | test | runs on | verdict |",
                "| --- | --- | --- | --- | --- |",
            ]
            out += [
                f"| `{s.file}:{s.line}` | `{s.function}` | `{_md_escape(s.test)}` | {_archs(s.path)} | {s.verdict} |"
                for s in sites
            ]
            out.append("")
    for title, pairs in (("Moved", d.moved), ("Changed", d.changed)):
        if pairs:
            out += [f"### {title}", "", "| from | to | test |", "| --- | --- | --- |"]
            out += [
                f"| `{p.old.file}:{p.old.line}` `{p.old.function}` | `{p.new.file}:{p.new.line}` `{p.new.function}` "
                f"| `{_md_escape(p.new.test)}` |"
                for p in pairs
            ]
            out.append("")
    if d.recipes:
        out += ["### Recipes", "", "| recipe | old | new | sites |", "| --- | --- | --- | --- |"]
        out += [f"| `{r['id']}` | {r['old_status']} | {r['new_status']} | {r['sites']} |" for r in d.recipes]
        out.append("")
    return "\n".join(out)


def diff_dict(old: GateMap, new: GateMap, d: GateDiff) -> dict[str, Any]:
    from sm120patch.gates import SCHEMA

    return {
        "schema": SCHEMA,
        "old": old.tree(),
        "new": new.tree(),
        "added": [s.to_dict() for s in d.added],
        "removed": [s.to_dict() for s in d.removed],
        "moved": [{"old": p.old.to_dict(), "new": p.new.to_dict()} for p in d.moved],
        "changed": [{"old": p.old.to_dict(), "new": p.new.to_dict()} for p in d.changed],
        "unchanged": d.unchanged,
        "recipes": d.recipes,
    }
