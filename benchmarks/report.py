"""The tables, the verdicts and docs/performance.md, from a run's results (no measuring here)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.floors import TARGETS, med, ratio, targets

REPO = Path(__file__).resolve().parent.parent


def fmt_s(x: dict[str, Any]) -> str:
    cpu = f", cpu {x['cpu']:.3f}" if "cpu" in x else ""
    return f"{x['median']:.3f} ({x['min']:.3f}-{x['max']:.3f}{cpu})"


ROWS = [
    ("floor A", "floor A: libcst parse+codegen of the touched files", None),
    ("floor B", "floor B: `git apply` of the plan's diff", "floor A"),
    ("plan", "`plan --probe none`", "floor A"),
    ("plan --probe static", "`plan` (default probe: static)", "floor A"),
    ("apply", "`apply --probe none`", "floor A"),
    ("status", "`status` (applied tree)", "floor A"),
    ("rollback", "`rollback`", "floor A"),
    ("apply+rollback", "`apply` + `rollback`", "floor A"),
    ("preflight cold", "`preflight` cold (empty caches)", "floor A"),
    ("preflight warm", "`preflight` warm", "floor A"),
]


def table(res: dict[str, Any], base: dict[str, Any] | None) -> str:
    vs = list(res["trees"])
    head = ["measure"]
    for v in vs:
        head += [f"{v}: wall s, median (min-max, cpu)", f"{v}: x floor A"]
        if base and v in base.get("trees", {}):
            head += [f"{v}: before: s, x floor A"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, label, floor in ROWS:
        cells = [label]
        for v in vs:
            cells.append(fmt_s(res["trees"][v]["m"][key]))
            cells.append("1" if floor is None else f"{ratio(res, v, key, floor):.2f}")
            if base and v in base.get("trees", {}):
                b = base["trees"][v]["m"].get(key)
                cells.append(
                    f"{b['median']:.3f}, {1 if floor is None else ratio(base, v, key, floor):.2f}" if b else "-"
                )
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    head = ["process start", "wall s, median (min-max, cpu)", "x `import click`"] + (
        ["before: s, x `import click`"] if base else []
    )
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    labels = {"python": "`python -c pass`", "--help": "`sm120patch --help`", "recipes": "`sm120patch recipes`"}
    for k in ("python", "import click", "import libcst", "--help", "recipes"):
        x = res["start"][k]
        cells = [labels.get(k, f"`python -c '{k}'`"), fmt_s(x), f"{ratio(res, None, k, 'import click'):.2f}"]
        if base:
            b = base.get("start", {}).get(k)
            cells.append(f"{b['median']:.3f}, {ratio(base, None, k, 'import click'):.2f}" if b else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sizes(res: dict[str, Any]) -> str:
    lines = [
        "| tree | .py files in package | .py bytes | files touched | bytes touched | files changed | diff lines "
        "| statuses (--probe none) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v, t in res["trees"].items():
        st = ", ".join(f"{k.removeprefix('sglang-')}: {s}" for k, s in t["statuses"].items())
        lines.append(
            f"| SGLang {v} | {t['py_files']:,} | {t['py_bytes']:,} | {len(t['touched'])} | {t['touched_bytes']:,} "
            f"| {len(t['changed'])} | {t['diff_lines']} | {st} |"
        )
    lines.append("")
    for v, t in res["trees"].items():
        lines.append(f"- {v} touched: " + ", ".join(f"`{f}` ({n:,} B)" for f, n in t["touched"].items()))
    return "\n".join(lines)


def verdicts(res: dict[str, Any], base: dict[str, Any] | None) -> str:
    lines = [
        "| target | tree | measured (median of rounds; range) | limit | met | before |",
        "|---|---|---|---|---|---|",
    ]
    before = {(r["target"], r["tree"]): r for r in targets(base)} if base else {}
    for r in targets(res):
        b = before.get((r["target"], r["tree"]))
        unit = r["unit"]
        lines.append(
            f"| {TARGETS[r['target']]} | {r['tree']} | {r['value']:.2f}{unit}"
            + (f" ({r['detail']})" if r.get("detail") else "")
            + (f" ({r['rounds']})" if r.get("rounds") else "")
            + f" | {r['limit']}{unit} | {'yes' if r['met'] else '**no**'} | "
            + (f"{b['value']:.2f}{unit} ({'met' if b['met'] else 'missed'})" if b else "-")
            + " |"
        )
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    import libcst

    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or "-",
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "libcst": getattr(libcst, "__version__", None) or _dist_version("libcst"),
        "git": subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.strip(),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip(),
        "date": dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "load": [round(x, 2) for x in os.getloadavg()],
    }


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def report(res: dict[str, Any], base: dict[str, Any] | None) -> str:
    mc = res["machine"]
    out = [
        f"Machine: {mc['platform']}, {mc['cpus']} CPUs, {mc['implementation']} {mc['python']}, "
        f"libcst {mc['libcst']}, {mc['git']}; commit {mc['commit']}; {mc['date']}; {res['reps']} reps; "
        f"load average {mc.get('load', '?')} at the start, {res.get('load_end', '?')} at the end. "
        "The machine is shared: compare the ratios (each taken between runs made back to back), "
        "not the seconds, across runs.",
        "",
        sizes(res),
        "",
        table(res, base),
        "",
        verdicts(res, base),
    ]
    return "\n".join(out)


# The prose of docs/performance.md. Numbers in it come from the run; the reasons are what
# profiling (pyinstrument, cProfile) showed, and are worded so they stay true when the
# table moves by a few percent.
DOC_HEAD = """Generated by `make bench` (`python benchmarks/bench.py --write-doc`, which also saves the run as
`benchmarks/last-run.json`); do not edit by hand. The line above names the command and the commit
that wrote this page; the commit measured is in "Machine" below. The "before" columns come from
`benchmarks/baseline.json`, the same script run on the commit before this work.
`python benchmarks/bench.py --from-json benchmarks/last-run.json --write-doc` renders the page
again without measuring.

