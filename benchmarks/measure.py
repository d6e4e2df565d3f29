"""Measure sm120patch as a user runs it: whole processes on real SGLang trees, against floors.

Each measurement is the wall (and CPU) time of one process; `bench` runs every step once
unrecorded (page cache, probe cache) and then `reps` rounds, so a table shows medians and
spreads. Trees come from tools/releases.py; nothing here touches the cache's pristine copies.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tools.releases import copy_tree

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
_script = Path(PY).parent / "sm120patch"
CLI = [str(_script)] if _script.exists() else [PY, "-m", "sm120patch"]
ARCH = ["--arch", "sm_120"]
FLOOR_A = (
    "import sys, libcst\nfor f in sys.argv[1:]:\n    libcst.parse_module(open(f, 'rb').read().decode('utf-8')).code\n"
)

# --- running and timing ------------------------------------------------------------------------


def run(cmd: Sequence[str], ok: Sequence[int] = (0,), env: dict[str, str] | None = None, **kw: Any) -> Sample:
    """(wall, cpu) seconds of one process; a wrong exit code is a broken benchmark, not a number."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(list(cmd), capture_output=True, env=env, **kw)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode not in ok:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: exit {r.returncode}\n{r.stderr.decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


Sample = tuple[float, float]


def add(a: Sample, b: Sample) -> Sample:
    return a[0] + b[0], a[1] + b[1]


def summary(xs: Sequence[Sample]) -> dict[str, Any]:
    walls = [w for w, _ in xs]
    return {
        "median": statistics.median(walls),
        "min": min(walls),
        "max": max(walls),
        "cpu": statistics.median(c for _, c in xs),
        "runs": [list(x) for x in xs],
    }


# switches that make sm120patch check itself (the test suite sets them): never in a timed run
SELF_CHECKS = (
    "SM120PATCH_CHECK_SPLICE",
    "SM120PATCH_DEBUG",
    "SM120PATCH_FAULT",
    "SM120PATCH_FAULT_TRACE",
    "SM120PATCH_FAULT_SLOW",
)


def env_with(cache: Path) -> dict[str, str]:
    """A private probe/plan cache (XDG_CACHE_HOME), no colour and none of sm120patch's
    self-checks, so runs are comparable and measure what a user runs."""
    clean = {k: v for k, v in os.environ.items() if k not in SELF_CHECKS}
    return {**clean, "XDG_CACHE_HOME": str(cache), "NO_COLOR": "1"}


# --- what is measured ----------------------------------------------------------------------------


