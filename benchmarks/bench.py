#!/usr/bin/env python3
"""Measure sm120patch on real SGLang trees against its floors (issue 6). A script, not a test.

Every number is the wall time of a whole process, as a user runs it, so the floors are
whole processes too:

  floor A  a bare `python -c` that imports libcst and parses + codegens exactly the files
           the recipes touch (the files where an edit found its site, changed or satisfied);
  floor B  `git apply` of the diff `plan` printed, on a scratch copy of the tree;
  click    `python -c "import click"`: the floor of any click CLI's start.

Each measurement runs once unrecorded (page cache, probe cache) and then --reps times;
the table shows the median and the min-max spread. Trees come from tools/releases.py
(real wheels from PyPI, cached); nothing here touches the cache's pristine copies.

    python benchmarks/bench.py                         # print the table
    python benchmarks/bench.py --write-doc             # also regenerate docs/performance.md
    python benchmarks/bench.py --json out.json         # raw results, for a later --baseline
    python benchmarks/bench.py --baseline before.json  # before/after columns in the table
    python benchmarks/bench.py --only-probes           # the spec and build rungs alone (probe_costs.py)
    python benchmarks/bench.py --cold-build            # also the build rung cold against FlashInfer's own
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import probe_costs  # noqa: E402
from benchmarks.measure import bench  # noqa: E402
from benchmarks.report import analysis_text, doc, machine, report  # noqa: E402
from tools import docstamp  # noqa: E402
from tools.releases import copy_tree  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--versions", nargs="+", default=["0.5.9", "0.5.23"])
    ap.add_argument("--flashinfer", default="0.6.1")
    ap.add_argument("--json", type=Path, help="write the raw results here")
    ap.add_argument(
        "--baseline",
        type=Path,
        default=REPO / "benchmarks" / "baseline.json",
        help="raw results of an earlier run, shown as 'before' (default: benchmarks/baseline.json, if present)",
    )
    ap.add_argument("--write-doc", action="store_true", help="regenerate docs/performance.md")
    ap.add_argument("--from-json", type=Path, help="render the tables (and doc) of a saved --json run, no measuring")
    ap.add_argument("--no-probes", action="store_true", help="leave out the spec and build rungs")
    ap.add_argument("--only-probes", action="store_true", help="measure the spec and build rungs only")
    ap.add_argument("--cold-build", action="store_true", help="the build rung cold too (many minutes on 2 cores)")
    a = ap.parse_args()
    if a.only_probes:
        with tempfile.TemporaryDirectory(prefix="sm120patch-bench-") as tmp:
            probes = probe_costs.measure(Path(tmp), a.reps, a.cold_build)
        print(probe_costs.report(probes))
        if a.json:
            a.json.write_text(json.dumps({"machine": machine(), "probes": probes}, indent=1))
        return
    base = json.loads(a.baseline.read_text()) if a.baseline and a.baseline.is_file() else None
    if a.from_json:
        res = json.loads(a.from_json.read_text())
        print(report(res, base))
        if a.write_doc:
            if a.from_json.resolve() != LAST_RUN:  # the page says its run is last-run.json: keep that true
                LAST_RUN.write_text(json.dumps(res, indent=1))
            write_doc(res, base)
        return
    with tempfile.TemporaryDirectory(prefix="sm120patch-bench-") as tmp:
        work = Path(tmp)
        fi = copy_tree("flashinfer", a.flashinfer, work / f"flashinfer-{a.flashinfer}")
        res: dict[str, Any] = {"machine": machine(), "reps": a.reps, "flashinfer": a.flashinfer}
        res.update(bench(a.versions, work, fi, a.reps))
        if not a.no_probes:
            res["probes"] = probe_costs.measure(work, a.reps, a.cold_build)
        res["load_end"] = [round(x, 2) for x in os.getloadavg()]
    print(report(res, base))
    if "probes" in res:
        print(probe_costs.report(res["probes"]))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    if a.write_doc:
        LAST_RUN.write_text(json.dumps(res, indent=1))
        write_doc(res, base)


# the run docs/performance.md shows, and what the page is rendered from (tests/unit/test_docs_blocks.py)
LAST_RUN = REPO / "benchmarks" / "last-run.json"
DOC_INPUTS = (
    "benchmarks/last-run.json",
    "benchmarks/baseline.json",
    "benchmarks/report.py",
    "benchmarks/floors.py",
    "benchmarks/probe_costs.py",
)


def render_doc(res: dict[str, Any], base: dict[str, Any] | None, stamp: str) -> str:
    """docs/performance.md for a run: the same text from the same JSON, whoever renders it."""
    text = doc(res, base, analysis_text(res, base), stamp)
    if "probes" in res:
        text += f"\n## Probe rungs\n\n```text\n{probe_costs.report(res['probes'])}\n```\n"
    return text


def write_doc(res: dict[str, Any], base: dict[str, Any] | None) -> None:
    path = REPO / "docs" / "performance.md"
    path.write_text(render_doc(res, base, docstamp.stamp(docstamp.command_line(), DOC_INPUTS)))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
