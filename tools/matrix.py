"""Print docs/compatibility.md: every recipe's status on every supported SGLang release, and the
FlashInfer recipes' on every FlashInfer an SGLang release pins.

Runs the real planner (no probes) on each release downloaded from PyPI, so the table
is what the tool does, not what someone typed:  python tools/matrix.py > docs/compatibility.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sm120patch.arch import parse_arch  # noqa: E402
from sm120patch.catalogue.recipes import load_recipes  # noqa: E402
from sm120patch.engine import pipeline as transaction  # noqa: E402
from sm120patch.engine import which_flashinfer  # noqa: E402
from sm120patch.engine.tree import block_failing  # noqa: E402
from sm120patch.planning.plan import plan  # noqa: E402
from sm120patch.planning.targets import discover  # noqa: E402
from sm120patch.probes import recipe_probe as gatekeeper  # noqa: E402
from sm120patch.probes.environment import flashinfer as flashinfer_env  # noqa: E402
from tools import docstamp  # noqa: E402
from tools.releases import FLASHINFER_PINS, FLASHINFER_RELEASES, SGLANG_RELEASES, pristine  # noqa: E402

# what an edit's outcome means, in words: SGLang recipes open gates, FlashInfer recipes fix kernels
SHORT = {
    "sglang": {"changed": "opens", "satisfied": "open already", "missing": "absent"},
    "flashinfer": {"changed": "patches", "satisfied": "fixed already", "missing": "does not fit"},
}


def short(package: str, rel: str) -> str:
    """A file as the tables show it: under sglang/, or a FlashInfer file's name (its headers sit deep)."""
    return rel.removeprefix("sglang/") if package == "sglang" else rel.rsplit("/", 1)[-1]


def statuses(package: str, versions: list[str]) -> tuple[list[str], list[tuple[str, dict[str, str]]], list[tuple]]:
    """(recipe ids, per release its statuses, per recipe and release the edits in words) for sm_120."""
    recipes = load_recipes(package=package)
    arch = parse_arch("sm_120")
    rows, details = [], []
    for version in versions:
        (target,) = discover(pristine(package, version), package)
        plans = plan(target, recipes, arch)
        rows.append((version, {p.recipe.id: p.status for p in plans}))
        for p in plans:
            edits = "; ".join(
                f"{e.name}: {SHORT[package].get(e.outcome, e.outcome)}"
                + (f" ({', '.join(short(package, f) for f in e.files)})" if e.files else "")
                for e in p.edits
            )
            details.append((p.recipe.id, version, p.status, edits or p.reason))
    return [r.id for r in recipes], rows, details


def pinned_flashinfer(tree: Path) -> str | None:
    """The flashinfer-python version an SGLang wheel pins (its METADATA), or None."""
    for meta in tree.glob("sglang-*.dist-info/METADATA"):
        m = re.search(r"^Requires-Dist: flashinfer[-_]python(?:\[[^\]]*\])?==(\S+)", meta.read_text(), re.M)
        if m:
            return m.group(1)
    return None


def with_pinned_flashinfer(version: str) -> tuple[str | None, dict[str, str], dict[str, str]]:
    """Statuses on SGLang `version` with the static probe reading the FlashInfer it pins: alone, and
    with the FlashInfer recipes in the same plan (FlashInfer patched first, as `plan SG FI` does)."""
    tree = pristine("sglang", version)
    fi_version = pinned_flashinfer(tree)
    if fi_version is None:
        return None, {}, {}
    arch = parse_arch("sm_120")
    recipes = load_recipes()
    (target,) = discover(tree, "sglang")
    fi_tree = pristine("flashinfer", fi_version)
    plans = plan(target, [r for r in recipes if r.package == "sglang"], arch)
    block_failing(plans, gatekeeper.make_probe([arch], flashinfer_env.from_tree(fi_tree), "static"))
    alone = {p.recipe.id: p.status for p in plans}
    targets = [target, *discover(fi_tree, "flashinfer")]
    fi = which_flashinfer.resolve_flashinfer(targets, None, None)
    run = transaction.RunSettings([arch], fi, "static", gatekeeper.make_probe)
    pair = {p.recipe.id: p.status for p in transaction.plan_many(targets, recipes, run)}
    return fi_version, alone, pair


def _cell(alone: str, pair: str) -> str:
    return alone if alone == pair else f"{alone} / {pair}"