def plan_json(tree: Path, env: dict[str, str]) -> dict[str, Any]:
    r = subprocess.run(
        [*CLI, "plan", str(tree), *ARCH, "--probe", "none", "--json"], capture_output=True, text=True, env=env
    )
    if r.returncode not in (0, 1):
        raise RuntimeError(f"plan --json on {tree}: exit {r.returncode}: {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def tree_steps(version: str, work: Path, fi: Path) -> tuple[dict[str, Any], Callable[[], dict[str, Sample]]]:
    """A tree's facts, and one round of every measurement on it (floors next to what they bound)."""
    tree = copy_tree("sglang", version, work / f"sglang-{version}")
    scratch = copy_tree("sglang", version, work / f"sglang-{version}-scratch")
    env = env_with(work / f"cache-{version}")
    info = plan_json(tree, env)
    root = Path(info["targets"][0]["root"])
    pkg = Path(info["targets"][0]["package_dir"])
    touched = sorted(
        {f for r in info["recipes"] for e in r["edits"] if e["outcome"] in ("changed", "satisfied") for f in e["files"]}
    )
    changed = sorted({f for r in info["recipes"] for f in r["files"]})
    diff = "".join(r["diff"] for r in info["recipes"])
    py_files = [p for p in pkg.rglob("*.py") if p.is_file()]
    facts: dict[str, Any] = {
        "version": version,
        "statuses": {r["id"]: r["status"] for r in info["recipes"]},
        "py_files": len(py_files),
        "py_bytes": sum(p.stat().st_size for p in py_files),
        "touched": {f: (root / f).stat().st_size for f in touched},
        "touched_bytes": sum((root / f).stat().st_size for f in touched),
        "changed": changed,
        "recipes_per_file": {f: sum(f in r["files"] for r in info["recipes"]) for f in changed},
        "diff_lines": diff.count("\n"),
    }
    pre = [*CLI, "preflight", str(tree), *ARCH, "--no-torch", "--flashinfer", str(fi)]
    warm_env = env_with(work / f"warm-{version}")
    rounds = [0]

    def git_apply() -> Sample:
        t = run(["git", "apply", "-"], cwd=scratch, input=diff.encode())
        run(["git", "apply", "-R", "-"], cwd=scratch, input=diff.encode())
        return t

    def one_round() -> dict[str, Sample]:
        rounds[0] += 1
        m: dict[str, Sample] = {}
        m["floor A"] = run([PY, "-c", FLOOR_A, *(str(root / f) for f in touched)])
        m["plan"] = run([*CLI, "plan", str(tree), *ARCH, "--probe", "none"], env=env)
        m["floor B"] = git_apply()
        m["plan --probe static"] = run([*CLI, "plan", str(tree), *ARCH, "--flashinfer", str(fi)], ok=(0, 1), env=env)
        m["apply"] = run([*CLI, "apply", str(tree), *ARCH, "--probe", "none", "--no-diff"], env=env)
        m["status"] = run([*CLI, "status", str(tree)], env=env)
        m["rollback"] = run([*CLI, "rollback", str(tree)], env=env)
        m["apply+rollback"] = add(m["apply"], m["rollback"])
        for f in changed:  # rollback must have restored the release byte for byte
            if (root / f).read_bytes() != (scratch / f).read_bytes():
                raise RuntimeError(f"{f}: not restored by rollback")
        m["preflight cold"] = run(pre, ok=(0, 1), env=env_with(work / f"cold-{version}-{rounds[0]}"))
        m["preflight warm"] = run(pre, ok=(0, 1), env=warm_env)
        return m

    return facts, one_round


def start_round(work: Path) -> dict[str, Sample]:
    env = env_with(work / "cache-start")
    return {
        "python": run([PY, "-c", "pass"]),
        "import click": run([PY, "-c", "import click"]),
        "--help": run([*CLI, "--help"], env=env),
        "import libcst": run([PY, "-c", "import libcst"]),
        "recipes": run([*CLI, "recipes"], env=env),
    }


# Ratios are taken within a round (a measure and its floor run back to back) and then the
# median over rounds: a load that comes and goes on the machine moves both alike.
PAIRS = {
    "plan": "floor A",
    "plan --probe static": "floor A",
    "apply": "floor A",
    "status": "floor A",
    "rollback": "floor A",
    "apply+rollback": "floor A",
    "preflight cold": "floor A",
    "preflight warm": "floor A",
    "floor B": "floor A",
}


def collect(rounds: list[dict[str, Sample]], pairs: dict[str, str]) -> dict[str, Any]:
    out = {k: summary([r[k] for r in rounds]) for k in rounds[0]}
    for k, floor in pairs.items():
        if k in out:
            out[k]["ratio"] = statistics.median(r[k][0] / r[floor][0] for r in rounds)
    return out


def bench(versions: Sequence[str], work: Path, fi: Path, reps: int) -> dict[str, Any]:
    steps = {}
    for v in versions:
        print(f"bench: preparing SGLang {v}", file=sys.stderr, flush=True)
        steps[v] = tree_steps(v, work, fi)
    start_rounds: list[dict[str, Sample]] = []
    tree_rounds: dict[str, list[dict[str, Sample]]] = {v: [] for v in versions}
    for i in range(reps + 1):  # round 0 warms the page cache and the warm caches, unrecorded
        print(f"bench: round {i}/{reps}", file=sys.stderr, flush=True)
        s = start_round(work)
        t = {v: steps[v][1]() for v in versions}
        if i:
            start_rounds.append(s)
            for v in versions:
                tree_rounds[v].append(t[v])
    res: dict[str, Any] = {"start": collect(start_rounds, {"--help": "import click", "recipes": "import click"})}
    res["start"]["import libcst"]["ratio"] = statistics.median(
        r["import libcst"][0] / r["import click"][0] for r in start_rounds
    )
    res["trees"] = {v: {**steps[v][0], "m": collect(tree_rounds[v], PAIRS)} for v in versions}
    return res
