#!/usr/bin/env python3
"""How fast `sm120patch gates` reads a whole SGLang release, as a ratio against a bare `ast.parse`.

Both in this process, on the same files of SGLang 0.5.23 (about 4,000 .py files outside tests):

  parse  read every file and `ast.parse` it (the floor a structural scan could hope to pay
         without a prefilter)
  scan   the gates scan: read every file, a byte prefilter, parse and walk only the files that
         mention a predicate, evaluate every site (sm120patch.gates.scan.scan_target)
  map    the scan plus the recipe plan and the verdicts (what `sm120patch gates PATH` does,
         without printing)

The table shows the median wall time of --reps runs and scan/parse, map/parse. A script, not a test.

    python benchmarks/gates_bench.py                 # SGLang 0.5.23 from the cache (or PyPI)
    python benchmarks/gates_bench.py --version 0.5.9 --reps 3
"""

from __future__ import annotations

import argparse
import ast
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def bare_parse(files: list[Path]) -> int:
    n = 0
    for path in files:
        try:
            ast.parse(path.read_bytes(), str(path))
            n += 1
        except (SyntaxError, ValueError):
            continue
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", default="0.5.23")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    from sm120patch.catalogue.kernels import load_kernels
    from sm120patch.catalogue.recipes import load_recipes
    from sm120patch.gates import gate_map
    from sm120patch.gates.scan import py_files, scan_target
    from sm120patch.planning.targets import discover
    from tools import releases

    target = discover(releases.pristine("sglang", args.version), "sglang")[0]
    files = py_files(target.package_dir)
    recipes, kernels = load_recipes(), load_kernels()

    def timed(fn) -> float:  # noqa: ANN001
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    parse_s = timed(lambda: bare_parse(files))
    scan = scan_target(target)
    scan_s = timed(lambda: scan_target(target))
    map_s = timed(lambda: gate_map(target, recipes, kernels, None))
    print(f"SGLang {args.version}: {len(files)} files, {scan.parsed} parsed by the scan, {len(scan.sites)} sites")
    print(f"{'':8}{'median s':>10}{'x parse':>10}")
    print(f"{'parse':8}{parse_s:>10.2f}{1.0:>10.2f}")
    print(f"{'scan':8}{scan_s:>10.2f}{scan_s / parse_s:>10.2f}")
    print(f"{'map':8}{map_s:>10.2f}{map_s / parse_s:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