What a run of sm120patch costs on real SGLang trees, against what the work could cost at
the least. Every number is the wall time of a whole process, as a user starts it:

- **floor A**: a bare `python -c` that imports libcst and parses and regenerates
  (`parse_module(...).code`) exactly the files the recipes touch, i.e. the files in which
  an edit found its site, changed or already satisfied. sm120patch has to parse these
  files, and has to print or write them, so no libcst-based `plan` can be cheaper.
- **floor B**: `git apply` of the diff `plan` prints, on a scratch copy. The cost of
  applying a patch once it is known: what a hand-kept patch series costs.
- **`python -c "import click"`**: the floor for the start of any click command.

Every measurement runs once unrecorded (page cache, probe cache) and then the number of
repetitions given below; cells show the median and the min-max spread in seconds. `plan`,
`apply` and `rollback` run with `--arch sm_120 --probe none` (no GPU detection, no probe
noise); `plan --probe static` is `plan`'s default probe level against FlashInfer 0.6.1.
`preflight` runs with `--arch sm_120 --no-torch --flashinfer <FlashInfer 0.6.1>`: cold
with an empty cache folder (`XDG_CACHE_HOME`), warm after one run filled it.
"""


def doc(res: dict[str, Any], base: dict[str, Any] | None, analysis: str, stamp: str = "") -> str:
    """The page; `stamp` (tools/docstamp.py) is its first line under the title."""
    head = ["# Performance", "", *([stamp, ""] if stamp else [])]
    return "\n".join([*head, DOC_HEAD, "## Results", "", report(res, base), "", analysis.strip(), ""])


def analysis_text(res: dict[str, Any], base: dict[str, Any] | None) -> str:
    rows = {(r["target"], r["tree"]): r for r in targets(res)}
    missed = [r for r in rows.values() if not r["met"]]
    warm_missed = any(not r["met"] for (name, _), r in rows.items() if name == "preflight-warm")
    vs = list(res["trees"])
    small, big = vs[0], vs[-1]
    t = res["trees"]
    fa = {v: med(res, v, "floor A") for v in vs}
    imp = res["start"]["import libcst"]["median"] - res["start"]["python"]["median"]
    lines = ["## Analysis", ""]
    if base:
        was = {(r["target"], r["tree"]): r for r in targets(base)}
        pairs = [
            f"{TARGETS[k[0]].split(' <=')[0]} on {k[1]}: "
            f"{was[k]['value']:.2f}{r['unit']} -> {r['value']:.2f}{r['unit']}"
            for k, r in rows.items()
            if k in was and k[0] != "scaling"
        ]
        lines += [
            f"**Before and after.** The 'before' columns are the same script run on commit "
            f"{base['machine'].get('commit', '?')} ({base['machine'].get('date', '?')}, {base.get('reps', '?')} "
            f"reps). " + "; ".join(pairs) + ".",
            "",
        ]
    scaling = rows.get(("scaling", f"{big}/{small}"))
    per = t[small].get("recipes_per_file", {})
    most = max(per, key=lambda f: (per[f], t[small]["touched"].get(f, 0)), default=None)
    shared = (
        f"; `{most.rsplit('/', 1)[-1]}`, {t[small]['touched'].get(most, 0) // 1000} KB, is changed by {per[most]} "
        "recipes, each on top of the last"
        if most and per[most] > 1
        else ""
    )
    lines += [
        f"**Where the time goes.** On {small} the recipes touch {len(t[small]['touched'])} files "
        f"({t[small]['touched_bytes']:,} bytes{shared}). Floor A "
        f"is {fa[small]:.2f} s, about {imp:.2f} s of it importing libcst and the rest parsing and regenerating "
        "those files. `plan` does that work once and adds: `compile()` of every rewritten file (the check that "
        "a rewrite still compiles), the transforms' own look at the functions they edit, a byte search of the "
        "package when a required edit is not in its hinted files (one pass per plan for every edit's "
        "needles; optional edits stay in their hints), the unified diff, recipe loading and the CLI's start. "
        "`apply` is `plan` plus the journal "
        "and the writes; `rollback` and `status` parse nothing.",
        "",
        "**What was slow, and what changed.** Profiling (pyinstrument, cProfile) of `plan` on 0.5.9 put about "
        "three quarters of the time in libcst walks over whole modules, not in parsing. A libcst visitor "
        "rebuilds every node it passes, and every transform found its functions with a visitor over the whole "
        "module and rewrote with a transformer (or `deep_replace`) over the whole module, so the 5,000-line "
        "`server_args.py` was walked node by node five or six times; `Workspace.module()` also regenerated a "
        "module's code only to check its cache was current. Now (a) functions are found by walking "
        "statements only, since a def is always a statement (`find_functions`); (b) a rewrite rebuilds only "
        "the nodes on the way from the module to the swapped ones, found by reading dataclass fields, and "
        "shares every other subtree (`replace_nodes`; if a node is not reached it falls back to the full "
        "walk); (c) the workspace keeps the module of each text version, so each file is parsed once for "
        "all recipes; (d) when a second recipe changes a file the first one already rewrote, only the "
        "statements that differ are regenerated and spliced into the text (`splice_code`; the tests run with "
        "a run of the test suite with `SM120PATCH_CHECK_SPLICE=1` asserts it equals `module.code`, on every "
        "release); (e) the "
        "package scan lists files with `os.scandir` and searches all edits' needles in one pass; (f) "
        "`plan`, `gatekeeper` and `targets` no longer import libcst, the transforms, packaging, difflib, "
        "subprocess or the engine when the CLI starts; (g) the transforms load libcst on first use "
        "(importlib's LazyLoader), and the insert-rule `code` check asks Python's own parser first, so "
        "loading the recipe catalogue no longer imports libcst: `recipes` and `rollback` do not pay for "
        "it; (h) `add_condition` and `narrow_arch_test` find the `if` statements of the functions they edit "
        "by walking statements (`find_ifs`, pinned to a visitor's nodes and order by a test), not with a "
        "visitor that rebuilt every node of the function; (i) `sm120patch.probes` imports its rungs "
        "(artifact, build, evidence, run, spec, static) where a probe climbs, so `plan --probe none` no "
        "longer loads them; (j) the transforms' searches inside a function (the taken line's anchors, `or` "
        "chains, lists, rules) walk with `transforms.walk.Walker`, a visitor that reads children off the "
        "dataclass fields in libcst's own visit order (tests hold it against libcst's visitor and against "
        "libcst's `_visit_and_replace_children` for every node kind) and skips layout and tokens, instead "
        "of a libcst visitor that rebuilt every node it passed; wrap-expression tells candidates apart by "
        "their head name before generating their code; libcst's ABC `isinstance` checks are answered once "
        "per node type; (k) a recipe's rewritten files are compiled once per file at the recipe's end (a "
        "failure replays the recipe checking after every edit, so the edit is still named), not after "
        "every edit and every taken-line step (16 `compile()` calls of up to 250 KB on 0.5.9, now 6); (l) "
        "`replace_nodes` without located functions (add-collection-item's module-level swaps, 0.5.23) "
        "rebuilds only the way down to the keys.",
        "",
        "**What the benchmark measured until 2026-12-03.** `benchmarks/probe_costs.py` imports a test helper, "
        "and importing `tests/conftest.py` set `SM120PATCH_CHECK_SPLICE=1` (the test suite's check that each "
        "splice equals a full regeneration) for the whole `make bench`, so every timed `plan` and `apply` "
        "also regenerated each spliced module in full: 2.3-2.5x floor A on 0.5.9 where the same command a "
        "user runs measured 1.4-1.7x. The check is now set by pytest itself (`pytest_configure`), and "
        "`measure.env_with` drops every self-check switch from the timed processes "
        "(tests/unit/test_bench_env.py). Runs made before that date, the 'before' columns possibly among them, "
        "include the check.",
        "",
        f"**Size.** {big} has {t[big]['py_files']:,} .py files ({t[big]['py_bytes']:,} bytes) against "
        f"{t[small]['py_files']:,} ({t[small]['py_bytes']:,} bytes) in {small}, but its recipes touch "
        f"{t[big]['touched_bytes']:,} bytes against {t[small]['touched_bytes']:,} (server_args.py was split "
        "into arg_groups/). `plan` follows the touched bytes, not the file count"
        + (f": {scaling['detail']}" if scaling else "")
        + ". Only the process start, the libcst import and recipe loading do not shrink with the bytes.",
        "",
        "**preflight.** Cold, `preflight` is `plan` plus the probe ladder up to `spec`. Warm, probe verdicts "
        "come from the verdict cache and the plan statuses from a plan-result cache used by `preflight` only "
        "(`plan` and `apply` always recompute; `plan_cache.plan_statuses`). Its key holds this tool's code stamps, "
        "the recipes (id, sha256), the archs, the target and its version, and the journal's applied set; the "
        "entry holds the (mode, size, mtime_ns, inode) of every file the plan read or looked for, present or "
        "not, with the sha256 of the files it read, and, when an edit searched the package, a hash of the "
        "package's .py listing with their stamps. Any change recomputes, except a file rewritten with the "
        "same bytes (an apply rolled back: same size and sha256). "
        + "A warm run parses no SGLang file: the FlashInfer-backport note (`_note_backport` in "
        "`engine/preflight.py`, which asks what `apply SGLANG FLASHINFER` would do when an SGLang recipe is "
        "blocked) plans SGLang through the same cache (it did not until 2026-12-02: then 14.7 of 15.3 s of "
        "a warm run on 0.5.9 + FlashInfer 0.6.3, by cProfile, were that plan). It still plans the FlashInfer "
        "backport itself, with its bytes, because the SGLang recipes are probed on an overlay of them: that "
        "imports libcst, parses FlashInfer's `jit/comm.py` and checks three diffs with `git apply --check`. "
        + (
            "What is left is that, the process start, recipe loading, the FlashInfer lookup and the cache checks."
            if not warm_missed
            else "That, the libcst import and the process start on this loaded machine are what is above the "
            "1 s target; a cache of the FlashInfer plan with its bytes would remove the libcst import too."
        ),
        "",
        "**Floor B** is what applying a fixed patch costs: milliseconds. sm120patch pays the parse because it "
        "finds each gate by structure (releases move and reshape it) and proves each rewrite compiles.",
        "",
        "**Targets.**",
        "",
    ]
    close = [r for r in rows.values() if r["met"] and r["value"] > 0.9 * r["limit"]]
    if not missed:
        lines.append("All targets are met on this run.")
    for r in close:
        lines.append(
            f"- Met, but close to the limit: {TARGETS[r['target']]} on {r['tree']}: {r['value']:.2f}{r['unit']}"
            + (f", single rounds {r['rounds']}{r['unit']}" if r.get("rounds") else "")
            + ". "
            + MISSED_WHY.get(r["target"], "")
        )
    for r in missed:
        lines.append(
            f"- Missed: {TARGETS[r['target']]} on {r['tree']}: {r['value']:.2f}{r['unit']}. "
            + MISSED_WHY.get(r["target"], "")
        )
    lines += ["", "**Left to do.**", "", *FOLLOW_UPS]
    return "\n".join(lines)


MISSED_WHY = {
    "start": (
        "`sm120patch --help` imports only `sm120patch.cli` (the lazy command table in `cli/__init__.py`) and "
        "`sm120patch.errors`: a command's module is imported when it runs. What is left above `import click` "
        "is click building the group's help and the interpreter loading the package; the spread is the "
        "machine's load."
    ),
    "plan": (
        "What is left above the floor is `compile()` of each rewritten file (server_args.py once per recipe "
        "that changes it), the transforms' walks inside the functions they edit (11 recipes now, 4 when the "
        "targets were set), the taken line's own rewrite and splice, the package scan when a "
        "required edit is not in its hinted files, the diff and the CLI start; see 'Left to do'. On this shared "
        "machine "
        "single rounds spread widely, so the median is the number to read."
    ),
    "apply+rollback": (
        "`rollback` is a second process: it pays the interpreter and CLI start again although it parses "
        "nothing unless it has to replay a kept recipe; on the small tree that fixed cost is a large part "
        "of the floor. See the spread: the ratio moves by 0.1-0.2 with the machine's load."
    ),
    "preflight-warm": "See the preflight paragraph.",
    "scaling": (
        "The fixed cost of a process (start, recipe loading, the libcst import) does not shrink with the "
        "touched bytes, so the smaller job is relatively dearer."
    ),
}

FOLLOW_UPS = [
    "- `compile()` of every rewritten file is the largest cost left above floor A (server_args.py is "
    "compiled once per recipe that changes it, ~0.025-0.09 s each). A parse plus `symtable` is about "
    "half as dear but misses the compiler's own errors (`return` outside a function), so it was left.",
    "- diffs.unified: difflib on the whole 5,000-line file for a 10-line change; trimming the common head "
    "and tail (and offsetting the hunk numbers) would make the diff ~free.",
]
