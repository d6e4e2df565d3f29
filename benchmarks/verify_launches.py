#!/usr/bin/env python3
"""How many server launches `sm120patch verify` really makes, counted on the test server (issue 31.2).

`verify_overhead.py --launches-only` counts launches with verify/groups.py's model. This script runs
the real `sm120patch verify` (default mode: together first, culprits by halving, the kept set
confirmed) against the tests' fake OpenAI server (tests/unit/fake_openai_server.py) on a fake tree
and counts the launches the server itself logged (its state file, one line per start), for N arms
of which 0, 1 or 2 break the rule, against what the model predicts for the same placement and
against one at a time (1 + 2*N*R). The arms: N - k recipes that change a file the server never
reads (nothing changes), and k bad ones: one that collapses every answer (fake-corrupt) and, for
two, one whose server crashes at start (fake-crash). The placement of the bad arms is whatever
order verify lists its arms in ("all"'s recipes in the JSON), read back, not assumed.

A set that holds a crashing arm needs no baseline after it (there is nothing to bracket): it costs
one launch, where an arm that serves costs two. Until this script counted them, the model counted
two for it as well; it now takes the crashing arms (`groups.launches(..., crashing=...)`), and the
table shows the server's count beside the model's, so a difference between them shows.

    python benchmarks/verify_launches.py [--arms 3 5 8] [--json F]

A script, not a test: it takes a few minutes (every launch starts a Python process).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sm120patch.verify import groups  # noqa: E402
from tests.unit.sglang_fakes import GIT_ENV  # noqa: E402
from tests.unit.verify_fakes import (  # noqa: E402
    free_port,
    knob_rel,
    make_recipes,
    make_tree,
    release_port,
    server_command,
    write_recipe,
)

# recipes that change nothing; verify keeps the command line's order, so placements() puts the bad ones
GOOD = [f"pad-{i}" for i in range(1, 17)]
BAD = ["fake-corrupt", "fake-crash"]
# verify's rule is what is being counted, not the box's noise: no-op arms keep, the bad ones break
RULES = ("--noise-floor", "0.5", "--min-effect", "0.6")


def add_pad(recipes: Path, pkg: Path, rid: str) -> None:
    """A recipe that changes a knob file the fake server never reads (and the file, at its start)."""
    rel = knob_rel(rid.replace("-", "_"))
    (pkg / rel).write_text("VALUE = 0\n")
    write_recipe(recipes, rid, rel, "pad", '"bench: a file nobody reads"', "@@ -1 +1 @@\n-VALUE = 0\n+VALUE = 1\n")


def placements(n: int, k: int) -> list[set[int]]:
    """Where the k bad arms go among n (verify keeps the command line's order): none; first, last;
    first and last, the last two."""
    if k == 0:
        return [set()]
    if k == 1:
        return [{0}, {n - 1}]
    return [{0, n - 1}, {n - 2, n - 1}] if n > 2 else [{0, 1}]


def one(n: int, ids: list[str], bad: list[str], tmp: Path) -> dict[str, Any]:
    """One verify run: its launch count as the server logged it, and the model's for the same order."""
    goods = [i for i in ids if i not in bad]
    site = tmp / "site"
    pkg = make_tree(site)
    recipes = make_recipes(tmp / "recipes")
    for rid in goods:
        add_pad(recipes, pkg, rid)
    state, port = tmp / "state", free_port()
    args = [sys.executable, "-m", "sm120patch", "verify", str(site), "--recipes", str(recipes), "--probe", "none"]
    args += ["--arch", "sm_120", *[x for r in ids for x in ("--recipe", r)]]
    args += ["--concurrency", "4", "--output-len", "20", "--requests", "8", "--warmup", "0", "--grace", "2"]
    args += ["--ready-timeout", "20", "--url", f"http://127.0.0.1:{port}", "--out", str(tmp / "report"), *RULES]
    args += ["--json", "--", *server_command(pkg, port, state)]
    env = {**os.environ, **GIT_ENV, "SM120PATCH_RECIPES": str(recipes), "PYTHONPATH": str(REPO)}
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
    finally:
        release_port(port)
    if r.returncode not in (0, 1) or not r.stdout.strip():
        raise SystemExit(f"verify exited {r.returncode}: {r.stderr[-2000:]}")
    data = json.loads(r.stdout)
    logged = (state / "launches").read_text().splitlines() if (state / "launches").exists() else []
    order = data["arms"].get("all", ids)
    positions = {order.index(b) for b in bad}
    crashes = {order.index(b) for b in bad if b == "fake-crash"}
    kept = sorted(data["final"])
    return {
        "arms": n,
        "bad": bad,
        "order": order,
        "launches_logged": len(logged),
        "launches_reported": len(data["launches"]),
        "model": groups.launches(n, positions, crashing=crashes),
        "one_at_a_time": groups.one_at_a_time_launches(n),
        "final": kept,
        "final_right": kept == sorted(goods),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", type=int, nargs="+", default=[3, 5, 8])
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    rows = []
    for n in a.arms:
        for k in (0, 1, 2):
            for where in placements(n, k):
                goods = iter(GOOD[: n - k])
                bad = iter(BAD[:k])
                ids = [next(bad) if i in where else next(goods) for i in range(n)]
                with tempfile.TemporaryDirectory(prefix="sm120patch-bench-launches-") as tmp:
                    rows.append(one(n, ids, [i for i in ids if i in BAD], Path(tmp)))
    print("verify's launches on the test server (together first, culprits by halving, kept set confirmed), one repeat")
    print("| arms | bad | verify's order | launches (server log) | model (groups.launches) | one at a time | kept |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    off = [x for x in rows if {x["launches_logged"], x["launches_reported"]} != {x["model"]} or not x["final_right"]]
    for x in rows:
        print(
            f"| {x['arms']} | {', '.join(x['bad']) or 'none'} | {' '.join(x['order'])} | {x['launches_logged']} "
            f"| {x['model']} | {x['one_at_a_time']} | {'yes' if x['final_right'] else 'NO'} |"
        )
    print(f"{len(rows) - len(off)}/{len(rows)} runs launched what the model predicts and kept exactly the good arms")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    if off:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
