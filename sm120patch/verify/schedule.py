"""Which launch comes when, and how much the figures move between launches of the same tree.

Interleaving: the baseline first, then each candidate followed by the baseline again, the whole
round `repeats` times: A B A (one candidate, one repeat), A B1 A B2 A (two, one at a time),
A B A B A (one, two repeats). Every candidate run sits between two baseline runs, so a drift
(thermals, clocks, a neighbour on the box) moves both arms and shows up as the baseline's spread,
not as a verdict on the candidate.

Noise is measured, not assumed. The runs of both arms give a pooled standard deviation (each
arm's runs about their own mean); the noise of a comparison is twice the standard error of the
difference of the two means, relative to the baseline's mean (about a 95 % one-sided bound when
the scatter is normal), and never less than the floor (NOISE_FLOOR, `verify --noise-floor`).
A candidate is slower only when its mean falls below the baseline's by more than that. With one
run per arm there is no scatter to measure: the floor alone decides. Each arm's spread (half its
range over its median) is reported too, for a person to read.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

BASELINE = "baseline"
NOISE_FLOOR = 0.02  # two runs of the same tree never differ by less than this on a real server


@dataclass(frozen=True)
class Step:
    arm: str  # BASELINE or a candidate's name
    round: int  # 0-based repeat this launch belongs to (the first baseline: round 0)


def interleave(candidates: Sequence[str], repeats: int) -> list[Step]:
    """A, then (B_i, A) for every candidate, `repeats` times."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    steps = [Step(BASELINE, 0)]
    for r in range(repeats):
        for c in candidates:
            steps += [Step(c, r), Step(BASELINE, r)]
    return steps


def spread(values: Sequence[float]) -> float:
    """Half-range over median: 0.05 means the runs lie within about +-5 % of their median."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    return (max(values) - min(values)) / 2 / mid if mid else 0.0


def noise(base: Sequence[float], cand: Sequence[float], floor: float = NOISE_FLOOR) -> float:
    """2 x the standard error of mean(cand) - mean(base), over mean(base); at least `floor`."""
    dof = len(base) + len(cand) - 2
    mean_b = statistics.fmean(base)
    if dof < 1 or not mean_b:
        return floor
    ss = sum((x - statistics.fmean(arm)) ** 2 for arm in (base, cand) for x in arm)
    se = (ss / dof) ** 0.5 * (1 / len(base) + 1 / len(cand)) ** 0.5
    return max(floor, 2 * se / mean_b)


def compare(
    base: Sequence[float], cand: Sequence[float], higher_is_better: bool = True, floor: float = NOISE_FLOOR
) -> dict[str, Any]:
    """Candidate against baseline for one figure: relative change of the means, the noise,
    and whether the candidate is worse by more than the noise."""
    if not base or not cand:
        return {"delta": None, "noise": None, "worse": None, "base": list(base), "cand": list(cand)}
    mb, mc = statistics.fmean(base), statistics.fmean(cand)
    delta = (mc / mb - 1.0) if mb else 0.0
    n = noise(base, cand, floor)
    worse = delta < -n if higher_is_better else delta > n
    return {
        "delta": delta,
        "noise": n,
        "worse": worse,
        "spread_base": spread(base),
        "spread_cand": spread(cand),
        "base": list(base),
        "cand": list(cand),
    }
