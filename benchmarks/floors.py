"""The targets a run is judged against: each a ratio to a floor measured in the same run."""

from __future__ import annotations

from typing import Any

# target name -> (description, limit); checked in `targets()`
TARGETS = {
    "plan": "`plan` (all recipes, --probe none) <= 1.5x floor A",
    "apply+rollback": "`apply` + `rollback` <= 2x floor A",
    "start": "CLI start (`--help`) <= 1.5x `python -c 'import click'`",
    "preflight-warm": "warm `preflight` <= 1 s",
    "scaling": "plan time ratio (big/small tree) <= 1.3x their touched-bytes ratio",
}


# --- verdicts and output ------------------------------------------------------------------------


def med(res: dict[str, Any], version: str | None, name: str) -> float:
    if version is None:
        return res["start"][name]["median"]
    return res["trees"][version]["m"][name]["median"]


def ratio(res: dict[str, Any], version: str | None, name: str, floor: str) -> float:
    """The paired ratio of the run (median over rounds); older result files: median over median."""
    x = res["start"][name] if version is None else res["trees"][version]["m"][name]
    return x.get("ratio") or x["median"] / med(res, version, floor)


def round_ratios(res: dict[str, Any], version: str | None, name: str, floor: str) -> list[float]:
    """measure/floor within each round (both run back to back), for the spread of a ratio."""
    box = res["start"] if version is None else res["trees"][version]["m"]
    return [a[0] / b[0] for a, b in zip(box[name]["runs"], box[floor]["runs"], strict=True)]


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target on each tree: the measured value, its limit, and whether it is met."""
    rows: list[dict[str, Any]] = []
    vs = list(res["trees"])
    for v in vs:
        rows.append({"target": "plan", "tree": v, "value": ratio(res, v, "plan", "floor A"), "limit": 1.5, "unit": "x"})
        rows.append(
            {
                "target": "apply+rollback",
                "tree": v,
                "value": ratio(res, v, "apply+rollback", "floor A"),
                "limit": 2.0,
                "unit": "x",
            }
        )
        rows.append(
            {"target": "preflight-warm", "tree": v, "value": med(res, v, "preflight warm"), "limit": 1.0, "unit": " s"}
        )
    rows.append(
        {"target": "start", "tree": "-", "value": ratio(res, None, "--help", "import click"), "limit": 1.5, "unit": "x"}
    )
    if len(vs) >= 2:
        small, big = vs[0], vs[-1]
        t_ratio = med(res, big, "plan") / med(res, small, "plan")
        b_ratio = res["trees"][big]["touched_bytes"] / res["trees"][small]["touched_bytes"]
        rows.append(
            {
                "target": "scaling",
                "tree": f"{big}/{small}",
                "value": t_ratio / b_ratio,
                "limit": 1.3,
                "unit": "x",
                "detail": f"plan takes {t_ratio:.2f}x as long for {b_ratio:.2f}x the touched bytes",
            }
        )
    spread = {"plan": ("plan", "floor A"), "apply+rollback": ("apply+rollback", "floor A")}
    for r in rows:
        r["met"] = r["value"] <= r["limit"]
        name_floor = spread.get(r["target"]) or (("--help", "import click") if r["target"] == "start" else None)
        if name_floor:
            xs = round_ratios(res, None if r["tree"] == "-" else r["tree"], *name_floor)
            r["rounds"] = f"{min(xs):.2f}-{max(xs):.2f}"
    return rows