def pinned_section(ids: list[str], versions: list[str]) -> list[str]:
    fi_ids = [r.id for r in load_recipes(package="flashinfer")]
    out = [
        "",
        "## With the FlashInfer each release pins",
        "",
        "The same plan, with the static probe reading the flashinfer-python wheel the SGLang release pins",
        "(`Requires-Dist` in its METADATA): `blocked` means that FlashInfer lacks the kernels (or a source",
        "fix) the recipe needs. Each SGLang cell shows the status alone, then (after `/`) with the",
        "FlashInfer recipes in the same plan (`sm120patch plan SGLANG FLASHINFER`): FlashInfer patched",
        "first, and the SGLang probes judging it patched.",
        "",
        "| SGLang | FlashInfer | " + " | ".join(ids + fi_ids) + " |",
        "| --- | --- | " + " | ".join("---" for _ in ids + fi_ids) + " |",
    ]
    for version in versions:
        fi_version, alone, pair = with_pinned_flashinfer(version)
        cells = [
            alone.get(i, "-") if alone.get(i) == pair.get(i) else f"{alone.get(i, '-')} / {pair.get(i, '-')}"
            for i in ids
        ]
        cells += [pair.get(i, "-") for i in fi_ids]
        out.append(f"| {version} | {fi_version or '?'} | " + " | ".join(cells) + " |")
    recipes = load_recipes()
    out += ["", "## Releases each recipe was tested on", "", "| recipe | versions | tested |", "| --- | --- | --- |"]
    out += [f"| {r.id} | `{r.versions}` | {r.tested[0]} .. {r.tested[-1]} |" for r in recipes if r.tested]
    return out


def pinned_by(version: str) -> str:
    """The SGLang releases that pin this FlashInfer, as a range: `0.5.13-0.5.15`."""
    sglang = [s for s, fi in FLASHINFER_PINS.items() if fi == version]
    return "-" if not sglang else sglang[0] if len(sglang) == 1 else f"{sglang[0]}-{sglang[-1]}"


def flashinfer_section() -> list[str]:
    ids, rows, details = statuses("flashinfer", FLASHINFER_RELEASES)
    out = [
        "",
        "# FlashInfer releases",
        "",
        "SGLang pins FlashInfer exactly, so an SGLang release can only get SM12x allreduce kernels from",
        "the FlashInfer it pins. Every FlashInfer an SGLang release pins, plus 0.6.16 (the last before",
        "upstream's fix) and the newest, asserted in `tests/integration/test_flashinfer_releases.py`",
        "(which also covers the 23 releases between the pins: the same diffs fit them all).",
        "",
        "| FlashInfer | pinned by SGLang | " + " | ".join(ids) + " |",
        "| --- | --- | " + " | ".join("---" for _ in ids) + " |",
    ]
    for version, st in rows:
        out.append(f"| {version} | {pinned_by(version)} | " + " | ".join(st.get(i, "-") for i in ids) + " |")
    for rid in ids:
        out += ["", f"## {rid}", "", "| FlashInfer | status | edits (file names) |", "| --- | --- | --- |"]
        out += [f"| {v} | {s} | {e} |" for r, v, s, e in details if r == rid]
    return out


# What the tables describe: the recipes and this script. A change to either makes the doc stale
# (tests/unit/test_docs_blocks.py); `make docs` regenerates it.
INPUTS = ("patches/sglang", "patches/flashinfer", "tools/matrix.py")


def main() -> None:
    ids, rows, details = statuses("sglang", SGLANG_RELEASES)
    out = [
        "# Compatibility: recipes by SGLang and FlashInfer release",
        "",
        docstamp.stamp(docstamp.command_line() + " > docs/compatibility.md", INPUTS),
        "",
        f"Generated by `make docs` (`python tools/matrix.py`) at commit {docstamp.commit()} from the releases",
        "on PyPI, planning for sm_120 without probes (probes depend on the FlashInfer you run, see",
        "`sm120patch preflight`). The same statuses are asserted release by release in",
        "`tests/integration/test_sglang_releases.py`.",
        "",
        "Statuses: `applicable` the gate exists and shuts SM12x out; `satisfied` the release already",
        "admits SM12x there; `not-applicable` the gate does not exist in that form; `untested` (not in",
        "these tables: every release here is tested) a release newer than the recipe's newest tested one.",
        "",
        "| SGLang | " + " | ".join(ids) + " |",
        "| --- | " + " | ".join("---" for _ in ids) + " |",
    ]
    for version, st in rows:
        out.append(f"| {version} | " + " | ".join(st.get(i, "-") for i in ids) + " |")
    out += pinned_section(ids, [v for v, _ in rows])
    for rid in ids:
        out += ["", f"## {rid}", "", "| SGLang | status | edits (files under sglang/) |", "| --- | --- | --- |"]
        out += [f"| {v} | {s} | {e} |" for r, v, s, e in details if r == rid]
    out += flashinfer_section()
    print("\n".join(out))


if __name__ == "__main__":
    main()
